"""The `tfscale` command: parse flags, load the config once, call the step, report.

Flags override `params.yaml`; each subcommand's `--help` lists its own.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from tfscale.flows import commands
from tfscale.tasks.core.errors import UserError, system_error
from tfscale.tasks.core.process import (
    Stopped,
    exit_now,
    import_tensorflow,
    raise_if_stopped,
    set_up_process,
    stop_scope,
    stopped_by_signals,
)
from tfscale.tasks.settings.config import DEFAULT_PARAMS, load_config

# flag -> (dotted config key, type, help)
PREPARE_FLAGS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "--dataset": (
        "prepare.dataset",
        str,
        "digits | synthetic | an image folder | a table (.csv, .parquet) | arrays (.npz) | "
        "your tf.data pipeline (pkg.module:function or file.py:function) | any "
        "tensorflow-datasets name",
    ),
    "--label": (
        "prepare.label",
        str,
        "a table's target column, or the label's key in an .npz or a pipeline's dicts (label)",
    ),
    "--label-kind": (
        "prepare.label_kind",
        str,
        "auto | class | binary | multi_label | regression (auto: two values binary; text "
        "classes; fractional floats real values; integers classes unless many values for "
        "the rows; one-hot rows classes: docs/data.md)",
    ),
    "--sample-weight": (
        "prepare.sample_weight",
        str,
        "a table's column or an .npz's array holding each example's weight in the training "
        "loss, as Keras's fit(sample_weight=) (default: the one named sample_weight, if any; "
        "a pipeline's (x, y, w) carries its own)",
    ),
    "--missing": (
        "prepare.missing",
        str,
        "blank numeric cells: refuse (the default: names the columns) | mean | zero (fill, "
        "the mean over the training split) | drop (the rows)",
    ),
    "--color-mode": (
        "prepare.color_mode",
        str,
        "an image folder's images as Keras's image_dataset_from_directory reads them: rgb "
        "(the default, 3 channels) | grayscale (1) | rgba (4)",
    ),
    "--data-dir": ("prepare.data_dir", str, "root of the prepared datasets (data/tfrecords)"),
    "--num-shards": ("prepare.num_shards", int, "shards per split (default: from the shard size)"),
    "--target-shard-mb": ("prepare.target_shard_mb", float, "aim for shards of this size"),
    "--min-shards": (
        "prepare.min_shards",
        int,
        "never fewer shards per split (default: the largest worker count)",
    ),
    "--seed": ("prepare.seed", int, "seed for splits and synthetic data"),
    "--examples": ("prepare.synthetic.train_examples", int, "synthetic: training examples"),
    "--test-examples": ("prepare.synthetic.test_examples", int, "synthetic: test examples"),
    "--image-size": ("prepare.synthetic.height", int, "synthetic: image height and width"),
    "--channels": ("prepare.synthetic.channels", int, "synthetic: image channels"),
    "--classes": ("prepare.synthetic.classes", int, "synthetic: number of classes"),
    "--signal": (
        "prepare.synthetic.signal",
        float,
        "synthetic: each pixel's share from its class's prototype, the rest noise (0.75; lower "
        "is harder)",
    ),
    "--label-noise": (
        "prepare.synthetic.label_noise",
        float,
        "synthetic: the share of labels replaced by a random class (0)",
    ),
}
DATASET_FLAGS = {
    k: PREPARE_FLAGS[k]
    for k in ("--dataset", "--data-dir", "--label", "--label-kind", "--sample-weight")
}


def _auto_or_bool(text: str) -> str | bool:
    """`auto`, `true` or `false` as the config takes them."""
    value = {"auto": "auto", "true": True, "false": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected auto, true or false; got {text!r}")
    return value


_auto_or_bool.__name__ = "auto|true|false"


def _bool(text: str) -> bool:
    """`true` or `false` as the config takes them."""
    value = _auto_or_bool(text)
    if value == "auto":
        raise argparse.ArgumentTypeError("expected true or false; got 'auto'")
    return bool(value)


_bool.__name__ = "true|false"


def _auto_or_int(text: str) -> str | int:
    """`auto` or a whole number, as the config takes them."""
    if text.lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or an integer; got {text!r}") from None


_auto_or_int.__name__ = "auto|N"

STRATEGY_FLAGS = {
    "--strategy": (
        "train.strategy",
        str,
        "auto | one_device | mirrored | multi_worker | parameter_server | tpu | pipeline | "
        "tensor_parallel",
    ),
    "--replicas": ("train.replicas", int, "replicas (logical CPU devices when there is no GPU)"),
    "--workers": ("train.workers", int, "worker processes (multi_worker, parameter_server)"),
    "--precision": ("train.precision", str, "auto | float32 | mixed_float16 | mixed_bfloat16"),
    "--jit-compile": (
        "train.jit_compile",
        _auto_or_bool,
        "XLA: auto (the faster of off and on, measured once per hardware, model and batch) "
        "| true | false",
    ),
    "--stages": (
        "train.stages",
        int,
        "pipeline: the model cut into this many stages; tensor_parallel: the devices its widest "
        "layer is split over (2)",
    ),
    "--micro-batches": ("train.micro_batches", int, "pipeline: micro-batches per step (4)"),
    "--device-memory-mb": (
        "train.device_memory_mb",
        float,
        "a device's memory for training, in MB (0: not checked); a model that does not fit "
        "is cut into pipeline stages",
    ),
}
TRAIN_FLAGS = {
    **DATASET_FLAGS,
    **STRATEGY_FLAGS,
    "--model": (
        "train.model",
        str,
        "mlp | cnn | resnet | embedding | package.module:function | file.py:function | "
        "model.keras (your own Keras model: docs/your-model.md)",
    ),
    "--epochs": ("train.epochs", int, "training epochs"),
    "--batch-size-per-replica": (
        "train.batch_size_per_replica",
        _auto_or_int,
        "examples per replica per step (strong scaling: the global batch); auto: measured "
        "from 32 up while an epoch keeps 50 updates, a larger batch kept only 5%% faster",
    ),
    "--scaling": ("train.scaling", str, "weak (global batch grows with replicas) | strong (fixed)"),
    "--learning-rate": (
        "train.learning_rate",
        float,
        "base rate, scaled with the global batch after warm-up (--lr-scaling)",
    ),
    "--lr-scaling": (
        "train.lr_scaling",
        str,
        "how the rate grows with the global batch: auto (Adam: the square root of AdaScale's "
        "gain, from the noise scale measured as it trains) | linear | sqrt | adascale | none",
    ),
    "--warmup-epochs": ("train.warmup_epochs", int, "epochs of linear learning-rate warm-up"),
    "--grad-accum-steps": ("train.grad_accum_steps", int, "micro-batches per optimizer update"),
    "--loop": (
        "train.loop",
        str,
        "tfscale (its own distributed loop; every strategy) | fit (Keras's model.fit, as you "
        "train today; one_device and mirrored), timed and evaluated alike",
    ),
    "--steps-per-call": ("train.steps_per_call", int, "training steps per graph call (10)"),
    "--callbacks": (
        "train.callbacks",
        str,
        "a function giving the training's Keras callbacks (pkg.module:function or "
        "file.py:function), called by tfscale's loop as fit calls them; a model's function "
        "may also return them: return model, [callbacks]",
    ),
    "--class-weight": (
        "train.class_weight",
        str,
        "each class's weight in the training loss, as Keras's fit(class_weight=): none | "
        "balanced (n / (classes x count), over the training split) | NAME=W,NAME=W (a class "
        "by name or index; one not named: 1)",
    ),
    "--measure-rounds": (
        "train.measure_rounds",
        int,
        "most timed rounds of the speedup's measurement after training (25)",
    ),
    "--measure-precision": (
        "train.measure_precision",
        float,
        "the rounds end once the speedup's median is known to this, relative, with 95%% "
        "confidence (0.03: +-3%%; 0: always --measure-rounds rounds)",
    ),
    "--measure-steps": (
        "train.measure_steps",
        int,
        "most steps per block of those rounds, each block about a second (100)",
    ),
    "--runs-dir": ("train.runs_dir", str, "where runs are written (runs)"),
    "--link-gbit": (
        "train.link_gbit",
        float,
        "multi_worker: each worker on an emulated host of its own (a network namespace; "
        "needs root), over links of this many Gbit/s (0: full speed)",
    ),
    "--target-accuracy": (
        "evaluate.target_accuracy",
        float,
        "held-out accuracy whose first crossing gives the time, steps and examples to target "
        "(0.96)",
    ),
    "--target-metric": (
        "evaluate.target_metric",
        str,
        "the held-out metric the target is of: auto (accuracy; a real label's "
        "mean_absolute_error) | accuracy | loss | a metric the model reports (auc, ...)",
    ),
    "--target": (
        "evaluate.target",
        float,
        "the value of --target-metric to reach (a loss or an error from above); default: "
        "--target-accuracy for accuracy",
    ),
    "--evaluate-every": (
        "evaluate.every_epochs",
        float,
        "evaluate the held-out split every this many epochs while training, on the clock "
        "(0.5; 0: never)",
    ),
    "--noise-scale": (
        "train.noise_scale",
        _bool,
        "record the gradient noise scale in the step (true; false: plain steps)",
    ),
    "--seeds": (
        "evaluate.seeds",
        int,
        "run: train each side again with the next seeds, to the target only, and give the time "
        "to target as MLPerf scores it: the mean without the fastest and slowest seed (1)",
    ),
    "--stop-at-target": (
        "train.stop_at_target",
        _bool,
        "true: end the training at the first evaluation that reaches the target (false)",
    ),
    "--collective-timeout": (
        "cluster.collective_timeout_s",
        float,
        "seconds a collective waits on a lost worker or cut link before the job fails (60)",
    ),
}
SWEEP_FLAGS = {
    "--data-dir": DATASET_FLAGS["--data-dir"],
    "--runs-dir": TRAIN_FLAGS["--runs-dir"],
    "--epochs": ("sweep.epochs", int, "epochs per cell"),
    "--model": ("sweep.model", str, "as train's --model: a built-in or your own"),
    "--strategy": (
        "sweep.strategy",
        str,
        "mirrored (logical devices) | multi_worker (worker processes)",
    ),
    "--out-dir": ("sweep.out_dir", str, "where the table and charts go (sweep)"),
    "--pool": (
        "sweep.work_pool",
        str,
        "a Prefect work pool: each cell a flow run its workers take, on their hosts (needs "
        "PREFECT_API_URL and one file system shared by the hosts)",
    ),
}
EVALUATE_FLAGS = {
    **DATASET_FLAGS,
    "--runs-dir": TRAIN_FLAGS["--runs-dir"],
    "--batch-size": ("evaluate.batch_size", int, "examples per evaluation batch"),
}


# imported quietly up front; run and sweep import it while Prefect starts, prepare only
# when it writes a shard, evaluate only when the training did not record the evaluation
TENSORFLOW_COMMANDS = {"hardware", "train"}


# the commands that answer SIGTERM and SIGHUP themselves (their Prefect API or server
# stopped first); every other command answers them as Ctrl-C, with its exit code 128+N
OWN_SIGNALS = {"run", "sweep", "ui", "serve"}

# what an interrupted command leaves, and what running it again does (Ctrl-C)
_TRAINING = "a training goes on from its last checkpoint when this is run again"
_FIT_TRAINING = "a --loop fit training goes on from its last finished epoch when this is run again"
INTERRUPTED = {
    "prepare": "finished shards are kept and the next prepare writes only the rest",
    "train": _TRAINING,
    "run": f"{_TRAINING} (finished shards are kept)",
    "sweep": f"{_TRAINING}; finished cells are reused",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    set_up_process(args.verbose or None)
    config = None
    try:
        config = _load(args)
        _check_dvc_deps(config, args.command)
        if args.command in TENSORFLOW_COMMANDS:
            import_tensorflow()
        with stop_scope():
            if args.command in OWN_SIGNALS:
                code = getattr(commands, args.command)(config, args)
            else:
                with stopped_by_signals():  # SIGTERM, SIGHUP: one line, 128+N, temporaries gone
                    code = getattr(commands, args.command)(config, args)
            raise_if_stopped()  # a stop some library swallowed is a stop still
        return code
    except UserError as exc:
        if args.debug:
            raise
        return _report(exc)
    except KeyboardInterrupt as exc:
        stopped = "stopped by signal" if isinstance(exc, Stopped) else "interrupted"
        left = INTERRUPTED.get(args.command, "nothing more was done")
        if getattr(getattr(config, "train", None), "loop", "") == "fit":
            left = left.replace(_TRAINING, _FIT_TRAINING)
        print(f"{stopped}; {left}", file=sys.stderr)
        return exc.exit_code if isinstance(exc, Stopped) else 130
    except Exception as exc:
        if args.debug:
            raise
        known = system_error(exc)
        if known is not None:
            return _report(known)
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("this is a bug in tfscale: run again with --debug for the traceback", file=sys.stderr)
        return 1


def _check_dvc_deps(config: Any, command: str) -> None:
    """Run by a `dvc repro` stage (DVC sets DVC_STAGE), the command's data or model file is
    among the stage's deps: named by `prepare.files` or `train.files` (`check_dvc_dep`)."""
    import os

    if "DVC_STAGE" not in os.environ:
        return
    from tfscale.tasks.core.user_code import check_dvc_dep

    if command == "prepare":
        check_dvc_dep(
            config.prepare.dataset, "prepare.dataset", config.prepare.files, "prepare.files"
        )
    elif command == "train":
        check_dvc_dep(config.train.model, "train.model", config.train.files, "train.files")
    elif command == "sweep":
        check_dvc_dep(config.sweep.model, "sweep.model", config.train.files, "train.files")


def entry() -> NoReturn:
    """The `tfscale` command: `main`, then the exit without teardown (`exit_now`)."""
    exit_now(main())


def _report(exc: Any) -> int:
    """A `UserError` as the user sees it: `error:` and `fix:` lines, its exit code."""
    print(f"error: {exc.message}", file=sys.stderr)
    if exc.fix:
        print(f"fix: {exc.fix}", file=sys.stderr)
    return exc.exit_code


class Parser(argparse.ArgumentParser):
    """argparse with tfscale's error lines (`error:`, `fix:`) and exit code 2, and no flag
    taken for another by its prefix: argparse would read `evaluate --model x.py:f` as
    `--model-path`. Each subcommand's parser is of this class too (`add_subparsers` gives
    its parsers the class of the parser it is called on)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\nfix: see '{self.prog} --help'.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tfscale",
        description="Distributed Keras training that measures whether more devices make it "
        "faster, by how much, and why not.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show every library's log lines (TensorFlow, Prefect, MLflow), not only tfscale's",
    )
    parser.add_argument(
        "--params",
        help="the config file (default: params.yaml, or the defaults when it is missing; "
        "a file named here must exist)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    prepare = _add(
        sub, "prepare", "write a dataset into sharded TFRecords with a manifest", PREPARE_FLAGS
    )
    prepare.add_argument("--force", action="store_true", help="rewrite every shard")
    prepare.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add(sub, "verify", "re-check shard sizes and sha256 against the manifest", DATASET_FLAGS)
    hardware = _add(
        sub, "hardware", "show the detected hardware and the strategy it would pick", STRATEGY_FLAGS
    )
    hardware.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_training_commands(sub)
    _add_flow_commands(sub)
    _add_forecast_command(sub)
    _add_server_commands(sub)
    return parser


def port(text: str) -> int:
    """A port flag's value: a whole number from 1 to 65535."""
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535: {text!r}")
    return value


def finite(text: str) -> float:
    """A float flag's value: a finite number (NaN passes every bound; inf is no setting)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number: {text!r}")
    return value


def _numbers(kind: Callable[[str], Any]) -> Callable[[str], list]:
    what = {int: "whole numbers", finite: "finite numbers"}.get(kind, "values")

    def parse(text: str) -> list:
        wrong = argparse.ArgumentTypeError(f"expected a comma-separated list of {what}: {text!r}")
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except (ValueError, argparse.ArgumentTypeError):
            raise wrong from None
        if not values:
            raise wrong
        return values

    parse.__name__ = f"{kind.__name__}s"
    return parse


def _add_forecast_command(sub: Any) -> None:
    text = (
        "forecast speedup and efficiency for more workers and other links, from a "
        "run's own measurements (a Mirrored or multi-worker run, as tfscale run makes)"
    )
    forecast = sub.add_parser(
        "forecast",
        help=text,
        description=text + ". Fits a cost model (compute per example, all-reduce latency "
        "and bandwidth, sync, input, an epoch's fixed cost) and predicts each worker count "
        "on each link, with the dataset size below which an epoch's fixed cost binds.",
    )
    _add_run_source(forecast, "forecast from")
    _add_forecast_grid(forecast)
    forecast.add_argument(
        "--out-dir", help="where forecast.json and the charts go (default: the run's directory)"
    )
    forecast.add_argument(
        "--no-track", action="store_true", help="do not log the forecast to MLflow"
    )
    _add_plan(sub)


def _add_run_source(parser: Any, verb: str, note: str = "") -> None:
    """The run a command reads its measurements from: `--run-dir`, or the newest probed
    run of `--dataset` under `--runs-dir`."""
    parser.add_argument(
        "--dataset", dest="prepare.dataset", help="the run's dataset [prepare.dataset]"
    )
    parser.add_argument(
        "--runs-dir", dest="train.runs_dir", help="where runs are (runs) [train.runs_dir]"
    )
    parser.add_argument(
        "--run-dir",
        help=f"the run to {verb} (default: the newest run of several replicas with a "
        f"diagnosis{note})",
    )


def _add_plan(sub: Any) -> None:
    text = "the fastest way to a held-out target on up to N devices, from a run's measurements"
    plan = sub.add_parser(
        "plan",
        help=text,
        description=text + ". Prices every device count (powers of 2 up to --devices) and "
        "per-replica batch (16 to 512) as predicted steps to the target (the run's own steps, "
        "its gradient noise scale and its learning-rate rule, calibrated from the study's "
        "baseline) x predicted step time (its cost model on --link), with evaluations and "
        "epochs' fixed costs, never at a rate above the highest measured to reach the "
        "target, and recommends the fastest; writes plan.json beside the run.",
    )
    _add_run_source(plan, "plan from", ", as `tfscale run` leaves")
    plan.add_argument("--devices", type=int, default=8, help="the most devices (8)")
    plan.add_argument(
        "--link",
        default="measured",
        help="the link between devices: a preset (ethernet-10g, nvlink4, ...; see forecast "
        "--help), a rate in Gbit/s, or measured (the run's own; default)",
    )
    plan.add_argument(
        "--target",
        type=finite,
        help="held-out accuracy (default: the run's evaluate.target_accuracy); the run must "
        "have reached it",
    )
    plan.add_argument(
        "--device-memory-mb",
        type=finite,
        default=0.0,
        help="a device's memory: only the per-replica batches whose weights, Adam's slots and "
        "activations fit it (0: not checked)",
    )
    plan.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    plan.add_argument("--no-track", action="store_true", help="do not log the plan to MLflow")


def _add_forecast_grid(forecast: Any) -> None:
    """What `tfscale forecast` predicts: worker counts, links, scaling."""
    forecast.add_argument(
        "--workers",
        type=_numbers(int),
        default=[1, 2, 4, 8, 16, 32, 64],
        metavar="N,N,...",
        help="worker counts (1,2,4,8,16,32,64)",
    )
    forecast.add_argument(
        "--link-gbit",
        type=_numbers(finite),
        default=[],
        metavar="G,G,...",
        help="link rates in Gbit/s to forecast besides the measured one",
    )
    forecast.add_argument(
        "--preset",
        type=_numbers(str),
        default=[],
        metavar="NAME,...",
        help="named links: pcie3-x16, pcie4-x16, pcie5-x16, nvlink3, nvlink4, ethernet-1g, "
        "ethernet-10g, ethernet-25g, ethernet-100g, ethernet-400g (sources in the README)",
    )
    forecast.add_argument(
        "--scaling",
        choices=("weak", "strong"),
        default="weak",
        help="weak: the per-replica batch stays; strong: the global batch stays (weak)",
    )


def _add_training_commands(sub: Any) -> None:
    train = _add(
        sub, "train", "train on prepared shards under a tf.distribute strategy", TRAIN_FLAGS
    )
    train.add_argument(
        "--export-dir",
        help="also copy model.keras, train_metrics.json and "
        "history.csv here (the DVC stage's outputs)",
    )
    train.add_argument(
        "--no-diagnose", action="store_true", help="skip the bottleneck diagnosis after training"
    )
    train.add_argument(
        "--baseline",
        action="store_true",
        help="train the single-device baseline the chosen strategy is measured against "
        "(same model, data, precision and XLA; same per-replica batch for weak scaling)",
    )
    train.add_argument(
        "--against-baseline",
        nargs="?",
        const="",
        metavar="DIR",
        help="this run is compared with a --baseline run (as in dvc.yaml): with --strategy "
        "auto it keeps the replicas rather than measuring them against one device, and "
        "settles precision and XLA as the baseline does; with the baseline's export DIR, "
        "its MLflow run nests under the baseline's study run",
    )
    evaluate = _add(
        sub, "evaluate", "evaluate the latest trained model on the test split", EVALUATE_FLAGS
    )
    evaluate.add_argument("--model-path", help="a .keras model (default: the latest run's)")
    evaluate.add_argument(
        "--baseline",
        metavar="DIR",
        help="a baseline's export dir (tfscale train --baseline --export-dir DIR): also write "
        "scaling.json (speedup, scaling efficiency, test accuracy) beside the model",
    )


def _add_flow_commands(sub: Any) -> None:
    _add(
        sub,
        "run",
        "the whole scaling study (prepare, baseline, distributed, evaluate, track)",
        TRAIN_FLAGS,
    )
    _add(
        sub,
        "sweep",
        "the scaling study: every cell of the 'sweep' grid in params.yaml",
        SWEEP_FLAGS,
    )


def _add_server_commands(sub: Any) -> None:
    ui = sub.add_parser(
        "ui",
        help="serve the MLflow UI on the project's store",
        description="serve the MLflow UI on the project's store; once it answers, print its "
        "address, the results table's and the latest run's. While it serves, the links a run "
        "prints and writes point to it, at whatever port; Ctrl-C stops it",
    )
    ui.add_argument(
        "--host", help="address to listen on (track.ui_url's host: 127.0.0.1 by default)"
    )
    ui.add_argument(
        "--port",
        type=port,
        help="port (track.ui_url's: 5000 by default); links follow it while it serves",
    )
    serve = sub.add_parser(
        "serve",
        help="serve the scheduled deployments (needs a Prefect server)",
        description="register the nightly and on-demand "
        "deployments with the Prefect server at PREFECT_API_URL and run them",
    )
    serve.add_argument("--cron", default="0 2 * * *", help="nightly schedule (0 2 * * *)")


def _add(sub: Any, name: str, help_text: str, flags: dict) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    for flag, (key, kind, text) in flags.items():
        parser.add_argument(
            flag,
            dest=key,
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=f"{text} [{key}]",
        )
    return parser


def _load(args: argparse.Namespace):
    overrides = {k: v for k, v in vars(args).items() if "." in k}
    if overrides.get("prepare.synthetic.height") is not None:
        overrides["prepare.synthetic.width"] = overrides["prepare.synthetic.height"]
    return load_config(args.params or DEFAULT_PARAMS, overrides, named=args.params is not None)


if __name__ == "__main__":
    sys.exit(main())
