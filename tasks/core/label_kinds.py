"""The kinds of label, and every rule that follows from a label's kind, in one place: how a
label's values are read as a kind (`read_kind`), what a training minimises and reports
for it, and how its values are stored.

| kind          | values                      | loss                   | reported  | target  |
|---------------|-----------------------------|------------------------|-----------|---------|
| `class`       | an integer class index      | sparse cross-entropy   | accuracy  | accuracy|
| `binary`      | 0 or 1                      | binary cross-entropy   | accuracy  | AUC     |
| `multi_label` | a 0/1 vector, one per label | binary cross-entropy   | accuracy  | accuracy|
| `regression`  | real values                 | mean squared error     | MAE       | MAE     |

MAE: mean absolute error, lower is better. While training, a binary label's held-out score
is its accuracy (AUC needs every prediction at once); `tfscale evaluate` reports its AUC
as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class LabelKind:
    """One kind's rules: the loss a model of it is trained with by default, the held-out
    metric it is judged by by default (and whether lower is better for it), the score a
    training reports of its batches and epochs, and how its values are stored."""

    loss: str
    metric: str
    lower_is_better: bool
    score: str
    stored: str  # "int64" or "float32"


KINDS = {
    "class": LabelKind("sparse_categorical_crossentropy", "accuracy", False, "accuracy", "int64"),
    "binary": LabelKind("binary_crossentropy", "auc", False, "accuracy", "int64"),
    "multi_label": LabelKind("binary_crossentropy", "accuracy", False, "accuracy", "int64"),
    "regression": LabelKind(
        "mean_squared_error", "mean_absolute_error", True, "mean_absolute_error", "float32"
    ),
}
LABEL_KINDS = tuple(KINDS)
SCORES = tuple(dict.fromkeys(kind.score for kind in KINDS.values()))  # what epochs report

MAX_CLASSES = 256  # integer labels of more distinct values than this are real values
ROWS_PER_CLASS = 5  # ... and so are those of fewer rows per distinct value than this
FEW_VALUES = 10  # integer labels of this many distinct values or fewer are always classes
CHANGE = "--label-kind (prepare.label_kind) to change"


def read_kind(raw: np.ndarray) -> tuple[str, str]:
    """The kind a label's values are read as, and why, in a few words (for the prepare
    line: `binary (0/1 floats)`):

    - a vector per example: one-hot rows (0/1, exactly one 1) are classes; other 0/1
      vectors multi-label; other numbers real values;
    - one value per example: two distinct values (numbers, 0./1. floats included, or
      text) are binary; other floats are real values; text is classes; integers are
      classes where they have at most `FEW_VALUES` distinct values, or at most
      `MAX_CLASSES` with `ROWS_PER_CLASS` rows or more per value on average; else real
      values (a count, an age, a price in whole units).
    """
    shape = tuple(raw.shape[1:])
    numeric = raw.dtype.kind in "biuf"
    if shape:
        zero_one = numeric and is_zero_one(raw)
        if zero_one and len(raw) and bool((raw.reshape(len(raw), -1).sum(axis=1) == 1).all()):
            return "class", f"one-hot rows of {int(np.prod(shape))}"
        if zero_one:
            return "multi_label", f"0/1 vectors of {int(np.prod(shape))}"
        return "regression", "vectors of numbers"
    distinct = len(np.unique(comparable(raw)))
    if distinct == 2:
        return "binary", "0/1" if numeric and is_zero_one(raw) else "two values"
    if not numeric:
        return "class", f"{distinct} text values"
    if raw.dtype.kind == "f" and not _whole(raw):
        return "regression", "real numbers"
    few = distinct <= FEW_VALUES
    if few or (distinct <= MAX_CLASSES and len(raw) >= ROWS_PER_CLASS * distinct):
        return "class", f"{distinct} integer values"
    return "regression", f"{distinct} integer values over {len(raw)} rows"


def is_zero_one(raw: np.ndarray) -> bool:
    """Every value 0 or 1 (numbers only)."""
    return bool(np.isin(raw, (0, 1)).all())


def _whole(raw: np.ndarray) -> bool:
    """Floats that are all whole numbers (`3.0`): integers a table or array stored as floats."""
    return bool(np.all(np.isfinite(raw)) and np.all(np.floor(raw) == raw))


def comparable(raw: np.ndarray) -> np.ndarray:
    """Values that sort and compare: text (bytes decoded) as str, numbers as they are."""
    if raw.dtype == object or raw.dtype.kind in "SU":
        return np.array([v.decode() if isinstance(v, bytes) else str(v) for v in raw])
    return raw


def one_hot_indices(raw: np.ndarray) -> np.ndarray:
    """One-hot rows as their class indices."""
    return np.asarray(raw).reshape(len(raw), -1).argmax(axis=1).astype(np.int64)


def describe(kind: str, why: str = "") -> str:
    """`binary (0/1); --label-kind (prepare.label_kind) to change`."""
    return f"{kind}{f' ({why})' if why else ''}; {CHANGE}"


def mismatch_fix(kind: str, what: Any = "") -> str:
    """The fix for a model or loss that does not fit the label's kind: the kind first (the
    data may be read as the wrong kind), then the model."""
    return (
        f"if the label is not {kind}, prepare it as what it is with --label-kind "
        f"(prepare.label_kind); else {what or f'compile the model with a {KINDS[kind].loss} loss'}"
    )
