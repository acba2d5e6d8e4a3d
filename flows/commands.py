"""What each `tfscale` subcommand does once its config is loaded."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from tasks.config import Config


def prepare(config: Config, args: argparse.Namespace) -> int:
    from tasks.preparation import format_summary, prepare_dataset

    result = prepare_dataset(config, force=args.force, progress=not args.no_progress)
    print(format_summary(result))
    return 0


def verify(config: Config, args: argparse.Namespace) -> int:
    from tasks.manifest import verify_shards
    from tasks.preparation import dataset_dir

    manifest = verify_shards(dataset_dir(config), config.prepare.dataset)
    print(
        f"ok: {len(manifest.shards)} shards of {manifest.dataset} in {dataset_dir(config)} "
        f"match their sizes and sha256"
    )
    return 0


def hardware(config: Config, args: argparse.Namespace) -> int:
    import json

    from tasks.hardware import detect_hardware, format_report
    from tasks.strategy import select_strategy

    report = detect_hardware()
    choice = select_strategy(report, config.train)
    if args.json:
        print(
            json.dumps(
                {
                    "hardware": report.to_dict(),
                    "choice": choice.to_dict(),
                    "fingerprint": report.fingerprint,
                },
                indent=2,
            )
        )
    else:
        print(format_report(report))
        print(f"strategy  {choice.kind}, {choice.shape}, {choice.precision}")
        print(f"because   {choice.reason}")
    return 0


def train(config: Config, args: argparse.Namespace) -> int:
    from tasks.cluster import CHIEF, EVALUATOR, SERVER, role_of
    from tasks.hardware import detect_hardware
    from tasks.manifest import verify_shards
    from tasks.preparation import dataset_dir
    from tasks.process import set_up_devices
    from tasks.run import Run
    from tasks.strategy import baseline_choice, select_strategy

    if args.against_baseline:  # the baseline it joins, named before any work
        from pathlib import Path

        from tasks.runs import load_exported

        load_exported(Path(args.against_baseline))
    data_dir = dataset_dir(config)
    manifest = verify_shards(data_dir, config.prepare.dataset)
    report = detect_hardware()
    proposed = select_strategy(report, config.train)
    role = role_of(report.cluster, (baseline_choice(proposed) if args.baseline else proposed).spec)
    if report.cluster is not None:
        import os

        from tasks.cluster import describe_as_tf_config
        from tasks.hardware import slurm_task_cpus
        from tasks.process import set_up_worker

        describe_as_tf_config(report.cluster, os.environ)
        threads = slurm_task_cpus(dict(os.environ)) if report.cluster.source == "Slurm" else None
        if threads:  # its share, not every core of a node shared with the job's other tasks
            set_up_worker(None, threads)
            cpus = f"{threads} CPU" + ("s" if threads > 1 else "")
            print(f"threads: {threads} per TensorFlow pool (Slurm gave this task {cpus})")
    if role == SERVER:
        from tasks.cluster import serve

        serve(report.cluster, config.cluster.chief_wait_s)
        return 0
    set_up_devices(proposed.logical_cpus)
    run = Run(config, manifest, str(data_dir), proposed, report)
    if role == CHIEF and report.cluster is None:
        run = _settle(run, args)
    compared = run  # what a baseline is the baseline of
    if args.baseline:
        run = run.with_choice(baseline_choice(run.choice))
    choice = run.choice
    if role == EVALUATOR:
        from tasks.runs import evaluate_as_sidecar

        print(f"evaluator: evaluating each new checkpoint of {manifest.dataset}", flush=True)
        evaluate_as_sidecar(run)
        return 0
    print(
        f"training {config.train.model} on {manifest.dataset}: {choice.kind}, "
        f"{choice.shape}, {choice.precision} ({choice.reason})",
        flush=True,
    )
    _train_tracked(run, args, tracked=role == CHIEF, compared=compared)
    return 0


def _settle(run: Any, args: argparse.Namespace) -> Any:
    """What `auto` left open, measured (`tasks.autotune`). A baseline, or a run compared
    with one (`--against-baseline`, as the DVC stages are), keeps the proposed replicas and
    settles precision and XLA for them, so that both sides share them and one measurement."""
    from tasks.autotune import format_line
    from tasks.runs import settle_auto

    compared = args.baseline or args.against_baseline is not None
    run, settled = settle_auto(run, for_pipeline=compared)
    if settled.timed:
        print(f"auto: {format_line(settled)}", flush=True)
    return run


def _train_tracked(run: Any, args: argparse.Namespace, tracked: bool, compared: Any) -> None:
    """Trains and diagnoses `run`, logged as an MLflow run of its own when `tracked` (a
    cluster's chief, or a run of one process), then exports and reports it. A baseline
    opens the pipeline run its comparison nests under (`compared`: what it is the baseline
    of); a run `--against-baseline DIR` joins the pipeline of the baseline in DIR."""
    from pathlib import Path

    from tasks.config import config_to_dict
    from tasks.diagnosis import format_diagnosis
    from tasks.files import write_json_atomic
    from tasks.runs import TRACKED_AS, train_and_diagnose
    from tasks.tracking import EpochLog, pipeline_params

    choice, manifest = run.choice, run.manifest
    kind = "baseline" if args.baseline else "train"
    tracker, tags = (
        _command_tracker(run.config, strategy=choice.kind, precision=choice.precision)
        if tracked
        else (None, {})
    )
    context = {"config": config_to_dict(run.config), "manifest": json.loads(manifest.to_json())}
    pipeline = _pipeline_run(tracker, args, compared, tags, pipeline_params(context))
    name = (
        ("baseline" if args.baseline else "distributed")
        if pipeline
        else f"{kind}-{manifest.dataset}-{choice.kind}"
    )
    with tracker.run(name, tags, stage_of=pipeline) if tracker else _no_run() as run_id:
        live = EpochLog(tracker, run_id) if tracker else None
        probe_steps = 0 if args.no_diagnose else min(30, run.train.measure_steps)
        result, diagnosis = train_and_diagnose(run, probe_steps, live, kind, True)
        if tracker:
            tracker.log_training(run_id, result, pipeline_params(context))
            link = {"run_id": run_id, "url": tracker.run_url(tracker.ui_base, run_id)}
            if pipeline:
                link["pipeline_run_id"] = pipeline
            write_json_atomic(Path(result.run_dir) / TRACKED_AS, link)  # for `evaluate`
            if diagnosis is not None:
                tracker.log_result(run_id, diagnosis, prefix="diagnosis_")
                tracker.log(run_id, tags={"bottleneck": diagnosis.bottleneck})
    if diagnosis is not None:
        print(format_diagnosis(diagnosis))
    if args.export_dir:
        from tasks.runs import export_run

        export_run(result, Path(args.export_dir))
    print(
        f"{result.examples_per_s:,.0f} examples/s (after the first epoch), global batch "
        f"{result.global_batch}; outputs in {result.run_dir}"
    )


def _pipeline_run(
    tracker: Any, args: argparse.Namespace, compared: Any, tags: dict, params: dict
) -> str | None:
    """The MLflow run a compared pipeline's stages nest under: opened by its baseline, found
    by the run compared with it beside the baseline's model (`--against-baseline DIR`)."""
    from pathlib import Path

    from tasks.runs import pipeline_of, trained_by
    from tasks.tracking import pipeline_run_name

    if tracker is None or not (args.baseline or args.against_baseline):
        return None
    choice, name = compared.choice, pipeline_run_name(compared)
    shown = {"strategy": choice.kind, "precision": choice.precision}
    table = {**shown, "replicas": choice.replicas, **params}  # the runs table's columns
    if args.baseline:
        return tracker.open_pipeline(name, {**tags, **shown}, table)
    baseline = Path(args.against_baseline)
    link = {
        k.replace("training_", "baseline_"): v
        for k, v in trained_by(baseline).items()
        if k in ("training_run_id", "training_run_url")
    }
    return tracker.join_pipeline(pipeline_of(baseline), name, {**tags, **link}, table)


def _command_tracker(config: Config, **tags: str) -> tuple[Any, dict]:
    """The tracker a training or evaluating command logs to, checked before any work, and
    its run's tags (the DVC stage among them)."""
    from tasks.tracking import Tracker, run_tags

    tracker = Tracker.for_config(config.track)
    tracker.check()
    return tracker, run_tags(**tags)


@contextlib.contextmanager
def _no_run() -> Iterator[str]:
    yield ""


def evaluate(config: Config, args: argparse.Namespace) -> int:
    from pathlib import Path

    from tasks.errors import MissingInput
    from tasks.evaluation import evaluate_model, write_evaluation
    from tasks.manifest import verify_shards
    from tasks.preparation import dataset_dir
    from tasks.runs import latest_run, load_exported, pipeline_of, trained_by

    if args.baseline:  # the baseline it compares with, named before any work
        load_exported(Path(args.baseline))
    data_dir = dataset_dir(config)
    manifest = verify_shards(data_dir, config.prepare.dataset)
    model_path = (
        args.model_path or latest_run(config.train.runs_dir, manifest.dataset)["model_path"]
    )
    if not Path(model_path).exists():
        raise MissingInput(f"No model at {model_path}", "train one with 'tfscale train'.")
    trained = trained_by(Path(model_path).parent)
    tracker, tags = _command_tracker(config, **{**trained, "dataset": manifest.dataset})
    pipeline = pipeline_of(Path(model_path).parent)  # the training's pipeline, if a stage
    name = "evaluate" if pipeline else f"evaluate-{manifest.dataset}"
    with tracker.run(name, tags, stage_of=pipeline) as run_id:
        if "training_run_url" in trained:
            tracker.describe(
                run_id,
                f"Evaluates the model of training run [{trained['training_run_id']}]"
                f"({trained['training_run_url']}) on the held-out split of {manifest.dataset}.",
            )
        result = evaluate_model(model_path, manifest, str(data_dir), config.evaluate.batch_size)
        model_dir = Path(model_path).parent
        path = write_evaluation(result, model_dir, manifest.feature["class_names"])
        tracker.log_result(run_id, result)
        tracker.log_artifacts(run_id, [path])
        print(
            f"test accuracy {result.test_accuracy:.4f}  loss {result.test_loss:.4f}  "
            f"({result.examples} examples); written to {path}"
        )
        if args.baseline:
            from tasks.summary import compare_exported

            summary = compare_exported(
                Path(args.baseline),
                model_dir,
                result,
                config.train.scaling,
                config.evaluate.target_accuracy,
            )
            for on in (run_id, pipeline) if pipeline else (run_id,):  # the table's row too
                tracker.log_result(on, summary)
                tracker.log(on, tags={"bottleneck": summary.bottleneck})
            if pipeline:
                tracker.log_result(pipeline, result)
                tracker.describe(
                    pipeline,
                    f"{manifest.dataset}: {summary.speedup_text} on {summary.shape} "
                    f"({summary.strategy}, {summary.precision}), efficiency "
                    f"{summary.scaling_efficiency:.2f}, test accuracy {result.test_accuracy:.4f}; "
                    f"bottleneck: {summary.bottleneck}. The stages are its child runs: the "
                    "single-device baseline, the training compared with it, the evaluation.",
                )
            print(
                f"speedup {summary.speedup_text} over the single-device baseline, scaling "
                f"efficiency {summary.scaling_efficiency:.2f}; written to "
                f"{model_dir / 'scaling.json'}"
            )
    return 0


def run(config: Config, args: argparse.Namespace) -> int:
    summary = _run_flow("flows.pipeline", "pipeline", config)
    from tasks.summary import format_summary
    from tasks.tracking import Tracker

    tracker = Tracker.for_config(config.track)
    results = tracker.results_url(tracker.ui_base)
    print()
    print(format_summary(summary, f"tfscale ui, then {results}"))
    return 0


def _run_flow(module: str, name: str, config: Config) -> Any:
    """Runs a flow against a Prefect API that boots (unless PREFECT_API_URL names one)
    while the flow's module imports TensorFlow."""
    import importlib

    from flows.prefect_api import temporary_api
    from tasks.process import import_tensorflow
    from tasks.progress import stage

    stage("start", "loading TensorFlow while a Prefect API starts")
    with temporary_api() as api:
        import_tensorflow()
        flow = getattr(importlib.import_module(module), name)
        api.wait()
        return flow(config)


def ui(config: Config, args: argparse.Namespace) -> int:
    import os
    import sys
    from urllib.parse import urlsplit

    from tasks.errors import UserError
    from tasks.network import port_taken
    from tasks.tracking import Tracker

    tracker = Tracker.for_config(config.track)
    uri = tracker.uri
    configured = urlsplit(config.track.ui_url)  # links point there: serve there unless told
    host = args.host or configured.hostname or "127.0.0.1"
    port = args.port or configured.port or 5000
    base = f"http://{host}:{port}"
    if port_taken(host, port):  # uvicorn would say so in a log line and exit 0
        raise UserError(
            f"{host}:{port} is already in use (another 'tfscale ui' or MLflow server?), so "
            "the MLflow UI cannot start there",
            f"open {base} if it is this store's UI, stop what holds the port, or serve on "
            "another with 'tfscale ui --port N' (track.ui_url sets where links point).",
        )
    print(f"MLflow UI for {uri} at {base} (Ctrl-C stops it)", flush=True)
    print(f"results: {tracker.results_url(base)}", flush=True)
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--registry-store-uri",  # the same store (MLflow says so at start when not given)
        uri,
        "--default-artifact-root",
        tracker.artifact_root,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--app-name",  # MLflow's app, opening pages on model training (tasks/tracking_ui.py)
        "tfscale",
    ]
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}  # no job workers
    # MLflow's own use of a deprecated Starlette module warns at every start; not the user's
    quiet = "ignore:starlette.middleware.wsgi is deprecated"
    env["PYTHONWARNINGS"] = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w)
    os.execve(sys.executable, command, env)  # the server replaces this process: signals reach it
    return 0


def serve(config: Config, args: argparse.Namespace) -> int:
    from flows.deployments import serve_deployments

    serve_deployments(args.params or "params.yaml", args.cron)
    return 0


def forecast(config: Config, args: argparse.Namespace) -> int:
    from tasks.forecast import check_request
    from tasks.forecast_report import forecast_run, format_forecast, probed_run

    check_request(args.workers, args.link_gbit, args.preset)  # usage errors first
    run_dir = probed_run(config.train.runs_dir, config.prepare.dataset, args.run_dir)
    result, written = forecast_run(
        run_dir, args.workers, args.link_gbit, args.preset, args.scaling, args.out_dir
    )
    print(f"forecast from the measurements of {run_dir}")
    print(format_forecast(result))
    print(f"written: {', '.join(str(path) for path in written)}")
    if not args.no_track:
        from tasks.tracking import Tracker

        run_id = Tracker.for_config(config.track).log_forecast(result, written, run_dir)
        print(f"tracked: MLflow run {run_id} ('tfscale ui' shows it)")
    return 0


def sweep(config: Config, args: argparse.Namespace) -> int:
    from tasks.sweep import format_table

    if config.sweep.work_pool:
        from flows.pool import check_server

        check_server()  # before the flow: the pool's workers cannot reach a temporary one
    rows = _run_flow("flows.sweep", "sweep_flow", config)
    print()
    print(format_table(rows))
    print(f"table and charts in {config.sweep.out_dir}/; open the MLflow UI with 'tfscale ui'")
    return 0
