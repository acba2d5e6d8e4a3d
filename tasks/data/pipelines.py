"""A tf.data pipeline as a source: the user's function (`package.module:function` or
`path/to/file.py:function`) returning a finite `tf.data.Dataset`, or one per split; and the
adapter any tf.data datasets go through (`datasets_source`: a tensorflow-datasets set whose
examples are not one image and a class too), read as a stream (`tasks.data.streams`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tfscale.tasks.core.user_code import called, load_function
from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.data.spec import Feature
from tfscale.tasks.data.streams import WEIGHT, Chunk, StreamSource, add_to_digest
from tfscale.tasks.data.user_sources import (
    CHUNK_ROWS,
    Reader,
    dtype_name,
    label_coding_of,
    stream_source,
)
from tfscale.tasks.settings.config import PrepareConfig


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

    made = called(function, (), cfg.dataset, "dataset", DatasetError)
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
    coding = label_coding_of(labels, cfg, f"the label of {name}", class_names)
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
    digests = {split: scan.digest for split, scan in scans.items()}
    weight = _weight_of(next(iter(datasets.values())).element_spec)
    reader = Reader(read, digests, weight)
    return stream_source(name, version, features, coding, labels_by_split, cfg, reader)


def _shape_text(shape: tuple) -> str:
    return "x".join("?" if d is None else str(d) for d in shape)


class _Scan:
    def __init__(self, features: dict[str, tuple[str, tuple]], labels, longest, digest):
        self.features, self.labels, self.longest = features, labels, longest
        self.digest = digest  # of its features' values, as read (`streams.add_to_digest`)


def _scan(ds: Any, label_key: str, name: str) -> _Scan:
    features = _element_features(ds.element_spec, label_key, name)
    longest = {n: np.zeros(len(shape), np.int64) for n, (_, shape) in features.items()}
    labels, digest = [], hashlib.sha256()
    for rows, raw in _numpy_chunks(ds, label_key, name):
        labels.append(raw)
        add_to_digest(digest, rows)
        for n, (_, shape) in features.items():
            if None in shape:
                for value in rows[n]:
                    longest[n] = np.maximum(longest[n], np.shape(value))
    if not labels:
        raise DatasetError(f"{name} gave no examples", "return a dataset with examples")
    return _Scan(features, np.concatenate(labels), longest, digest.hexdigest())


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
        dtype = dtype_name(np.dtype(spec.dtype.as_numpy_dtype)) if numeric else "string"
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
    if isinstance(element, tuple) and len(element) == 3:  # weighed as fit weighs them
        return _inputs_of(element[:2], label_key, name)
    raise DatasetError(
        f"{name} gives elements of {type(element).__name__}, not (features, label), "
        "(features, label, sample_weight) or a dict",
        "return a dataset of (features, label) pairs, or of dicts with the label under --label",
    )


def _weight_of(element: Any) -> str:
    """What each example's weight comes from in a pipeline's elements: their third part
    ((features, label, sample_weight), as `fit` takes them); empty: none."""
    return (
        "(the third part of each element)"
        if isinstance(element, tuple) and len(element) == 3
        else ""
    )


def _numpy_chunks(ds: Any, label_key: str, name: str) -> Iterator[tuple[dict[str, Any], Any]]:
    """The dataset's examples as chunks of numpy rows: batched where every shape is fixed,
    else collected one example at a time (varying lengths kept as a list of arrays)."""
    import tensorflow as tf

    specs = tf.nest.flatten(ds.element_spec)
    fixed = all(s.shape.is_fully_defined() for s in specs if isinstance(s, tf.TensorSpec))
    if fixed:
        for element in ds.batch(CHUNK_ROWS).as_numpy_iterator():
            yield _parts(element, label_key)
        return
    rows: list[dict[str, Any]] = []
    raws: list[Any] = []
    for element in ds.as_numpy_iterator():
        features, raw = _parts(element, label_key)
        rows.append(features)
        raws.append(raw)
        if len(rows) == CHUNK_ROWS:
            yield _stack(rows), np.asarray(raws)
            rows, raws = [], []
    if rows:
        yield _stack(rows), np.asarray(raws)


def _parts(element: Any, label_key: str) -> tuple[dict[str, Any], Any]:
    if isinstance(element, dict):
        features = flat({k: v for k, v in element.items() if k != label_key})
        return features, element[label_key]
    features, label = element[:2]
    features = flat(features) if isinstance(features, dict) else {"x": features}
    if len(element) == 3:
        features[WEIGHT] = element[2]
    return features, label


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
