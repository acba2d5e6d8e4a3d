"""How a model takes the data's features, decided by the model's inputs, never its name: a
model of one input over a table's numeric columns takes them as one vector (what
`df.values` gives `model.fit`). Images reach every model as the spec says they are (uint8,
0-255; the built-in models scale them themselves). The manifest a training, an evaluation
or a check reads its batches through is `as_model_takes` of the model
(`tasks.data.spec.FeatureSpec.packed`), never written to the file."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfscale.tasks.data.spec import FeatureSpec


def one_input_width(model: Any) -> int | None:
    """The numbers per example of a model of one input of shape `(None, n)`; None for a
    model of several inputs, of another shape, or whose inputs are not known until called
    (a subclassed model)."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if not inputs or len(inputs) != 1:
        return None
    shape = tuple(inputs[0].shape)
    return int(shape[1]) if len(shape) == 2 and shape[1] is not None else None


def packed_features(model: Any, spec: FeatureSpec) -> tuple[str, ...]:
    """The features a model of one input of n numbers takes, where the data has several
    features and n of them are one number each (a table's numeric columns): those, in the
    data's order, as `model.fit(df.drop(columns=[label]).values, y)` gives them. Text
    columns are then left out (`check_user_model` names them). Empty otherwise: the model
    takes the features by name, or the one feature itself."""
    width = one_input_width(model)
    numbers = tuple(f.name for f in spec.numbers)
    if len(spec.features) < 2 or width is None or width != len(numbers):
        return ()
    return numbers


def keyed_by_keras_names(model: Any, spec: FeatureSpec) -> bool:
    """Whether the model's dict of inputs is keyed by Keras's names of the features (which
    Keras wants a dict's keys to be: `Feature.keras_name`) where they differ from the
    data's names (`mean radius` as `mean_radius`)."""
    structure = getattr(model, "_inputs_struct", None)
    if not isinstance(structure, dict):
        return False
    names = {f.name for f in spec.features}
    keras_names = {f.keras_name for f in spec.features}
    return names != keras_names and set(structure) == keras_names


def as_model_takes(manifest: Any, model: Any) -> Any:
    """The manifest whose batches give `model` its features as it takes them: one vector
    of the numeric features for a model of one input over them (`packed_features`), keyed
    by Keras's names for a model whose inputs are (`keyed_by_keras_names`), else as
    recorded."""
    spec = FeatureSpec.from_dict(manifest.feature)
    packed = packed_features(model, spec)
    keras_names = not packed and keyed_by_keras_names(model, spec)
    return dataclasses.replace(manifest, packed=packed, keras_names=keras_names)
