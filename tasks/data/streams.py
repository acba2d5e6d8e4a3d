"""Every source, read as a stream of chunks (`Source`): an image source's (`digits`,
`synthetic`, an image folder, a tensorflow-datasets set of images and classes) and the
user's (a table, arrays, a tf.data pipeline: `StreamSource`).

A stream source reads its rows in order, a chunk (a dict of feature arrays and the labels)
at a time, so a table of any size is written with bounded memory. Where the source has no
test split of its own, each row's split comes from a seeded draw made once over the labels
(stratified where the label is a class), so the rows of a split are the same every time.
A shard asks for its split's rows `[start, stop)`; shards are written in order, so each
split is read once, front to back, and a resumed prepare skips what it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tfscale.tasks.core.label_kinds import comparable, is_zero_one, one_hot_indices, read_kind
from tfscale.tasks.data.spec import FeatureSpec, Label

Chunk = tuple[dict[str, Any], np.ndarray]  # features by name (a row each), labels
# the key a chunk holds each example's weight under, beside its features (no name a user
# gives a column, an array or a pipeline's key holds a NUL), so that every cut of a chunk's
# rows cuts the weights with them; the spec's features never list it
WEIGHT = "\x00sample_weight"


def weights_of(values: Any, where: str) -> np.ndarray:
    """A chunk's weights as float32, one per example, as Keras's `fit(sample_weight=)`
    takes them.

    Raises:
        ValueError: a weight that is not a finite number >= 0, or more than one per
            example, naming `where` they came from.
    """
    array = np.asarray(values)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{where} holds {array.dtype} values, not numbers")
    flat = array.reshape(len(array), -1) if array.ndim else array.reshape(1, 1)
    if flat.shape[1] != 1:
        raise ValueError(f"{where} holds {flat.shape[1]} values per example, not one weight")
    weights = flat[:, 0].astype(np.float64)
    bad = ~np.isfinite(weights) | (weights < 0)
    if bad.any():
        raise ValueError(
            f"{where} holds {int(bad.sum())} weight(s) that are not a finite number >= 0 "
            f"(the first: {weights[bad][0]!r})"
        )
    return weights.astype(np.float32)


class Source(Protocol):
    """What `prepare` writes into shards: the split's rows `[start, stop)` in chunks, any
    range on its own (shards are written, and resumed, independently, in bounded memory).
    `named_label`: its label is the one the config names (`prepare.label`: a table's
    column, an array's or a pipeline's key), not an image source's class."""

    name: str
    version: str
    spec: FeatureSpec
    splits: dict[str, int]
    named_label: bool

    def batches(self, split: str, start: int, stop: int) -> Iterator[Chunk]: ...


def add_to_digest(digest: Any, features: dict[str, Any]) -> None:
    """A chunk's feature values, in order, into `digest` (a `hashlib` hash): two reads
    that gave the same values in the same chunks give the same digest."""
    for values in features.values():  # by position: a lone image array is renamed
        array = np.asarray(values) if not isinstance(values, list) else None
        if array is not None and array.dtype != object:
            digest.update(np.ascontiguousarray(array).tobytes())
            continue
        for value in values:  # text or sequences of varying length, one per example
            digest.update(value if isinstance(value, bytes) else np.asarray(value).tobytes())


def rows_of(features: dict[str, Any], index: Any) -> dict[str, Any]:
    return {name: values[index] for name, values in features.items()}


@dataclass
class StreamSource:
    """A source read front to back in chunks, per split.

    `read(split)` yields the split's chunks in order (a source with its own splits), or
    `read(None)` the whole stream, split by `test_rows` (a bool per row: held out).
    """

    named_label = True  # the config names it (`Source`)

    name: str
    version: str
    spec: FeatureSpec
    splits: dict[str, int]
    read: Callable[[str | None], Iterator[Chunk]]
    test_rows: np.ndarray | None = None
    _cursors: dict[str, _Cursor] = field(default_factory=dict, repr=False)

    def batches(self, split: str, start: int, stop: int) -> Iterator[Chunk]:
        """The split's rows `[start, stop)`, in chunks."""
        cursor = self._cursors.get(split)
        if cursor is None or cursor.position > start:
            cursor = self._cursors[split] = _Cursor(self._split_chunks(split))
        yield from cursor.take(start, stop)

    def _split_chunks(self, split: str) -> Iterator[Chunk]:
        if self.test_rows is None:
            yield from self.read(split)
            return
        held_out, row = split == "test", 0
        for features, labels in self.read(None):
            keep = self.test_rows[row : row + len(labels)] == held_out
            row += len(labels)
            if keep.all():
                yield features, labels
            elif keep.any():
                yield rows_of(features, keep), labels[keep]


class _Cursor:
    """Where a split's reading stands, so consecutive shards read on from there."""

    def __init__(self, chunks: Iterator[Chunk]):
        self.chunks, self.position = chunks, 0
        self.pending: Chunk | None = None

    def take(self, start: int, stop: int) -> Iterator[Chunk]:
        while self.position < stop:
            if self.pending is None:
                self.pending = next(self.chunks, None)
                if self.pending is None:
                    return
            features, labels = self.pending
            n = len(labels)
            lo, hi = max(start - self.position, 0), min(stop - self.position, n)
            if lo < hi:
                yield rows_of(features, slice(lo, hi)), labels[lo:hi]
            if hi < n:
                self.pending = (rows_of(features, slice(hi, n)), labels[hi:n])
                self.position += hi
            else:
                self.pending, self.position = None, self.position + n


def test_rows(labels: np.ndarray, fraction: float, seed: int, stratify: bool) -> np.ndarray:
    """A seeded held-out draw over the rows: a bool per row, `fraction` of them True,
    stratified by `labels` where asked and every class has two rows or more."""
    from sklearn.model_selection import train_test_split

    n = len(labels)
    counts = np.unique(labels, return_counts=True)[1] if stratify else np.array([])
    by = labels if stratify and counts.min(initial=2) >= 2 else None
    try:
        _, test = train_test_split(np.arange(n), test_size=fraction, random_state=seed, stratify=by)
    except ValueError:  # fewer held-out rows than classes: a plain seeded draw
        _, test = train_test_split(np.arange(n), test_size=fraction, random_state=seed)
    mask = np.zeros(n, dtype=bool)
    mask[test] = True
    return mask


@dataclass(frozen=True)
class LabelCoding:
    """The label (its kind, and why it was read so: `Label.read_as`) and how its raw
    values become what the shards store: class and binary values become indices into their
    sorted distinct values (or are indices already, with names given; or one-hot rows,
    their index); others are stored as they are."""

    label: Label
    values: np.ndarray | None = None  # sorted distinct raw values, for class and binary
    one_hot: bool = False

    def encode(self, raw: np.ndarray) -> np.ndarray:
        if self.label.kind == "regression":
            return np.asarray(raw, np.float32)
        if self.one_hot:
            return one_hot_indices(raw)
        if self.label.kind == "multi_label" or self.values is None:  # indices already
            return np.asarray(raw, np.int64)
        return np.searchsorted(self.values, comparable(raw)).astype(np.int64)


def label_coding(
    raw: np.ndarray, kind: str, what: str, class_names: tuple[str, ...] = ()
) -> LabelCoding:
    """The label's coding from all its raw values (`kind` auto, read by
    `tasks.core.label_kinds.read_kind`, or one of its `LABEL_KINDS`).

    Raises:
        ValueError: the values cannot be of the kind asked for, saying why (`what` names
            the label in the message).
    """
    shape = tuple(raw.shape[1:])
    numeric = raw.dtype.kind in "biuf"
    why = "as asked"
    if kind == "auto":
        kind, why = _named_kind(class_names) if class_names else read_kind(raw)
    if kind == "regression":
        if not numeric:
            raise ValueError(f"{what} holds text; a real-valued label needs numbers")
        return LabelCoding(Label("regression", shape, read_as=why))
    zero_one = numeric and is_zero_one(raw)
    if kind == "multi_label":
        if not shape or not zero_one:
            raise ValueError(f"{what} is not a 0/1 vector per example, as multi_label needs")
        return LabelCoding(Label("multi_label", shape, read_as=why))
    if shape and kind == "class" and zero_one and len(shape) == 1:  # one-hot rows
        names = tuple(str(i) for i in range(shape[0]))
        return LabelCoding(Label("class", (), names, read_as=why), one_hot=True)
    if shape:
        raise ValueError(
            f"{what} has shape {shape} per example; a {kind} label is one value per example"
        )
    if class_names and numeric and raw.dtype.kind != "f":
        names = tuple(class_names)
        if kind == "binary" and len(names) != 2:
            raise ValueError(f"{what} has {len(names)} classes; binary needs 2")
        return LabelCoding(Label(kind, (), names, read_as=why))
    values = np.unique(comparable(raw))
    if kind == "binary" and len(values) != 2:
        raise ValueError(f"{what} has {len(values)} distinct values; binary needs 2")
    names = tuple(_name(v) for v in values)
    return LabelCoding(Label(kind, (), names, read_as=why), values)


def _named_kind(class_names: tuple[str, ...]) -> tuple[str, str]:
    """The kind of a label whose classes the source names (a tensorflow-datasets set's)."""
    if len(class_names) == 2:
        return "binary", f"classes {class_names[0]} and {class_names[1]}"
    return "class", f"{len(class_names)} named classes"


def _name(value: Any) -> str:
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)
