"""The user's own data as sources: a table (`.csv`, `.parquet`), arrays (`.npz`), a
tf.data pipeline (`package.module:function` or `path/to/file.py:function`), and any
tensorflow-datasets set whose examples are not one image and a class.

Each is read as a stream (`tasks.data.streams`): a table in blocks of rows, never whole.
Numeric table columns are stored as float32 (a missing value is NaN), others as text.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tfscale.tasks.core.user_code import fingerprint, is_function_ref, load_function, one_line
from tfscale.tasks.data.blanks import checked
from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.data.spec import IMAGE, Feature, FeatureSpec
from tfscale.tasks.data.streams import Chunk, LabelCoding, StreamSource, label_coding, test_rows
from tfscale.tasks.settings.config import PrepareConfig

TABLE_SUFFIXES = (".csv", ".parquet")
ARRAY_SUFFIXES = (".npz",)
_BLOCK_BYTES = 4 << 20  # a table is read this much at a time
_CHUNK_ROWS = 4096  # a pipeline's examples are taken this many at a time


def is_user_file(dataset: str) -> bool:
    return Path(dataset).suffix.lower() in TABLE_SUFFIXES + ARRAY_SUFFIXES


def user_source(cfg: PrepareConfig) -> StreamSource:
    """The source a table, an `.npz` or a function names."""
    if is_function_ref(cfg.dataset):
        return pipeline_source(cfg)
    path = Path(cfg.dataset)
    if not path.is_file():
        raise DatasetError(
            f"{path}: no such file",
            "check the path (relative to where tfscale runs), or give a dataset name: "
            "digits, synthetic, an image folder or a tensorflow-datasets name",
        )
    if path.suffix.lower() in ARRAY_SUFFIXES:
        return npz_source(path, cfg)
    return table_source(path, cfg)


def _file_version(path: Path) -> str:
    from tfscale.tasks.data.manifest import sha256_of

    return sha256_of(path)[:16]


def _coding(raw: np.ndarray, cfg: PrepareConfig, what: str, names=()) -> LabelCoding:
    try:
        return label_coding(raw, cfg.label_kind, what, names)
    except ValueError as exc:
        raise DatasetError(
            str(exc), "set --label-kind (prepare.label_kind) to what the label is, or auto"
        ) from None


def _source(
    name: str,
    version: str,
    features: tuple[Feature, ...],
    coding: LabelCoding,
    labels: dict[str | None, np.ndarray],
    cfg: PrepareConfig,
    read: Callable[[str | None], Iterator[Chunk]],
) -> StreamSource:
    """The stream source of `features` and the label `coding` encodes: `read(split)` gives
    chunks of raw labels, by the source's own splits or (`None`) one stream to be split by
    a seeded draw over its raw `labels`. A lone array of images takes the name `image`
    (`_named`)."""
    spec = FeatureSpec(_named(features, coding.label.kind), coding.label)
    rename = {old.name: new.name for old, new in zip(features, spec.features, strict=True)}

    def chunks(split: str | None) -> Iterator[Chunk]:
        for rows, raw in read(split):
            yield {rename[n]: v for n, v in rows.items()}, coding.encode(raw)

    encoded = {split: coding.encode(raw) for split, raw in labels.items()}
    if None in encoded and len(encoded[None]) < 2:
        raise DatasetError(
            f"{name} has {len(encoded[None])} example(s); a training and a held-out split need "
            "2 or more",
            "give it more rows",
        )
    spec, chunks, encoded = checked(
        name, spec, chunks, encoded, cfg.missing, lambda rows: ~_held_out(spec, rows, cfg)
    )
    if None in encoded:
        return _split(name, version, spec, encoded[None], cfg, chunks)
    splits = {split: len(raw) for split, raw in encoded.items()}
    return StreamSource(name, version, spec, splits, chunks)


def _held_out(spec: FeatureSpec, labels: np.ndarray, cfg: PrepareConfig) -> np.ndarray:
    """The held-out rows of a stream split by a seeded draw, stratified by a class label."""
    stratify = spec.label.kind in ("class", "binary")
    return test_rows(labels, cfg.test_fraction, cfg.seed, stratify)


def _split(
    name: str, version: str, spec: FeatureSpec, labels: np.ndarray, cfg: PrepareConfig, read
) -> StreamSource:
    """A one-stream source split by a seeded, stratified draw over its `labels`."""
    held_out = _held_out(spec, labels, cfg)
    splits = {"test": int(held_out.sum()), "train": int((~held_out).sum())}
    return StreamSource(name, version, spec, splits, read, held_out)


# -- tables -------------------------------------------------------------------------------


def table_source(path: Path, cfg: PrepareConfig) -> StreamSource:
    """A CSV or Parquet table: `cfg.label` is the target column, every other a feature."""
    types = _table_types(path)
    if cfg.label not in types:
        shown = ", ".join(list(types)[:12]) + (", ..." if len(types) > 12 else "")
        raise DatasetError(
            f"{path}: no column {cfg.label!r} to take the label from (its columns: {shown})",
            "name the target column with --label (prepare.label)",
        )
    _refuse_weights(path, [name for name in types if name != cfg.label], "column")
    raw = _label_column(path, cfg.label, types)
    if len(raw) == 0:
        raise DatasetError(f"{path} has no rows", "give a table with rows under its header")
    coding = _coding(raw, cfg, f"column {cfg.label!r} of {path.name}")
    features = tuple(
        Feature(name, "string" if kind == "string" else "float32", (), date=kind == "date")
        for name, kind in types.items()
        if name != cfg.label
    )
    if not features:
        raise DatasetError(
            f"{path} has only the label column", "give the table its feature columns too"
        )

    def read(_split: str | None) -> Iterator[Chunk]:
        for batch in _table_batches(path, types):
            yield _table_chunk(batch, features, cfg.label)

    return _source(path.name, _file_version(path), features, coding, {None: raw}, cfg, read)


WEIGHTS = ("sample_weight", "sample_weights", "class_weight", "class_weights")


def _refuse_weights(path: Path, names: list[str], what: str) -> None:
    """A column or array named as Keras's weights would otherwise become a feature the
    model trains on, and the training go unweighted.

    Raises:
        DatasetError: one of `names` is in `WEIGHTS`.
    """
    found = [name for name in names if name.lower() in WEIGHTS]
    if found:
        raise DatasetError(
            f"{path}: its {what} {found[0]!r} holds weights, which tfscale does not carry "
            "into training yet: it would become a feature and the training go unweighted",
            f"drop the {what} to train unweighted, or train with model.fit",
        )


def _table_types(path: Path) -> dict[str, str]:
    """Each column's kind: `number`, `bool` or `string`, from the file's schema (a CSV's
    first block)."""
    import pyarrow as pa

    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            schema = pq.ParquetFile(path).schema_arrow
        else:
            import pyarrow.csv as pc

            with pc.open_csv(path, read_options=pc.ReadOptions(block_size=_BLOCK_BYTES)) as r:
                schema = r.schema
    except (pa.ArrowInvalid, OSError) as exc:
        first = str(exc).split("\n")[0]
        raise DatasetError(
            f"{path} is not a table tfscale can read ({first})",
            "give a CSV with a header row, or a Parquet file",
        ) from None
    return {f.name: _kind_of(f.type) for f in schema}


def _kind_of(arrow_type: Any) -> str:
    import pyarrow as pa

    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        return "number"
    if pa.types.is_null(arrow_type):  # empty in the first block: numbers with gaps
        return "number"
    if pa.types.is_temporal(arrow_type) and not pa.types.is_time(arrow_type):
        return "date"  # a date or a time stamp: a number of days since 1970-01-01
    return "bool" if pa.types.is_boolean(arrow_type) else "string"


def _arrow_types(types: dict[str, str]) -> dict[str, Any]:
    import pyarrow as pa

    kinds = {
        "number": pa.float64(),
        "bool": pa.bool_(),
        "string": pa.string(),
        "date": pa.timestamp("s"),
    }
    return {name: kinds[kind] for name, kind in types.items()}


def _table_batches(path: Path, types: dict[str, str], columns: list[str] | None = None):
    """The table's record batches, each column of the type its schema gave (the label's
    inferred type kept, so integer classes stay integers)."""
    import pyarrow as pa

    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            yield from pq.ParquetFile(path).iter_batches(batch_size=65_536, columns=columns)
            return
        import pyarrow.csv as pc

        if columns:  # the label alone: its type as inferred
            convert = pc.ConvertOptions(include_columns=columns)
        else:
            convert = pc.ConvertOptions(
                column_types=_arrow_types(types), include_columns=list(types)
            )
        read = pc.ReadOptions(block_size=_BLOCK_BYTES)
        with pc.open_csv(path, read_options=read, convert_options=convert) as reader:
            yield from reader
    except pa.ArrowInvalid as exc:
        raise _mixed_column(path, str(exc), columns or list(types)) from None


def _mixed_column(path: Path, text: str, names: list[str]) -> DatasetError:
    found = re.search(r"column #(\d+)", text)
    column = names[int(found.group(1))] if found and int(found.group(1)) < len(names) else "?"
    detail = text.split(": ", 2)[-1].split("\n")[0]
    return DatasetError(
        f"{path}: column {column!r} holds values of more than one type ({detail}), which one "
        "column of the shards cannot store",
        "make the column all numbers (empty for missing) or all text (quote its values)",
    )


def _label_column(path: Path, label: str, types: dict[str, str]) -> np.ndarray:
    import pyarrow as pa

    parts = [batch.column(0) for batch in _table_batches(path, types, [label])]
    column = pa.chunked_array(parts) if parts else pa.chunked_array([], pa.float64())
    if column.null_count:
        raise DatasetError(
            f"{path}: column {label!r} has {column.null_count} empty value(s); every example "
            "needs a label",
            "fill them or drop those rows",
        )
    return column.to_numpy()


def _table_chunk(batch: Any, features: tuple[Feature, ...], label: str) -> Chunk:
    import pyarrow as pa
    import pyarrow.compute as pcomp

    columns = {}
    for feature in features:
        values = batch.column(batch.schema.get_field_index(feature.name))
        if feature.dtype == "string":
            text = pcomp.cast(values, pa.string()).fill_null("")
            columns[feature.name] = np.asarray(text.to_numpy(zero_copy_only=False), object)
        elif feature.date:
            seconds = pcomp.cast(pcomp.cast(values, pa.timestamp("s")), pa.int64())
            days = seconds.to_numpy(zero_copy_only=False).astype(np.float64) / 86_400
            columns[feature.name] = days.astype(np.float32)  # a blank date: NaN
        else:
            numbers = pcomp.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
            columns[feature.name] = numbers.astype(np.float32)
    raw = batch.column(batch.schema.get_field_index(label)).to_numpy(zero_copy_only=False)
    return columns, raw


# -- arrays -------------------------------------------------------------------------------


def npz_source(path: Path, cfg: PrepareConfig) -> StreamSource:
    """Arrays saved with `np.savez`: `x` and `y`; `x_train`, `y_train`, `x_test` and
    `y_test` (its own split); or named arrays with the label under `cfg.label`."""
    parts = _npz_parts(path, cfg.label)
    first_features, _ = next(iter(parts.values()))
    all_labels = np.concatenate([labels for _, labels in parts.values()])
    coding = _coding(all_labels, cfg, f"the label array of {path.name}")
    features = tuple(_array_feature(name, a) for name, a in first_features.items())

    def read(split: str | None) -> Iterator[Chunk]:
        arrays, labels = parts[split]
        for lo in range(0, len(labels), _CHUNK_ROWS):
            rows = {n: _stored(a[lo : lo + _CHUNK_ROWS]) for n, a in arrays.items()}
            yield rows, labels[lo : lo + _CHUNK_ROWS]

    labels = {split: raw for split, (_, raw) in parts.items()}
    return _source(path.name, _file_version(path), features, coding, labels, cfg, read)


def _npz_parts(path: Path, label: str) -> dict[str | None, tuple[dict[str, Any], np.ndarray]]:
    """The arrays by split (None: one set, to be split): the features by name, the labels.

    Raises:
        DatasetError: not an .npz, no arrays tfscale knows, or arrays of unequal lengths.
    """
    import zipfile

    try:
        archive = np.load(path, allow_pickle=False)
        arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise DatasetError(
            f"{path} is not an .npz tfscale can read ({str(exc).splitlines()[0]})",
            "save the arrays with numpy.savez(path, x=..., y=...)",
        ) from None
    _refuse_weights(path, list(arrays), "array")
    parts: dict[str | None, tuple[dict[str, Any], np.ndarray]]
    if {"x_train", "y_train", "x_test", "y_test"} <= arrays.keys():
        parts = {s: ({"x": arrays[f"x_{s}"]}, arrays[f"y_{s}"]) for s in ("train", "test")}
    elif {"x", "y"} <= arrays.keys():
        parts = {None: ({"x": arrays["x"]}, arrays["y"])}
    elif label in arrays:
        named = {k: v for k, v in arrays.items() if k != label}
        parts = {None: (named, arrays[label])}
    else:
        raise DatasetError(
            f"{path} holds {', '.join(arrays) or 'no arrays'}: expected x and y, x_train, "
            f"y_train, x_test and y_test, or named arrays with the label under {label!r}",
            "save it with numpy.savez(path, x=..., y=...), or name the label array with --label",
        )
    for split, (features, labels) in parts.items():
        lengths = {name: len(a) for name, a in {**features, "label": labels}.items()}
        if len(set(lengths.values())) > 1 or not features:
            where = f" ({split})" if split else ""
            shown = ", ".join(f"{n} {k}" for n, k in lengths.items())
            raise DatasetError(
                f"{path}{where}: the arrays differ in length ({shown}); each needs a row per "
                "example",
                "save arrays of equal length",
            )
    return parts


def _array_feature(name: str, array: np.ndarray) -> Feature:
    if array.dtype.kind in "SUO":
        if array.ndim > 1:
            raise DatasetError(
                f"array {name!r} holds text of shape {array.shape[1:]} per example",
                "give text as one string per example",
            )
        return Feature(name, "string", ())
    return Feature(name, _dtype_name(array.dtype), tuple(array.shape[1:]))


def _named(features: tuple[Feature, ...], kind: str) -> tuple[Feature, ...]:
    """A lone uint8 array of images with a class label is `image` (the image format)."""
    only = features[0]
    if len(features) == 1 and only.dtype == "uint8" and len(only.shape) == 3 and kind == "class":
        return (Feature(IMAGE, "uint8", only.shape),)
    return features


def _stored(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind in "SU":
        return values.astype(object)
    return values


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.kind == "f":
        return "float32"
    if dtype.kind == "b":
        return "bool"
    if dtype == np.uint8:
        return "uint8"
    return "int32" if dtype.itemsize <= 4 else "int64"


# -- a tf.data pipeline -------------------------------------------------------------------


def source_fingerprint(cfg: PrepareConfig) -> str:
    """What the user's data is made of, for a cached prepare to key on beside the config: a
    table's or an .npz's sha256; a function's module file's (the data it reads elsewhere
    is not seen: `tfscale prepare` itself reads it afresh). Empty for the other sources."""
    from tfscale.tasks.data.manifest import sha256_of

    dataset = cfg.dataset
    if is_user_file(dataset) and Path(dataset).is_file():
        return sha256_of(Path(dataset))
    return fingerprint(dataset) if is_function_ref(dataset) else ""


def pipeline_source(cfg: PrepareConfig) -> StreamSource:
    """A function returning a finite `tf.data.Dataset` of `(features, label)` (features a
    tensor or a dict of them) or of dicts holding the label under `cfg.label`; or a dict
    of such datasets by split (`train`, `test`)."""
    from tfscale.tasks.data.datasets import dataset_slug

    function, file = load_function(cfg.dataset, "dataset", DatasetError)
    datasets = _made(function, cfg)

    version = _code_version(file, cfg.dataset)
    return datasets_source(
        dataset_slug(cfg.dataset), version, datasets, cfg, cfg.label,
        remake=lambda: _made(function, cfg),
    )  # fmt: skip


def _made(function: Callable[[], Any], cfg: PrepareConfig) -> dict[str | None, Any]:
    """The user's datasets, made by calling their function (afresh for each read: a
    seeded shuffle then gives the same examples each time), by split (None: one)."""
    import tensorflow as tf

    try:
        made = function()
    except Exception as exc:  # noqa: BLE001 - the user's function: whatever it raises
        raise DatasetError(
            f"{cfg.dataset} raised {type(exc).__name__}: {one_line(exc)}",
            "fix the function (run again with --debug for the traceback)",
        ) from exc
    datasets = made if isinstance(made, dict) else {None: made}
    for split, ds in datasets.items():
        where = f" under {split!r}" if split else ""
        if not isinstance(ds, tf.data.Dataset):
            raise DatasetError(
                f"{cfg.dataset} returned a {type(ds).__name__}{where}, not a tf.data.Dataset",
                "return a tf.data.Dataset of (features, label), or a dict of them by split "
                "('train', 'test')",
            )
        if int(ds.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
            raise DatasetError(
                f"{cfg.dataset} returned an infinite dataset{where} (it repeats forever); "
                "prepare writes every example once",
                "bound it: drop the .repeat(), or end it with .take(n)",
            )
    if set(datasets) - {None} and not {"train", "test"} <= set(datasets):
        raise DatasetError(
            f"{cfg.dataset} returned splits {', '.join(map(str, datasets))}",
            "return one dataset, or a dict with 'train' and 'test'",
        )
    return datasets


def _code_version(file: str, ref: str) -> str:
    digest = hashlib.sha256(ref.encode())
    if file and Path(file).is_file():
        digest.update(Path(file).read_bytes())
    return digest.hexdigest()[:16]


def datasets_source(
    name: str,
    version: str,
    datasets: dict[str | None, Any],
    cfg: PrepareConfig,
    label_key: str,
    class_names: tuple[str, ...] = (),
    remake: Callable[[], dict[str | None, Any]] | None = None,
) -> StreamSource:
    """tf.data datasets (one, or one per split) as a stream source: one pass over each
    finds the label's values and the longest of each varying feature. `remake` gives them
    afresh for each later read (a user's function, called again)."""
    scans = {split: _scan(ds, label_key, name) for split, ds in datasets.items()}
    first = next(iter(scans.values()))
    labels = np.concatenate([s.labels for s in scans.values()])
    coding = _coding(labels, cfg, f"the label of {name}", class_names)
    longest = first.longest
    for scan in scans.values():
        longest = {n: np.maximum(longest[n], scan.longest[n]) for n in longest}
    features = tuple(
        Feature(
            n,
            dtype,
            shape,
            tuple(int(d) for d in longest[n]) if None in shape else (),
        )
        for n, (dtype, shape) in first.features.items()
    )
    for feature in features:
        if feature.variable and len(feature.shape) > 1:
            raise DatasetError(
                f"feature {feature.name!r} of {name} varies in shape "
                f"({_shape_text(feature.shape)}, up to {_shape_text(feature.max_shape)}); "
                "tfscale pads only 1-D sequences to the longest",
                "give it one shape in your pipeline (resize or pad it there)",
            )

    def read(split: str | None) -> Iterator[Chunk]:
        return _numpy_chunks((remake() if remake else datasets)[split], label_key, name)

    labels_by_split = {split: scan.labels for split, scan in scans.items()}
    return _source(name, version, features, coding, labels_by_split, cfg, read)


def _shape_text(shape: tuple) -> str:
    return "x".join("?" if d is None else str(d) for d in shape)


class _Scan:
    def __init__(self, features: dict[str, tuple[str, tuple]], labels, longest):
        self.features, self.labels, self.longest = features, labels, longest


def _scan(ds: Any, label_key: str, name: str) -> _Scan:
    features = _element_features(ds.element_spec, label_key, name)
    longest = {n: np.zeros(len(shape), np.int64) for n, (_, shape) in features.items()}
    labels = []
    for rows, raw in _numpy_chunks(ds, label_key, name):
        labels.append(raw)
        for n, (_, shape) in features.items():
            if None in shape:
                for value in rows[n]:
                    longest[n] = np.maximum(longest[n], np.shape(value))
    if not labels:
        raise DatasetError(f"{name} gave no examples", "return a dataset with examples")
    return _Scan(features, np.concatenate(labels), longest)


def _element_features(element: Any, label_key: str, name: str) -> dict[str, tuple[str, tuple]]:
    import tensorflow as tf

    inputs = _inputs_of(element, label_key, name)
    out = {}
    for key, spec in inputs.items():
        if not isinstance(spec, tf.TensorSpec):
            raise DatasetError(
                f"feature {key!r} of {name} is a {type(spec).__name__}; tfscale stores tensors",
                "give each feature as a dense tensor (a ragged one: .to_tensor() or pad it)",
            )
        numeric = spec.dtype != tf.string
        dtype = _dtype_name(np.dtype(spec.dtype.as_numpy_dtype)) if numeric else "string"
        out[key] = (dtype, tuple(spec.shape.as_list()))
    return out


def _inputs_of(element: Any, label_key: str, name: str) -> dict[str, Any]:
    """The features' part of an element (a dict by name), in the element's order."""
    if isinstance(element, dict):
        if label_key not in element:
            raise DatasetError(
                f"{name} gives dicts of {', '.join(element)}, with no label {label_key!r}",
                "name the label's key with --label (prepare.label), or give (features, label)",
            )
        return flat({k: v for k, v in element.items() if k != label_key})
    if isinstance(element, tuple) and len(element) == 2:
        features = element[0]
        if isinstance(element[1], dict):
            raise DatasetError(
                f"{name} gives a dict of labels ({', '.join(element[1])}); tfscale trains "
                "on one label",
                "give one label (a model of one output), or one tensor of their values",
            )
        return flat(features) if isinstance(features, dict) else {"x": features}
    if isinstance(element, tuple) and len(element) == 3:
        raise DatasetError(
            f"{name} gives (features, label, sample_weight) triples; tfscale does not carry "
            "sample weights into its shards yet, and would train without them",
            "give (features, label) pairs to train unweighted, or train it with model.fit",
        )
    raise DatasetError(
        f"{name} gives elements of {type(element).__name__}, not (features, label) or a dict",
        "return a dataset of (features, label) pairs, or of dicts with the label under --label",
    )


def _numpy_chunks(ds: Any, label_key: str, name: str) -> Iterator[tuple[dict[str, Any], Any]]:
    """The dataset's examples as chunks of numpy rows: batched where every shape is fixed,
    else collected one example at a time (varying lengths kept as a list of arrays)."""
    import tensorflow as tf

    specs = tf.nest.flatten(ds.element_spec)
    fixed = all(s.shape.is_fully_defined() for s in specs if isinstance(s, tf.TensorSpec))
    if fixed:
        for element in ds.batch(_CHUNK_ROWS).as_numpy_iterator():
            yield _parts(element, label_key)
        return
    rows: list[dict[str, Any]] = []
    raws: list[Any] = []
    for element in ds.as_numpy_iterator():
        features, raw = _parts(element, label_key)
        rows.append(features)
        raws.append(raw)
        if len(rows) == _CHUNK_ROWS:
            yield _stack(rows), np.asarray(raws)
            rows, raws = [], []
    if rows:
        yield _stack(rows), np.asarray(raws)


def _parts(element: Any, label_key: str) -> tuple[dict[str, Any], Any]:
    if isinstance(element, dict):
        features = flat({k: v for k, v in element.items() if k != label_key})
        return features, element[label_key]
    features, label = element
    return (flat(features) if isinstance(features, dict) else {"x": features}), label


def flat(features: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts of features as one, named `outer/inner`."""
    out = {}
    for key, value in features.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _stack(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for name in rows[0]:
        values = [row[name] for row in rows]
        if all(np.shape(v) == np.shape(values[0]) for v in values):
            out[name] = np.stack(values) if np.ndim(values[0]) else np.asarray(values)
        else:
            column = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                column[i] = value
            out[name] = column
    return out
