"""Typed, frozen configuration: `params.yaml` loaded once, validated, with CLI overrides.

Each top-level section of `params.yaml` is one stage (`prepare`, `train`,
`evaluate`). Nothing else in tfscale opens `params.yaml`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import MISSING, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.settings.kinds import KINDS, sweep_kinds

DEFAULT_PARAMS = Path("params.yaml")
# the per-replica batch a run takes when `train.batch_size_per_replica: auto` is not settled
# by measuring (`tasks.measure.autotune`), and the smallest `auto` measures
DEFAULT_BATCH = 32


class ConfigError(UsageError, ValueError):
    """A config value is unknown, of the wrong type or out of range. Without a fix of its
    own, the fix says where the value comes from and where each key is listed."""

    def __init__(self, message: str, fix: str = ""):
        key = message.split(":", 1)[0] if ":" in message else ""
        named = key if key and " " not in key else "it"
        default = (
            f"correct {named} in params.yaml (or the flag that sets it); every key, its type "
            "and its range: docs/configuration.md"
        )
        super().__init__(message, fix or default)


def _spec(
    default: Any = None,
    *,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple[str, ...] | None = None,
    empty: bool = False,
    url: bool = False,
    model: bool = False,
    weights: bool = False,
    **kw: Any,
):
    """A field with its bounds, choices, (a list) whether it may be empty, and (a string)
    whether it is a web address, names a model (`model=True`) or gives class weights
    (`weights=True`: none, balanced or class=weight pairs)."""
    metadata = {"lo": lo, "hi": hi, "choices": choices, "empty": empty, "url": url}
    metadata["model"], metadata["weights"] = model, weights
    return field(default=default, metadata=metadata, **kw)


@dataclass(frozen=True)
class SyntheticConfig:
    """Shape of the `synthetic` dataset."""

    train_examples: int = _spec(4096, lo=1)
    test_examples: int = _spec(1024, lo=1)
    height: int = _spec(32, lo=1, hi=4096)
    width: int = _spec(32, lo=1, hi=4096)
    channels: int = _spec(3, lo=1, hi=4)
    classes: int = _spec(10, lo=2, hi=100_000)
    # each pixel's share from its class's prototype (the rest is noise): lower is harder
    signal: float = _spec(0.75, lo=0.0, hi=1.0)
    # the share of labels replaced by a uniformly drawn class: the best accuracy reachable is
    # 1 - label_noise x (classes - 1) / classes
    label_noise: float = _spec(0.0, lo=0.0, hi=1.0)


@dataclass(frozen=True)
class PrepareConfig:
    """Which dataset to turn into shards, and how many shards."""

    dataset: str = "digits"
    # the file or folder DVC's prepare stage hashes for the data (dvc.yaml: ${prepare.files}):
    # the user's table, .npz, image folder, or a pipeline's module (a folder: with what it
    # reads); a built-in's own module by default. Under `dvc repro` the dataset's file must
    # be in it (`tasks.core.user_code.check_dvc_dep`)
    files: str = "tasks/data/datasets.py"
    data_dir: str = "data/tfrecords"
    num_shards: int | None = _spec(None, lo=1, hi=100_000)
    target_shard_mb: float = _spec(100.0, lo=0.001)
    min_shards: int | None = _spec(None, lo=1, hi=100_000)
    test_fraction: float = _spec(0.2, lo=0.01, hi=0.99)
    seed: int = _spec(42, lo=0)
    # a table's target column; an .npz's or a pipeline's label key (tasks/data/tables.py etc.)
    label: str = "label"
    # auto: read from the label's values (tasks/core/label_kinds.py: two values binary, text
    # classes, fractional floats real, integers classes unless many values for the rows)
    label_kind: Literal["auto", "class", "binary", "multi_label", "regression"] = "auto"
    # a table's column or an .npz's array holding each example's weight in the training
    # loss, as Keras's fit(sample_weight=) applies it (never a feature); empty: the one named
    # sample_weight, if any (a pipeline's third part, (features, label, weight), is its own)
    sample_weight: str = ""
    # blank numeric cells: refuse (name the columns), or fill with the training split's
    # mean or zero, or drop the rows that have any
    missing: Literal["refuse", "mean", "zero", "drop"] = "refuse"
    # an image folder's images as Keras's image_dataset_from_directory reads them: rgb (its
    # default: greyscale files too, as 3 channels), grayscale (1) or rgba (4)
    color_mode: Literal["rgb", "grayscale", "rgba"] = "rgb"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass(frozen=True)
class TrainConfig:
    """How to train: strategy, devices, model and optimisation."""

    strategy: str = _spec("auto", choices=("auto", *KINDS))
    replicas: int = _spec(2, lo=1, hi=1024)
    workers: int = _spec(1, lo=1, hi=1024)
    precision: Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"] = "auto"
    # XLA: auto, the faster of off and on as measured (`tasks.measure.autotune`); true; false
    jit_compile: Literal["auto", True, False] = "auto"
    # a built-in (mlp, cnn, resnet, embedding), the user's: package.module:function,
    # path/to/file.py:function, or a saved .keras file (`tasks.train.user_models`)
    model: str = _spec("cnn", model=True)
    # a function giving the training's Keras callbacks (package.module:function or
    # path/to/file.py:function, called with nothing), as fit(callbacks=) takes them, beside
    # any the model's function gives (`tasks.train.callbacks`); empty: none
    callbacks: str = ""
    # the file or folder DVC's baseline, train and sweep stages hash for the model (dvc.yaml:
    # ${train.files}): the user's model file or package, or a .keras file; the built-ins'
    # own module by default. Under `dvc repro` train.model's and sweep.model's file must be
    # in it (`tasks.core.user_code.check_dvc_dep`)
    files: str = "tasks/train/models.py"
    epochs: int = _spec(10, lo=1, hi=100_000)
    # auto: measured (`tasks.measure.autotune`) from DEFAULT_BATCH up, where the hardware and data
    # allow a choice; else DEFAULT_BATCH
    batch_size_per_replica: int | Literal["auto"] = _spec("auto", lo=1, hi=1_000_000)
    scaling: Literal["weak", "strong"] = "weak"
    learning_rate: float = _spec(0.001, lo=0.0, hi=10.0)
    # how the rate grows with the global batch (M, against one replica's M0): linear (M/M0),
    # sqrt, none, adascale (AdaScale's gain (M/M0)(phi+M0)/(phi+M), from the noise scale phi
    # measured as the training runs), auto (the optimizer's rule: Adam takes the square
    # root of AdaScale's gain); where no noise scale is recorded, adascale is linear and
    # auto sqrt
    lr_scaling: Literal["auto", "linear", "sqrt", "adascale", "none"] = "linear"
    warmup_epochs: int = _spec(1, lo=0)
    grad_accum_steps: int = _spec(1, lo=1, hi=1024)
    steps_per_call: int = _spec(10, lo=1, hi=100_000)
    # the measuring rounds after a training (`tasks.measure.probes`): at most this many;
    # they end sooner once the speedup's median round ratio is known to
    # +-measure_precision (`tasks.measure.rounds.Settling`)
    measure_rounds: int = _spec(25, lo=1, hi=1000)
    # the 95% interval's half-width, relative, that ends the rounds (0: always
    # measure_rounds)
    measure_precision: float = _spec(0.03, lo=0.0, hi=1.0)
    # most steps a block of a round (each sized to about a second). 100-step blocks of the
    # digits CNN vary from round to round as much as 300-step ones (8.0% and 7.6% over 40
    # rounds) at a third of the time, so more of them settle the speedup sooner
    measure_steps: int = _spec(100, lo=1, hi=100_000)
    cache: bool = True
    shuffle_buffer: int = _spec(4096, lo=1)
    seed: int = _spec(42, lo=0)
    runs_dir: str = "runs"
    # local worker processes (multi_worker): None, they talk over localhost; 0, each runs on
    # an emulated host of its own (`tasks.distribute.netlab`, needs root), links at full speed; > 0,
    # those links shaped to this many Gbit/s
    link_gbit: float | None = _spec(None, lo=0.0, hi=100_000.0)
    # pipeline: the model cut into this many stages, one device each (`tasks/train/stage_plan.py`)
    stages: int = _spec(2, lo=1, hi=64)
    micro_batches: int = _spec(4, lo=1, hi=4096)  # per step, through the stages (GPipe)
    cut_after: tuple[int, ...] = _spec((), lo=1, empty=True)  # empty: balanced by compute
    # one device's memory for training in MB (0: not checked; GPUs: from TensorFlow when 0)
    device_memory_mb: float = _spec(0.0, lo=0.0)
    # end the training at the first held-out evaluation that reaches evaluate.target_accuracy
    stop_at_target: bool = False
    # record the gradient noise scale in the step (`tasks.train.steps.GradientNoise`): each
    # micro-batch's gradient norm before the all-reduce and the all-reduced one's
    noise_scale: bool = True
    # one graph call in this many records it (1: every call; on the default digits CNN a
    # recording call is 9-13% slower, one in 10 costs 0-3%)
    noise_scale_every: int = _spec(10, lo=1, hi=100_000)
    # the training loop: tfscale's own (`tasks.train.steps`), or Keras's `model.fit` under
    # the strategy (`tasks.train.fit_loop`), timed and evaluated alike; the rounds then time
    # tfscale's loop beside fit's
    loop: Literal["tfscale", "fit"] = "tfscale"
    # each class's weight in the training loss, as Keras's fit(class_weight=) applies it
    # (`tasks.core.class_weights`): none; balanced (n / (classes x the class's training
    # examples), scikit-learn's); or class=weight pairs, by class name or index, "cat=2,
    # dog=0.5" (a class not named: 1). A class or binary label only; the held-out loss and
    # metrics stay unweighted, as Keras's evaluate keeps them
    class_weight: str = _spec("none", weights=True)

    @property
    def per_replica_batch(self) -> int:
        """The per-replica batch to train at: the config's, or DEFAULT_BATCH while `auto`
        is not settled (`tasks.measure.autotune` replaces `auto` by what it measured)."""
        batch = self.batch_size_per_replica
        return DEFAULT_BATCH if batch == "auto" else batch


@dataclass(frozen=True)
class EvaluateConfig:
    """How the held-out split is evaluated, and the target time to target aims at."""

    batch_size: int = _spec(256, lo=1, hi=1_000_000)
    # held-out accuracy whose first crossing during training gives the time, steps and
    # examples to target (`tasks.train.to_target`): the target where target_metric is
    # accuracy and target is null
    target_accuracy: float = _spec(0.96, lo=0.0, hi=1.0)
    # the held-out metric the target is of: auto (accuracy; a real-valued label's
    # mean_absolute_error), accuracy, loss, or any metric the model reports (its compiled
    # metrics, or a Keras metric by name: auc, precision, ...); a loss or an error is
    # reached from above
    target_metric: str = "auto"
    # the value of target_metric to reach (null: target_accuracy for accuracy; for another
    # metric, no target: its best is reported)
    target: float | None = None
    # the held-out split is evaluated during training every this many epochs of training
    # examples, on the clock (0: never; the time to target is then not measured)
    every_epochs: float = _spec(0.5, lo=0.0, hi=1000.0)
    # a study trains each side again with the next seeds, to the target only, and scores
    # the time to target as MLPerf does (the mean without the fastest and slowest seed)
    seeds: int = _spec(1, lo=1, hi=100)


@dataclass(frozen=True)
class SweepConfig:
    """The scaling grid: every combination is one cell (one training run)."""

    replicas: tuple[int, ...] = _spec((1, 2), lo=1, hi=1024)
    dataset_sizes: tuple[int, ...] = _spec((2048, 8192), lo=0)  # 0: prepare.dataset
    batch_sizes: tuple[int, ...] = _spec((64,), lo=1, hi=1_000_000)
    scaling: tuple[Literal["weak", "strong"], ...] = ("weak",)
    precision: tuple[Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"], ...] = ("auto",)
    strategy: str = _spec("mirrored", choices=sweep_kinds())
    model: str = _spec("cnn", model=True)  # as train.model
    epochs: int = _spec(2, lo=1, hi=10_000)
    out_dir: str = "sweep"
    # an interconnect axis for multi_worker cells: each rate (Gbit/s, 0 for full speed) runs
    # the cells of more than one replica on emulated hosts over links of that rate
    link_gbit: tuple[float, ...] = _spec((), lo=0.0, hi=100_000.0, empty=True)
    # strategy pipeline: `replicas` are its stages, each count once per micro-batch count
    micro_batches: tuple[int, ...] = _spec((4,), lo=1, hi=4096)
    # a Prefect work pool to run the cells on (a flow run each, taken by the pool's workers
    # on their hosts); empty: every cell in this process
    work_pool: str = ""
    # a pool's cell that fails, or whose worker is lost, runs again up to this many times
    cell_retries: int = _spec(1, lo=0, hi=10)


@dataclass(frozen=True)
class TrackConfig:
    """Where runs are tracked: the embedded MLflow store (MLFLOW_TRACKING_URI overrides)."""

    store_dir: str = "mlflow"
    experiment: str = "tfscale"
    # where `tfscale ui` serves unless --host/--port say otherwise, and where the console and
    # the Prefect artifact link while no `tfscale ui` serves the store (one that does, at any
    # port, is linked instead; a tracking server's own URI wins); links on MLflow's own pages
    # are relative to the UI showing them
    ui_url: str = _spec("http://127.0.0.1:5000", url=True)


@dataclass(frozen=True)
class ClusterConfig:
    """How the tasks of a cluster (TF_CONFIG, Slurm, --workers) wait on each other."""

    collective_timeout_s: float = _spec(60.0, lo=1.0, hi=86_400.0)
    chief_wait_s: float = _spec(600.0, lo=1.0, hi=86_400.0)


@dataclass(frozen=True)
class Config:
    """The whole of `params.yaml`."""

    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    track: TrackConfig = field(default_factory=TrackConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    @property
    def min_shards(self) -> int:
        """Shards needed so that every worker the config names gets files of its own."""
        named = self.prepare.min_shards or 1
        sweeps_workers = KINDS[self.sweep.strategy].takes_workers
        sweep_workers = max(self.sweep.replicas) if sweeps_workers else 1
        return max(named, self.train.workers, sweep_workers)


def load_config(
    path: str | Path | None = DEFAULT_PARAMS,
    overrides: dict[str, Any] | None = None,
    named: bool = False,
) -> Config:
    """Loads `params.yaml` (missing file means defaults) and applies dotted overrides.

    Args:
        path: the YAML file, or None for defaults only.
        overrides: values keyed by dotted name (`train.epochs`); None values are ignored.
        named: the user named `path` (`--params`): a missing file is an error, not the
            defaults (a mistyped name would otherwise run on settings nobody chose).

    Returns:
        A validated, frozen `Config`.

    Raises:
        ConfigError: naming the key, what was expected and what arrived.
    """
    raw: dict[str, Any] = {}
    if named and path is not None and not Path(path).is_file():
        raise ConfigError(
            f"--params {path}: no such file",
            f"give the path of a config file, or leave --params out to use {DEFAULT_PARAMS} "
            "(the defaults when there is none).",
        )
    if path is not None and Path(path).exists():
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or "unreadable"
            raise ConfigError(
                f"{path}: not valid YAML{where}: {problem}",
                "correct that line: 'key: value', nested keys indented under their section.",
            ) from None
        if raw is None:
            raise ConfigError(
                f"{path} is empty",
                f"restore it (git checkout -- {path}), or delete it to run on the defaults.",
            )
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of stage sections, got {_kind(raw)}")
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(raw, dotted, value)
    return _build(Config, raw, prefix="")


def config_from_dict(raw: dict[str, Any]) -> Config:
    """A validated `Config` from a plain dict such as `config_to_dict` gives."""
    return _build(Config, raw, prefix="")


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain, JSON-ready dict of a config object."""
    return dataclasses.asdict(config)


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _build(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "params.yaml"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {_kind(raw)} {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"{prefix}{unknown[0]}: unknown key; expected one of {', '.join(sorted(fields))}"
        )
    values = {}
    for name, value in raw.items():
        key = f"{prefix}{name}"
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, value, prefix=f"{key}.")
        else:
            values[name] = _check(key, hint, value, fields[name].metadata)
    return cls(**values)


def _check(key: str, hint: Any, value: Any, meta: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    optional = origin in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:  # tuple[X, ...]: a YAML list of X, non-empty unless marked
        if not isinstance(value, list | tuple) or not (value or meta.get("empty")):
            raise ConfigError(f"{key}: expected a non-empty list; got {_kind(value)} {value!r}")
        return tuple(_check(f"{key}[{i}]", args[0], v, meta) for i, v in enumerate(value))
    also = " or null" if optional else ""  # what else the value may be, for the error
    union = origin in (typing.Union, types.UnionType)
    if union and any(typing.get_origin(a) is Literal for a in args):  # int | Literal["auto"]
        (words,) = (a for a in args if typing.get_origin(a) is Literal)
        if any(type(value) is type(w) and value == w for w in typing.get_args(words)):
            return value
        (hint,) = (a for a in args if a is not words)
        also = "".join(f" or {w}" for w in typing.get_args(words))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:  # of strings, and of true / false (never 1 or 0 for them)
        if not any(type(value) is type(a) and value == a for a in args):
            shown = ", ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in args)
            raise ConfigError(f"{key}: expected one of {shown}; got {value!r}")
        return value
    value = _coerce(key, hint, value, also)
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(choices)}; got {value!r}")
    if isinstance(value, str):
        _check_form(key, value, meta)
    if isinstance(value, float) and not math.isfinite(value):  # NaN passes every bound
        raise ConfigError(f"{key}: expected a finite number; got {value!r}")
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and value < lo or hi is not None and value > hi:
        bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ConfigError(f"{key}: expected a value {bounds}; got {value!r}")
    return value


def _check_form(key: str, value: str, meta: Any) -> None:
    """A string in the form its field's metadata asks: a model, class weights, a web
    address."""
    if meta.get("model") and not _model_form(value):
        raise ConfigError(
            f"{key}: expected mlp, cnn, resnet, embedding, package.module:function, "
            f"path/to/file.py:function or a .keras file; got {value!r}"
        )
    if meta.get("weights"):
        from tfscale.tasks.core.class_weights import parsed

        try:
            parsed(value)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}; got {value!r}") from None
    if meta.get("url") and not _web_address(value):
        raise ConfigError(
            f"{key}: expected a web address such as http://127.0.0.1:5000; got {value!r}"
        )


def _model_form(value: str) -> bool:
    """A built-in model's name, a function reference, or a `.keras` path."""
    from tfscale.tasks.core.user_code import FUNCTION

    if value in ("mlp", "cnn", "resnet", "embedding") or value.endswith(".keras"):
        return True
    return FUNCTION.fullmatch(value) is not None


def _web_address(value: str) -> bool:
    """http(s)://host, with a port if any that is a number."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _coerce(key: str, hint: type, value: Any, also: str) -> Any:
    expected = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    ok = (
        (hint is bool and isinstance(value, bool))
        or (hint is int and isinstance(value, int) and not isinstance(value, bool))
        or (hint is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (hint is str and isinstance(value, str))
    )
    if not ok:
        raise ConfigError(f"{key}: expected {expected[hint]}{also}; got {_kind(value)} {value!r}")
    return float(value) if hint is float else value


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def key_table() -> str:
    """Every key of `params.yaml` as a Markdown table (key, type, default, allowed values,
    and the note written beside the field here): the table docs/configuration.md shows,
    which a test holds to these classes."""
    rows = ["| key | type | default | allowed | note |", "| --- | --- | --- | --- | --- |"]
    for section in dataclasses.fields(Config):
        rows += _key_rows(section.name, section.default_factory)
    return "\n".join(rows) + "\n"


def _key_rows(prefix: str, cls: type) -> list[str]:
    notes = _field_notes(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}"
        if is_dataclass(f.default_factory):
            rows += _key_rows(key, f.default_factory)
            continue
        kind, literal = _shown_type(str(f.type))
        default = f.default if f.default is not MISSING else f.default_factory()
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        allowed = " or ".join(x for x in (literal, _allowed(f.metadata)) if x)
        rows.append(f"| `{key}` | {kind} | `{shown}` | {allowed} | {notes.get(f.name, '')} |")
    return rows


def _shown_type(annotation: str) -> tuple[str, str]:
    """A field's type as the table shows it, and the values a `Literal` allows."""
    listed = annotation.startswith("tuple[")
    inner = annotation.removeprefix("tuple[").removesuffix(", ...]") if listed else annotation
    literal = ""
    if "Literal[" in inner:
        values = inner.split("Literal[", 1)[1].split("]", 1)[0]
        literal = values.replace("'", "").replace('"', "")
        bools = "True" in values  # Literal["auto", True, False]
        inner = "str or bool" if bools else inner.replace(f"Literal[{values}]", "str")
    kind = inner.replace(" | ", " or ").replace("None", "null")
    return (f"list of {kind}" if listed else kind), literal


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _allowed(meta: Any) -> str:
    if meta.get("choices"):
        return ", ".join(meta["choices"])
    if meta.get("url"):
        return "a web address"
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and hi is not None:
        return f"{_number(lo)} to {_number(hi)}"
    if lo is not None:
        return f"at least {_number(lo)}"
    return f"at most {_number(hi)}" if hi is not None else ""


def _field_notes(cls: type) -> dict[str, str]:
    """The comment written above or beside each field of `cls`, as one line."""
    import inspect

    notes, pending = {}, []
    for line in inspect.getsource(cls).splitlines()[1:]:
        text = line.strip()
        if text.startswith("#"):
            pending.append(text.lstrip("# "))
        elif ":" in text and not text.startswith(("@", "def ", '"""', "return")):
            name, _, rest = text.partition(":")
            inline = rest.partition("  # ")[2]
            note = " ".join([*pending, inline]).strip()
            if name.isidentifier() and note:
                notes[name] = note.replace("|", "/")
            pending = []
        else:
            pending = []
    return notes


def study_name(config: Config) -> str:
    """A study's flow run named after what it runs: `digits-cnn-auto-2x-10ep` (the
    strategy as configured; its MLflow run's name says what `auto` chose)."""
    train = config.train
    what = (config.prepare.dataset, train.model, train.strategy)
    return "-".join(what) + f"-{train.replicas}x-{train.epochs}ep"


def sweep_name(config: Config) -> str:
    """A sweep's flow run named after what it runs: `sweep-cnn-mirrored`."""
    return f"sweep-{config.sweep.model}-{config.sweep.strategy}"
