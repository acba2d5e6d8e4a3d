"""One pass over a user's source before anything is written: blank numeric cells (NaN)
counted per feature, then refused naming the features, or filled or dropped as
`prepare.missing` says; and the examples compared with the first read's, so a pipeline
that gives other examples each time it is read (an unseeded shuffle) is refused before its
splits could share examples.

A fill uses the training split's values only (each feature's mean over its training rows,
position by position for an array), so the held-out split tells the model nothing; the
manifest records what was filled or dropped (`Feature.blanks`, `Feature.missing`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.data.spec import FeatureSpec
from tfscale.tasks.data.streams import Chunk, add_to_digest, rows_of

Read = Callable[[str | None], Iterator[Chunk]]


@dataclass
class _Pass:
    """What the pass saw: blank cells per feature, a bool per row of each stream (any blank
    there), and the training rows' sums and counts of values per feature."""

    cells: dict[str, int]
    rows: dict[str | None, np.ndarray] = field(default_factory=dict)
    sums: dict[str, Any] = field(default_factory=dict)
    seen: dict[str, Any] = field(default_factory=dict)


def checked(
    name: str,
    spec: FeatureSpec,
    read: Read,
    labels: dict[str | None, np.ndarray],
    missing: str,
    training_rows: Callable[[np.ndarray], np.ndarray],
    digests: dict[str | None, str],
) -> tuple[FeatureSpec, Read, dict[str | None, np.ndarray]]:
    """The source's spec, reader and labels with its blanks handled (`missing`: refuse,
    mean, zero or drop). `labels` are each stream's (None: one stream to be split) as the
    first read gave them, `digests` its features' digests where taken
    (`streams.add_to_digest`); `training_rows(labels)` is the bool per row of a stream's
    training rows, where a stream is split by a draw.

    Raises:
        DatasetError: the source gives other examples than its first read did; or it has
            blank cells and `missing` is refuse, naming each feature and its count.
    """
    floats = [f.name for f in spec.features if f.dtype.startswith("float") and not f.variable]
    seen = _Pass({n: 0 for n in floats})
    for stream, first in labels.items():
        train = training_rows(first) if stream is None else np.full(len(first), stream != "test")
        again = _read_stream(name, read, stream, first, train, seen, stream in digests)
        if again is not None and again != digests[stream]:
            raise _other_examples(name, stream, "the same labels, other feature values")
    found = {n: c for n, c in seen.cells.items() if c}
    if not found:
        return spec, read, labels
    if missing == "refuse":
        shown = ", ".join(f"{n!r} {c}" for n, c in found.items())
        raise DatasetError(
            f"{name} has blank cells ({shown}), which would reach the model as NaN (a blank: "
            "empty, NaN, inf, or a number past float32's 3.4e38)",
            "fill them in the data, or say what to do with them: --missing mean or zero "
            "(filled, the mean over the training split) or drop (the rows) (prepare.missing)",
        )
    noted = tuple(
        replace(f, blanks=found[f.name], missing=missing) if f.name in found else f
        for f in spec.features
    )
    spec = replace(spec, features=noted)
    if missing == "drop":
        keep = _kept_rows(name, seen, list(found))
        return spec, _dropping(read, keep), {s: v[keep[s]] for s, v in labels.items()}
    fills = {n: _fill_value(seen, n, missing) for n in found}
    return spec, _filling(read, fills), labels


def _kept_rows(name: str, seen: _Pass, blank: list[str]) -> dict[str | None, np.ndarray]:
    """Each stream's rows without a blank, for `--missing drop`.

    Raises:
        DatasetError: dropping would leave fewer than 2 examples, or a split empty.
    """
    keep = {stream: ~rows for stream, rows in seen.rows.items()}
    left = sum(int(k.sum()) for k in keep.values())
    if left < 2 or any(not k.any() for k in keep.values()):
        raise DatasetError(
            f"{name}: --missing drop leaves {left} example(s) of "
            f"{sum(len(k) for k in keep.values())}: every row (of a split) has a blank",
            "fill them instead (--missing mean or zero), or drop the mostly blank "
            f"column(s) ({', '.join(blank)}) from the data",
        )
    return keep


def _read_stream(
    name: str,
    read: Read,
    stream: str | None,
    first: np.ndarray,
    train: np.ndarray,
    seen: _Pass,
    digested: bool,
) -> str | None:
    """One stream's pass: its blanks counted, its training rows summed, and its labels
    compared with the first read's. Returns its features' digest where `digested` (a
    first read's is there to compare it with), else None."""
    flags, labels, row = [], [], 0
    digest = hashlib.sha256() if digested else None
    for features, raw in read(stream):
        if digest is not None:
            add_to_digest(digest, features)
        count = len(raw)
        blank = np.zeros(count, bool)
        in_train = train[row : row + count]
        for feature in seen.cells:
            values = np.asarray(features[feature], np.float64).reshape(count, -1)
            nan = ~np.isfinite(values)  # a blank, an infinity, a number past float32's range
            seen.cells[feature] += int(nan.sum())
            blank |= nan.any(axis=1)
            taken = np.where(nan, 0, values)[in_train].sum(0)
            seen.sums[feature] = seen.sums.get(feature, 0) + taken
            seen.seen[feature] = seen.seen.get(feature, 0) + (~nan)[in_train].sum(0)
        flags.append(blank)
        labels.append(np.asarray(raw))
        row += count
    again = np.concatenate(labels) if labels else np.zeros(0)
    if len(again) != len(first) or not np.array_equal(again, first):
        shown = f"{len(first)} examples, then {len(again)}, their labels in another order"
        raise _other_examples(name, stream, shown)
    seen.rows[stream] = np.concatenate(flags) if flags else np.zeros(0, bool)
    return digest.hexdigest() if digest is not None else None


def _other_examples(name: str, stream: str | None, shown: str) -> DatasetError:
    where = f" (its {stream!r} split)" if stream else ""
    return DatasetError(
        f"{name}{where} gives other examples each time it is read ({shown}): its splits "
        "would share examples, or the held-out split be augmented too (an unseeded shuffle, "
        "a random map?)",
        "seed it (.shuffle(n, seed=...)) or remove it: tfscale shuffles the training split "
        "itself, seeded, each epoch; put augmentation in the model, as Keras's "
        "preprocessing layers do (keras.layers.RandomFlip, RandomRotation), active in "
        "training only",
    )


def _fill_value(seen: _Pass, feature: str, missing: str) -> np.ndarray:
    """Zero, or the mean of the training rows' values, position by position (zero where a
    position has none)."""
    sums = np.asarray(seen.sums.get(feature, 0.0), np.float64)
    if missing == "zero":
        return np.zeros_like(sums)
    counts = np.asarray(seen.seen.get(feature, 0), np.float64)
    return np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)


def _filling(read: Read, fills: dict[str, np.ndarray]) -> Read:
    def filled(split: str | None) -> Iterator[Chunk]:
        for features, labels in read(split):
            out = dict(features)
            for name, value in fills.items():
                column = np.asarray(out[name])
                flat = column.reshape(len(column), -1)
                flat = np.where(~np.isfinite(flat), value.astype(column.dtype), flat)
                out[name] = flat.reshape(column.shape).astype(column.dtype)
            yield out, labels

    return filled


def _dropping(read: Read, keep: dict[str | None, np.ndarray]) -> Read:
    def kept(split: str | None) -> Iterator[Chunk]:
        row = 0
        for features, labels in read(split):
            mask = keep[split][row : row + len(labels)]
            row += len(labels)
            if mask.all():
                yield features, labels
            elif mask.any():
                yield rows_of(features, mask), labels[mask]

    return kept
