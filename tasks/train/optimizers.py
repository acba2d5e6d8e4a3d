"""The optimizer a training updates its model with: tfscale's Adam (`FusedAdam`) for the
built-in models and for a user's model that is not compiled or is compiled with Adam; a
user's compiled optimizer of any other class as it is (its own update, with the gradient
noise scale recorded at its all-reduce: `NoiseAtAllReduce`).

Either way the rate warms up from the base rate to the scaled one (`make_warmup_schedule`):
the base is the compiled optimizer's rate, or `train.learning_rate`. A compiled optimizer
whose rate is a schedule keeps its schedule, unscaled.
"""

from __future__ import annotations

from typing import Any

import keras

from tfscale.tasks.train.steps import FusedAdam, NoiseAtAllReduce

_RECORDING: dict[type, type] = {}


def compiled_optimizer(model: Any) -> Any:
    """The optimizer the user compiled the model with (unwrapped from a loss scaler), or
    None."""
    optimizer = getattr(model, "optimizer", None) if getattr(model, "compiled", False) else None
    return getattr(optimizer, "inner_optimizer", optimizer)


def base_rate(compiled: Any, default: float) -> float | None:
    """The rate a training scales from: the compiled optimizer's (None where it is a
    schedule), else `default`."""
    if compiled is None:
        return default
    rate = getattr(compiled, "_learning_rate", None)
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return None
    return float(keras.ops.convert_to_numpy(compiled.learning_rate))


def make_optimizer(compiled: Any, learning_rate: Any) -> Any:
    """A fresh optimizer of the compiled one's class and settings (Adam: `FusedAdam`; none:
    `FusedAdam` with Keras's defaults), at `learning_rate` (a rate or a schedule)."""
    if compiled is None:
        return FusedAdam(learning_rate)
    config = compiled.get_config()
    if learning_rate is not None:
        config["learning_rate"] = learning_rate
    cls = type(compiled)
    if cls is keras.optimizers.Adam:
        cls = FusedAdam
    elif not issubclass(cls, NoiseAtAllReduce):
        cls = recording(cls)
    return cls.from_config(config)


def recording(cls: type) -> type:
    """`cls` with the gradient noise scale recorded at its all-reduce."""
    if cls not in _RECORDING:
        _RECORDING[cls] = type(cls.__name__, (NoiseAtAllReduce, cls), {})
    return _RECORDING[cls]


def describe(optimizer: Any) -> str:
    """`SGD (momentum 0.9)`, `AdamW`, `Adam`: what the training updates with."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    name = "Adam" if isinstance(inner, FusedAdam) else type(inner).__name__
    momentum = getattr(inner, "momentum", 0.0)
    return f"{name} (momentum {momentum:g})" if momentum else name
