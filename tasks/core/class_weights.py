"""Class weights as Keras's `fit(class_weight=)` applies them: each training example's loss
times its class's weight, reduced as Keras reduces a weighted loss (the weighted sum over
the batch's examples, divided by their count), the held-out loss and metrics unweighted.

`train.class_weight` is `none`, `balanced` (scikit-learn's: the training examples over the
classes times the class's own count) or `class=weight` pairs, by class name or index; a
class not named keeps 1, as in Keras. `parsed` reads the setting; `resolved` gives each
class's weight, indexed by class id, for a label's classes and their training counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tfscale.tasks.core.errors import UsageError

FORM = "none, balanced, or class=weight pairs such as 'cat=2,dog=0.5'"


def parsed(setting: str) -> str | dict[str, float]:
    """`none`, `balanced`, or the pairs as {class: weight}.

    Raises:
        ValueError: not one of those, or a weight that is not a finite number >= 0.
    """
    text = setting.strip()
    if text in ("none", "balanced"):
        return text
    pairs: dict[str, float] = {}
    for part in text.split(","):
        name, equals, weight = part.partition("=")
        name = name.strip()
        if not equals or not name:
            raise ValueError(f"expected {FORM}")
        try:
            value = float(weight)
        except ValueError:
            raise ValueError(f"the weight of {name!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"the weight of {name!r} must be a finite number >= 0")
        if name in pairs:
            raise ValueError(f"{name!r} is given twice")
        pairs[name] = value
    return pairs


def resolved(setting: str, kind: str, names: Sequence[str], counts: Sequence[int] = ()) -> tuple:
    """Each class's weight, by class id, for `setting` (`parsed`) on a label of `kind` whose
    classes are `names`, seen `counts` times in the training split (read only for
    `balanced`); () for none.

    Raises:
        UsageError: a label of another kind than class or binary; a class named that the
            label does not have; `balanced` with a class of no training example.
    """
    form = parsed(setting)
    if form == "none":
        return ()
    if kind not in ("class", "binary"):
        raise UsageError(
            f"train.class_weight {setting}: the label is {kind}, and class weights weigh classes",
            "leave train.class_weight none (--class-weight none), or prepare the label as a "
            "class with --label-kind class",
        )
    if form == "balanced":
        empty = [name for name, count in zip(names, counts, strict=True) if not count]
        if empty:
            raise UsageError(
                f"train.class_weight balanced: class {', '.join(empty)} has no training "
                "example, so no balanced weight",
                "give its weight by name (--class-weight NAME=W,...), or add examples of it",
            )
        total = sum(counts)
        return tuple(total / (len(names) * count) for count in counts)
    weights = [1.0] * len(names)
    for name, weight in form.items():
        index = _index(name, names)
        if index is None:
            raise UsageError(
                f"train.class_weight: the label has no class {name!r}; its classes are "
                f"{', '.join(names)}",
                f"name a class by its name or its index (0 to {len(names) - 1}) in --class-weight",
            )
        weights[index] = weight
    return tuple(weights)


def _index(name: str, names: Sequence[str]) -> int | None:
    if name in names:
        return list(names).index(name)
    if name.isdigit() and int(name) < len(names):
        return int(name)
    return None


def said(weights: Sequence[float], names: Sequence[str]) -> str:
    """`benign 0.79, malignant 1.37`."""
    return ", ".join(f"{n} {w:.3g}" for n, w in zip(names, weights, strict=True))


def shown(weights: Sequence[float]) -> str:
    """The weights a training took, by class index (`0=1.34,1=0.798`), or none."""
    return ",".join(f"{i}={w:.4g}" for i, w in enumerate(weights)) or "none"
