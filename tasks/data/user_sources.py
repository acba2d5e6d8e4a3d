"""What the user's own data shares as stream sources (`tasks.data.streams`): which files
are theirs, the label's coding, blanks checked (`tasks.data.blanks`), and the split by a
seeded draw. Each kind has its module: a table (`.csv`, `.parquet`: `tasks.data.tables`),
arrays (`.npz`: `tasks.data.arrays`), a tf.data pipeline (`package.module:function` or
`path/to/file.py:function`) and any tensorflow-datasets set whose examples are not one
image and a class (`tasks.data.pipelines`); `tasks.data.preparation.open_source` picks it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfscale.tasks.core.user_code import fingerprint, is_function_ref
from tfscale.tasks.data.blanks import checked
from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.data.spec import IMAGE, Feature, FeatureSpec
from tfscale.tasks.data.streams import (
    WEIGHT,
    Chunk,
    LabelCoding,
    StreamSource,
    label_coding,
    test_rows,
    weights_of,
)
from tfscale.tasks.settings.config import PrepareConfig

TABLE_SUFFIXES = (".csv", ".parquet")
ARRAY_SUFFIXES = (".npz",)
CHUNK_ROWS = 4096  # a pipeline's examples are taken this many at a time


def is_user_file(dataset: str) -> bool:
    return Path(dataset).suffix.lower() in TABLE_SUFFIXES + ARRAY_SUFFIXES


def file_version(path: Path) -> str:
    from tfscale.tasks.data.manifest import sha256_of

    return sha256_of(path)[:16]


def label_coding_of(raw: np.ndarray, cfg: PrepareConfig, what: str, names=()) -> LabelCoding:
    try:
        return label_coding(raw, cfg.label_kind, what, names)
    except ValueError as exc:
        raise DatasetError(
            str(exc), "set --label-kind (prepare.label_kind) to what the label is, or auto"
        ) from None


@dataclass(frozen=True)
class Reader:
    """How a stream source's rows are read: `read(split)` gives its chunks of raw labels,
    by the source's own splits or (`None`) one stream to be split; `digests`, each stream's
    features' digest on its first read (`streams.add_to_digest`), where a later read might
    differ (a pipeline's); `weight`, what each example's weight comes from (a column, an
    array, a pipeline's third part), which the chunks hold under `WEIGHT`; empty: none."""

    read: Callable[[str | None], Iterator[Chunk]]
    digests: dict[str | None, str] | None = None
    weight: str = ""


def stream_source(
    name: str,
    version: str,
    features: tuple[Feature, ...],
    coding: LabelCoding,
    labels: dict[str | None, np.ndarray],
    cfg: PrepareConfig,
    reader: Reader,
) -> StreamSource:
    """The stream source of `features` and the label `coding` encodes, read by `reader`;
    `labels`, its raw labels by stream, which a one-stream source is split by (a seeded
    draw). A lone array of images takes the name `image` (`named_features`)."""
    read, weight = reader.read, reader.weight
    spec = FeatureSpec(named_features(features, coding.label.kind), coding.label, weight=weight)
    _refuse_same_keras_names(name, spec)
    rename = {old.name: new.name for old, new in zip(features, spec.features, strict=True)}
    rename[WEIGHT] = WEIGHT

    def chunks(split: str | None) -> Iterator[Chunk]:
        for rows, raw in read(split):
            out = {rename[n]: v for n, v in rows.items()}
            if weight:
                out[WEIGHT] = _weights(out.get(WEIGHT), name, weight)
            yield out, coding.encode(raw)

    _refuse_one_class(name, coding, labels)
    encoded = {split: coding.encode(raw) for split, raw in labels.items()}
    if None in encoded and len(encoded[None]) < 2:
        raise DatasetError(
            f"{name} has {len(encoded[None])} example(s); a training and a held-out split need "
            "2 or more",
            "give it more rows",
        )
    spec, chunks, encoded = checked(
        name,
        spec,
        chunks,
        encoded,
        cfg.missing,
        lambda rows: ~held_out_rows(spec, rows, cfg),
        reader.digests or {},
    )
    if None in encoded:
        return split_stream(name, version, spec, encoded[None], cfg, chunks)
    splits = {split: len(raw) for split, raw in encoded.items()}
    return StreamSource(name, version, spec, splits, chunks)


def _weights(values: Any, name: str, weight: str) -> np.ndarray:
    """A chunk's weights, checked (`streams.weights_of`).

    Raises:
        DatasetError: none given, or a weight Keras's fit would not take, naming it.
    """
    where = f"{name}: the sample weight {weight}"
    if values is None:
        raise DatasetError(f"{where} is missing from an example", "give every example its weight")
    try:
        return weights_of(values, where)
    except ValueError as exc:
        raise DatasetError(
            str(exc), f"give every example a weight >= 0 in {weight} (1: as unweighted)"
        ) from None


def _refuse_one_class(name: str, coding: LabelCoding, raw: dict) -> None:
    """A class or binary label of one value teaches nothing (loss 0, accuracy 1).

    Raises:
        DatasetError: the label has one value over every split, naming it.
    """
    if coding.label.kind not in ("class", "binary") or not raw:
        return
    values = np.concatenate([np.asarray(v).reshape(len(v), -1) for v in raw.values()])
    if len(values) == 0 or (values != values[0]).any():
        return
    shown = values[0].tolist()
    shown = shown[0] if len(shown) == 1 else shown
    raise DatasetError(
        f"{name}: every example has the same label ({shown!r}): a model learns nothing "
        "from it (loss 0, accuracy 1)",
        "give examples of two classes or more, or check --label",
    )


def _refuse_same_keras_names(name: str, spec: FeatureSpec) -> None:
    """Two features whose names Keras takes as one (`a b` and `a/b` are both `a_b` as an
    input's name) would be one input of a model keyed by Keras's names.

    Raises:
        DatasetError: naming both features and the name they share.
    """
    seen: dict[str, str] = {}
    for feature in spec.features:
        other = seen.setdefault(feature.keras_name, feature.name)
        if other != feature.name:
            raise DatasetError(
                f"{name}: features {other!r} and {feature.name!r} are both "
                f"{feature.keras_name!r} as Keras names an input (it takes letters, digits, "
                "_, . and - only)",
                f"rename one of {other!r} and {feature.name!r} in the data",
            )


def held_out_rows(spec: FeatureSpec, labels: np.ndarray, cfg: PrepareConfig) -> np.ndarray:
    """The held-out rows of a stream split by a seeded draw, stratified by a class label."""
    stratify = spec.label.kind in ("class", "binary")
    return test_rows(labels, cfg.test_fraction, cfg.seed, stratify)


def split_stream(
    name: str, version: str, spec: FeatureSpec, labels: np.ndarray, cfg: PrepareConfig, read
) -> StreamSource:
    """A one-stream source split by a seeded, stratified draw over its `labels`."""
    held_out = held_out_rows(spec, labels, cfg)
    splits = {"test": int(held_out.sum()), "train": int((~held_out).sum())}
    return StreamSource(name, version, spec, splits, read, held_out)


def named_features(features: tuple[Feature, ...], kind: str) -> tuple[Feature, ...]:
    """A lone uint8 array of images with a class label is `image` (the image format)."""
    only = features[0]
    if len(features) == 1 and only.dtype == "uint8" and len(only.shape) == 3 and kind == "class":
        return (Feature(IMAGE, "uint8", only.shape),)
    return features


def dtype_name(dtype: np.dtype) -> str:
    if dtype.kind == "f":
        return "float32"
    if dtype.kind == "b":
        return "bool"
    if dtype == np.uint8:
        return "uint8"
    return "int32" if dtype.itemsize <= 4 else "int64"


WEIGHTS = ("sample_weight", "sample_weights", "class_weight", "class_weights")
WEIGHT_NAME = "sample_weight"  # a column or array so named is the weight unless one is named


def weight_name(path: Path, names: list[str], cfg: PrepareConfig, what: str) -> str:
    """Which of a table's columns or an .npz's arrays (`names`, the label's left out) holds
    each example's weight: the one `prepare.sample_weight` names, else one named
    `sample_weight`, as Keras names the argument; empty: none.

    Raises:
        DatasetError: the named one is not among `names`; another named as Keras's weights
            (`WEIGHTS`), which would otherwise become a feature and the training go
            unweighted.
    """
    chosen = cfg.sample_weight or (WEIGHT_NAME if WEIGHT_NAME in names else "")
    if chosen and chosen not in names:
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise DatasetError(
            f"{path}: no {what} {chosen!r} to take the sample weights from (its {what}s: {shown})",
            f"name the weights' {what} with --sample-weight (prepare.sample_weight), or leave "
            "it empty to train unweighted",
        )
    found = [name for name in names if name.lower() in WEIGHTS and name != chosen]
    if found:
        raise DatasetError(
            f"{path}: its {what} {found[0]!r} holds weights by its name; as a feature the "
            "model would train on it, and the training go unweighted",
            f"weigh each example by it with --sample-weight {found[0]} (class weights: "
            f"--class-weight), or drop the {what}",
        )
    return chosen


def source_fingerprint(cfg: PrepareConfig) -> str:
    """What the user's data is made of, for a cached prepare to key on beside the config: a
    table's or an .npz's sha256; a function's module file's (the data it reads elsewhere
    is not seen: `tfscale prepare` itself reads it afresh). Empty for the other sources."""
    from tfscale.tasks.data.manifest import sha256_of

    dataset = cfg.dataset
    if is_user_file(dataset) and Path(dataset).is_file():
        return sha256_of(Path(dataset))
    return fingerprint(dataset) if is_function_ref(dataset) else ""
