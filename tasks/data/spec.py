"""What one example holds: named features of known dtype and shape, and a label of a known
kind. The manifest records it; the shards, the input pipeline and the models read it back.
The label's kind decides the defaults a training takes for it (`tasks.core.label_kinds`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from tfscale.tasks.core.label_kinds import KINDS

IMAGE = "image"  # the feature an image source's examples hold (the original shard format)
_BYTES = {"uint8": 1, "bool": 1, "int32": 4, "int64": 8, "float32": 4, "float64": 8, "string": 32}


@dataclass(frozen=True)
class Feature:
    """One named input: its dtype (`string` for text) and its shape per example, `None`
    where it varies (`max_shape` then holds the longest seen, to which batches are padded);
    `mean`/`std` over the training split for numeric features of tables and arrays."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]
    max_shape: tuple[int, ...] = ()
    mean: float | None = None
    std: float | None = None
    blanks: int = 0  # blank cells the source had (`tasks.data.blanks`)
    missing: str = ""  # what was done with them: mean, zero (filled) or drop (the rows)
    date: bool = False  # a table's date or time stamp, stored as days since 1970-01-01

    @property
    def variable(self) -> bool:
        return None in self.shape

    @property
    def keras_name(self) -> str:
        """The name as a Keras input takes it: the feature's own, with each character
        Keras refuses in a name (`/`, spaces, ...) as `_` (`od280/od315` is `od280_od315`).
        A model whose dict of inputs is keyed by these names takes the data keyed so
        (`FeatureSpec.keras_names`); one keyed by `name`, by `name`."""
        return re.sub(r"[^0-9A-Za-z_.-]", "_", self.name)

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """The shape a batch holds per example: variable dimensions padded to the longest."""
        return tuple(self.max_shape) if self.variable else tuple(self.shape)  # type: ignore[arg-type]

    @property
    def numeric(self) -> bool:
        return self.dtype != "string"

    def example_bytes(self) -> int:
        return _BYTES.get(self.dtype, 8) * max(math.prod(self.padded_shape), 1)

    def to_dict(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape)}
        if self.variable:
            raw["max_shape"] = list(self.max_shape)
        if self.mean is not None:
            raw["mean"], raw["std"] = self.mean, self.std
        if self.blanks:
            raw["blanks"], raw["missing"] = self.blanks, self.missing
        if self.date:
            raw["date"] = True
        return raw

    @classmethod
    def from_dict(cls, name: str, raw: dict[str, Any]) -> Feature:
        return cls(
            name,
            raw["dtype"],
            tuple(raw["shape"]),
            tuple(raw.get("max_shape", ())),
            raw.get("mean"),
            raw.get("std"),
            raw.get("blanks", 0),
            raw.get("missing", ""),
            raw.get("date", False),
        )


@dataclass(frozen=True)
class Label:
    """The label: its kind (`LABEL_KINDS`), its shape per example, its class names (class,
    binary) and, for `class`, the count of classes."""

    kind: str = "class"
    shape: tuple[int, ...] = ()
    class_names: tuple[str, ...] = ()
    mean: float | None = None  # real values: over the training split
    std: float | None = None
    read_as: str = ""  # why its values were read as this kind (`label_kinds.read_kind`)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def outputs(self) -> int:
        """Units of the model's last layer: one per class, else one per label value."""
        if self.kind == "class":
            return self.num_classes
        return max(math.prod(self.shape), 1)

    @property
    def loss(self) -> str:
        return KINDS[self.kind].loss

    @property
    def metric(self) -> str:
        """The default held-out metric for this kind."""
        return KINDS[self.kind].metric

    @property
    def lower_is_better(self) -> bool:
        return KINDS[self.kind].lower_is_better

    @property
    def score(self) -> str:
        """What a training reports of its batches and held-out split as it goes, the key of
        its epochs' records: `accuracy`, or for real values `mean_absolute_error`."""
        return KINDS[self.kind].score

    @property
    def dtype(self) -> str:
        return KINDS[self.kind].stored

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "class_names": list(self.class_names),
            "num_classes": self.num_classes,
            "loss": self.loss,
            "metric": self.metric,
            "lower_is_better": self.lower_is_better,
            **({"mean": self.mean, "std": self.std} if self.mean is not None else {}),
            **({"read_as": self.read_as} if self.read_as else {}),
        }


@dataclass(frozen=True)
class FeatureSpec:
    """An example's features, in order, and its label. `packed` names the features a
    model of one input takes as one float32 vector, in that order (what `df.values` gives
    `model.fit`); empty where the model takes each feature by name (a dict), or the one
    feature itself. The model decides it (`tasks.train.user_models.as_model_takes`); the
    manifest never records it."""

    features: tuple[Feature, ...]
    label: Label = field(default_factory=Label)
    packed: tuple[str, ...] = ()
    # a model of named inputs keyed by Keras's names (`Feature.keras_name`, as Keras wants a
    # dict's keys to be its inputs' names) gets its features keyed so; else by `name`
    keras_names: bool = False
    # what each example's weight in the training loss came from (`prepare.sample_weight`: a
    # column, an array, a pipeline's third part), stored beside the label; empty: none
    weight: str = ""

    def key_of(self, feature: Feature) -> str:
        """The key a feature has in the batches the model takes."""
        return feature.keras_name if self.keras_names else feature.name

    @property
    def numbers(self) -> tuple[Feature, ...]:
        """The features of one number each (a table's numeric columns), in order: what a
        model of one input of shape `(len(spec.numbers),)` takes, as `df.values` gives
        them to `model.fit`."""
        return tuple(f for f in self.features if f.numeric and f.shape in ((), (1,)))

    @classmethod
    def image(cls, shape: tuple[int, ...], class_names: tuple[str, ...]) -> FeatureSpec:
        """A uint8 image of fixed shape and a class index: the original format, whose
        shards hold the image's raw bytes, its shape and the label."""
        return cls((Feature(IMAGE, "uint8", tuple(shape)),), Label("class", (), class_names))

    @property
    def is_image(self) -> bool:
        """One uint8 image of fixed shape and a class label (the original shard format)."""
        only = self.features[0] if len(self.features) == 1 else None
        return (
            only is not None
            and only.name == IMAGE
            and only.dtype == "uint8"
            and len(only.shape) == 3
            and not only.variable
            and self.label.kind == "class"
            and not self.weight
        )

    @property
    def shape(self) -> tuple[int, ...]:
        """The single feature's shape (an image's, or an array's)."""
        return self.features[0].padded_shape if len(self.features) == 1 else ()

    @property
    def num_classes(self) -> int:
        return self.label.num_classes

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.label.class_names

    def example_bytes(self) -> int:
        weight = 4 if self.weight else 0
        return sum(f.example_bytes() for f in self.features) + 8 * self.label.outputs + weight

    def to_dict(self) -> dict[str, Any]:
        raw = {
            "features": {f.name: f.to_dict() for f in self.features},
            "label": self.label.to_dict(),
            "num_classes": self.num_classes,
            "class_names": list(self.class_names),
        }
        if self.is_image:  # the keys image manifests always had
            raw.update(shape=list(self.shape), dtype="uint8")
        if self.weight:
            raw["sample_weight"] = self.weight
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FeatureSpec:
        if "features" not in raw:  # a manifest from before features were named: an image
            return cls.image(tuple(raw["shape"]), tuple(raw["class_names"]))
        label = raw["label"]
        return cls(
            tuple(Feature.from_dict(n, f) for n, f in raw["features"].items()),
            Label(
                label["kind"],
                tuple(label["shape"]),
                tuple(label["class_names"]),
                label.get("mean"),
                label.get("std"),
                label.get("read_as", ""),
            ),
            weight=raw.get("sample_weight", ""),
        )

    def describe(self) -> str:
        """One line: the features and the label, as the summary of a prepare shows them."""
        shown = [_describe(f) for f in self.features[:6]]
        if len(self.features) > 6:
            shown.append(f"and {len(self.features) - 6} more")
        kind = self.label.kind.replace("_", "-")
        label = f"{self.num_classes} classes" if kind == "class" else f"{kind} label"
        return f"{', '.join(shown)}; {label}"


def date_resolution_s(days: float) -> float:
    """How far a float32 count of days near `days` may be from the time it stands for,
    in seconds (half the gap between neighbouring float32 values)."""
    import numpy as np

    return float(np.spacing(np.float32(abs(days)))) * 86_400 / 2


def _describe(feature: Feature) -> str:
    dims = "x".join("?" if d is None else str(d) for d in feature.shape)
    kind = feature.dtype
    if feature.date:
        furthest = abs(feature.mean or 0.0) + 3 * (feature.std or 0.0)
        kind = f"date as days since 1970 (to +-{date_resolution_s(furthest):.0f} s)"
    return f"{feature.name} {dims + ' ' if dims else ''}{kind}"
