"""The scaling study in one call, for a notebook: your model and your data, tracked as
`tfscale run` tracks it.

    from tfscale.flows.notebook import study

    result = study(build, frame, label="target", epochs=5, target_metric="auc", target=0.97)
    print(result.answer)          # the answer line
    result.speedup_text           # '1.21x (1.15-1.27)'
    result.time_to_target_speedup, result.mlflow_run_id

`model`: a function taking the data's spec (or nothing) and returning a `keras.Model`, a
`keras.Model` itself (saved once, and read back by each training so both start from its
weights), or any `--model` form. `data`: a pandas DataFrame holding its label column
(`label=`, prepare.label), or `(DataFrame, labels)` (a Series or an array, by position):
the table it is, text columns included, written once to a Parquet file named by its
contents and read as `--dataset table.parquet`; arrays (`(x, y)`, or a dict of named arrays
holding the label under `label`), written once to an .npz so; a `tf.data.Dataset` of
`(features, label)`; or any `--dataset` form. An error about the file written is said of
what was passed (the DataFrame, its column, the Series, the arrays). Settings are
`params.yaml`'s keys by name (`epochs=5`, `replicas=4`, `label="target"`), or dotted
(`**{"train.epochs": 5}`).

The cell shows the stage lines and the answer, as the console does: the console of the
`tfscale` command for the call (`tasks.core.process.console`), the notebook's own logging
as it was after it; `verbose=True` shows every library's log.

A function or dataset handed over lives in this process only: the study runs its
trainings here (Mirrored over this machine's devices; OneDevice); worker processes
(`workers` above 1) need the model and data in files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import marshal
import re
import sys
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.core.user_code import is_registered, register
from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.settings.config import DEFAULT_PARAMS, Config, load_config
from tfscale.tasks.settings.kinds import KINDS, LOCAL_WORKERS

SECTIONS = ("prepare", "train", "evaluate", "track", "cluster")  # where a bare name is looked up


def study(
    model: Any,
    data: Any,
    params: str | Path | None = DEFAULT_PARAMS,
    *,
    verbose: bool = False,
    **settings: Any,
) -> Any:
    """The study's `ScalingSummary` (the answer, the speedup and its interval, the time to
    target, `mlflow_run_id`) for `model` on `data`. The cell shows the stage lines and the
    answer, as the console does; `verbose=True` shows every library's log too.

    Raises:
        UsageError: an unknown setting; a model or dataset of this process for worker
            processes.
        DatasetError: data tfscale cannot take, said of what was passed (the DataFrame,
            the Series, the arrays), never of the file written for it.
    """
    from tfscale.flows.study import scaling_study
    from tfscale.tasks.core.process import console
    from tfscale.tasks.core.progress import status

    with console(verbose):
        overrides = {_dotted(name): value for name, value in settings.items()}
        named = params is not None and str(params) != str(DEFAULT_PARAMS)  # never a typo's defaults
        config = load_config(params, overrides, named=named)
        folder = Path(config.prepare.data_dir).parent / "notebook"
        label = config.prepare.label
        overrides["prepare.dataset"] = _dataset_ref(data, folder, label)
        overrides["train.model"] = _model_ref(model, folder)
        config = load_config(params, overrides, named=named)
        _check_in_process(config)
        with _said_of(_passed(data, label), config.prepare.dataset):
            summary = scaling_study(config, return_state=True).result()
        status("answer", summary.answer or summary.speedup_text)
    return summary


def _dotted(name: str) -> str:
    if "." in name:
        return name
    classes = typing.get_type_hints(Config)
    for section in SECTIONS:
        if name in {f.name for f in dataclasses.fields(classes[section])}:
            return f"{section}.{name}"
    raise UsageError(
        f"study(..., {name}=...): no such setting",
        "name a key of params.yaml (epochs, replicas, target_metric, ...) or give it dotted "
        "(**{'train.epochs': 5}); docs/configuration.md lists them",
    )


def _dataset_ref(data: Any, folder: Path, label: str) -> str:
    """A `--dataset` for `data`: a DataFrame (its label column named `label`), or one and
    its labels, written once to a Parquet file named by its contents, read as any table
    (text columns included); arrays written once to an .npz named by their contents; a
    tf.data.Dataset handed over in this process."""
    if isinstance(data, (str, Path)):
        return str(data)
    if _is_frame(data):
        return _table_ref(data, None, folder, label)
    if isinstance(data, tuple) and len(data) == 2:
        if _is_frame(data[0]):
            return _table_ref(data[0], data[1], folder, label)
        data = {"x": data[0], "y": data[1]}
    if isinstance(data, dict):
        return _arrays_ref(data, folder)
    import tensorflow as tf

    if isinstance(data, tf.data.Dataset):
        name = f"data_{id(data):x}"
        return register(name, data, f"{name}:{data.element_spec}")
    raise UsageError(
        f"study(model, data): data of type {type(data).__name__}",
        "give a pandas DataFrame (label= its label column), (DataFrame, Series), a "
        "tf.data.Dataset, (x, y) arrays, a dict of named arrays, or a --dataset form",
    )


def _is_frame(data: Any) -> bool:
    pandas = sys.modules.get("pandas")  # a DataFrame's holder has imported it
    return pandas is not None and isinstance(data, pandas.DataFrame)


def _table_ref(frame: Any, labels: Any, folder: Path, label: str) -> str:
    """The Parquet file of `frame`, with `labels` (a Series or an array, taken by position,
    not by index) as its column `label` when given.

    Raises:
        DatasetError: a column mixes numbers and text, or the labels are not one a row.
        UsageError: `frame` has a column `label` besides the labels given.
    """
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = frame.rename(columns=str)
    if labels is not None:
        if label in frame.columns:
            raise UsageError(
                f"the DataFrame has a column {label!r}, the name its labels are given "
                "(prepare.label)",
                "drop that column from the DataFrame, or name the label otherwise (label='...')",
            )
        values = labels.to_numpy() if hasattr(labels, "to_numpy") else np.asarray(labels)
        if len(values) != len(frame):
            raise DatasetError(
                f"the DataFrame has {len(frame)} rows and its labels {len(values)}; each "
                "row needs its label",
                "give the DataFrame and the labels of the same rows",
            )
        frame = frame.assign(**{label: values})
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise _mixed_column(exc) from None
    except ValueError as exc:  # repeated column names
        raise UsageError(f"the DataFrame: {exc}", "give each column its own name") from None
    written = io.BytesIO()
    pq.write_table(table, written)
    return _kept_once(folder, "parquet", written.getvalue())


def _mixed_column(exc: Exception) -> DatasetError:
    found = re.search(r"for column (.+) with type", " ".join(map(str, exc.args)))
    column = found.group(1) if found else "?"
    return DatasetError(
        f"the DataFrame's column {column!r} holds values of more than one type "
        f"({exc.args[0] if exc.args else exc}), which one column of the shards cannot store",
        f"make the column all numbers (NaN for missing) or all text (df[{column!r}].astype(str))",
    )


def _arrays_ref(data: dict, folder: Path) -> str:
    """The .npz of the named arrays `data`.

    Raises:
        DatasetError: an array of Python objects, which an .npz keeps only pickled.
    """
    arrays = {str(k): np.asarray(v) for k, v in data.items()}
    for key, array in arrays.items():
        if array.dtype == object:
            raise DatasetError(
                f"the array {key!r} holds Python objects (dtype object), which tfscale reads "
                "only as numbers or text",
                f"give it as numbers, or as text ({key}.astype(str)); a table with text "
                "columns as a pandas DataFrame",
            )
    digest = hashlib.sha256()
    for key in sorted(arrays):
        digest.update(key.encode() + arrays[key].tobytes() + str(arrays[key].dtype).encode())
    path = folder / f"{digest.hexdigest()[:16]}.npz"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(path.with_suffix(".tmp.npz"), **arrays)
        path.with_suffix(".tmp.npz").replace(path)
    return str(path)


def _kept_once(folder: Path, suffix: str, content: bytes) -> str:
    """`content` in `folder`, named by its digest, written unless there already (so the
    same data is prepared once)."""
    path = folder / f"{hashlib.sha256(content).hexdigest()[:16]}.{suffix}"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.with_suffix(f".tmp.{suffix}").write_bytes(content)
        path.with_suffix(f".tmp.{suffix}").replace(path)
    return str(path)


@dataclasses.dataclass(frozen=True)
class _Passed:
    """How an error names the data passed, in place of the file written for it."""

    noun: str  # the DataFrame
    owner: str  # the DataFrame's (column 'x')
    label: str  # the labels: the DataFrame's column 'target', the Series of labels
    column: str  # the labels' name in the file written (prepare.label)


def _passed(data: Any, label: str) -> _Passed | None:
    frame = ("the DataFrame", "the DataFrame's")
    if _is_frame(data):
        return _Passed(*frame, f"the DataFrame's column {label!r}", label)
    if isinstance(data, tuple) and len(data) == 2:
        series = type(data[1]).__name__ == "Series"
        labels = "the Series of labels" if series else "the label array"
        if _is_frame(data[0]):
            return _Passed(*frame, labels, label)
        return _Passed("the arrays", "the", f"{labels} y", label)
    if isinstance(data, dict):
        return _Passed("the arrays", "the", f"the array {label!r} (the labels)", label)
    return None  # a file of the user's own, or a dataset: its errors are said as they are


@contextmanager
def _said_of(passed: _Passed | None, path: str) -> Iterator[None]:
    """A `DatasetError` about the file written for the data (`path`) said of the data
    passed (`_restated`)."""
    try:
        yield
    except DatasetError as exc:
        if passed is None or Path(path).name not in str(exc):
            raise
        raise _restated(exc, passed, Path(path).name) from None


_FILE = "\0"  # the written file, wherever an error names it (as given, or resolved)


def _restated(exc: DatasetError, passed: _Passed, name: str) -> DatasetError:
    """`exc` with the written file `name` (any path ending in it) said as the data passed,
    and its fix's flags as `study`'s settings (`--label` as `label=...`)."""
    message = re.sub(r"[^\s'\"(]*" + re.escape(name), _FILE, exc.message)
    phrases = (
        (f"{_FILE}: no column", f"{passed.noun} has no column"),
        (f"{_FILE}: column {passed.column!r}", passed.label),
        (f"column {passed.column!r} of {_FILE}", passed.label),
        (f"the label array of {_FILE}", passed.label),
        (f"{_FILE}: its ", f"{passed.owner} "),
        (f"{_FILE}: column ", f"{passed.owner} column "),
        (f"{_FILE}: the arrays", "the arrays"),
        (f"{_FILE}: ", f"{passed.noun}: "),
        (_FILE, passed.noun),
    )
    for written, said in phrases:
        message = message.replace(written, said)
    fix = re.sub(r"--([a-z][a-z-]*)", lambda m: m[1].replace("-", "_") + "=...", exc.fix)
    return DatasetError(message, fix)


def _model_ref(model: Any, folder: Path) -> str:
    """A `--model` for `model`: a function handed over in this process (keyed by its code),
    a `keras.Model` saved once to a `.keras` file named by its weights."""
    import keras

    if isinstance(model, (str, Path)):
        return str(model)
    if isinstance(model, keras.Model):
        from tfscale.tasks.train.training import weights_digest

        path = folder / f"{model.name}-{weights_digest(model)}.keras"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            model.save(path)
        return str(path)
    if callable(model):
        code = getattr(model, "__code__", None)
        made_of = hashlib.sha256(marshal.dumps(code) if code else repr(model).encode())
        name = getattr(model, "__name__", "model").strip("<>") or "model"
        return register(f"model_{name}", model, made_of.hexdigest())
    raise UsageError(
        f"study(model, data): a model of type {type(model).__name__}",
        "give a function returning a keras.Model, a keras.Model, or a --model form",
    )


def _check_in_process(config: Config) -> None:
    handed = [ref for ref in (config.prepare.dataset, config.train.model) if is_registered(ref)]
    kind = KINDS.get(config.train.strategy)  # None: `auto`, chosen from the hardware
    in_workers = kind is not None and kind.runs == LOCAL_WORKERS
    if handed and (config.train.workers > 1 or in_workers):
        raise UsageError(
            f"{', '.join(handed)} lives in this process only, and worker processes train "
            f"this study (train.workers {config.train.workers}, {config.train.strategy})",
            "save the model's function and data in files (model='mine.py:build', "
            "data='table.csv'), or train here (strategy='mirrored', workers=1)",
        )
