"""Pipeline and tensor parallelism, placing the model: the stages of a cut model as models of
their own, each stage's variables on a device of its own (`build_staged`), or the widest
Dense layer split by columns across devices (`build_column_split`); the strategies that
hold those devices, and what each device holds."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.train.stage_plan import StagePlan, graph_of, plan_stages


def stage_models(model: Any, plan: StagePlan) -> list[Any]:
    """The stages as Keras models sharing `model`'s layers (and so its variables)."""
    import keras

    graph = graph_of(model)
    ops = graph.operations
    models = []
    for s, (lo, hi) in enumerate(plan.bounds):
        inputs = graph.inputs if s == 0 else ops[lo - 1].output
        models.append(keras.Model(inputs, ops[hi].output, name=f"stage_{s + 1}"))
    return models


@dataclass
class StagedDevices:
    """What a pipeline run trains on in place of a tf.distribute strategy: its stages'
    devices, its micro-batches and, once the model is built, where the model is cut.

    It answers what the training loop asks of a strategy (one replica: a pipeline holds
    one copy of the model; `scope()`; no cluster)."""

    devices: list[str]
    micro_batches: int
    budget_bytes: int = 0
    cut_after: tuple[int, ...] = ()
    plan: StagePlan | None = None
    splits: str = "stages"  # or "columns": one stage, its widest layer split over devices
    num_replicas_in_sync: int = 1
    cluster_resolver: Any = None
    placed: list[int] = field(default_factory=list)  # each variable's stage, in creation order

    def scope(self) -> contextlib.AbstractContextManager:
        import tensorflow as tf

        return tf.distribute.get_strategy().scope()

    @property
    def stages(self) -> int:
        return len(self.devices)


def build_pipeline(choice: Any, resolver: Any = None, timeout_s: float = 60.0) -> StagedDevices:
    """What a pipeline trains on in place of a tf.distribute strategy: its stages' devices
    (a GPU each, else a logical CPU each) and micro-batches."""
    import tensorflow as tf

    from tfscale.tasks.core.process import logical_cpus

    gpus = tf.config.list_logical_devices("GPU")
    devices = [g.name for g in gpus] if gpus else logical_cpus(choice.stages)
    return StagedDevices(
        devices=devices[: choice.stages],
        micro_batches=choice.micro_batches,
        budget_bytes=int(choice.device_memory_mb * (1 << 20)),
        cut_after=tuple(choice.cut_after),
    )


def build_tensor_parallel(
    choice: Any, resolver: Any = None, timeout_s: float = 60.0
) -> StagedDevices:
    """The devices a layer's columns are split over (a GPU each, else a logical CPU each),
    trained as one stage on the first."""
    devices = build_pipeline(choice, resolver, timeout_s)
    devices.micro_batches, devices.splits = 1, "columns"
    return devices


def widest_dense(model: Any) -> Any:
    """The hidden Dense layer with the largest kernel (the logits stay whole).

    Raises:
        UsageError: a model with no hidden Dense layer.
    """
    import keras

    dense = [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.Dense) and layer.name != "logits"
    ]
    if not dense:
        raise UsageError(
            f"model {model.name} has no hidden Dense layer to split by columns",
            "use --strategy pipeline, or a model with one (mlp, cnn, embedding).",
        )
    return max(dense, key=lambda layer: math.prod(layer.kernel.shape))


def build_column_split(
    strategy: StagedDevices, build: Callable[[], Any], seed: int, batch: int
) -> Any:
    """`build()`'s model with its widest hidden Dense layer split by columns over the
    devices (`tasks.train.models.ColumnSplitDense`), starting from the same weights: the rest of
    the model stays on the first device."""
    import keras
    import numpy as np

    from tfscale.tasks.train.models import ColumnSplitDense

    whole = build()
    target = widest_dense(whole)

    def clone(layer):
        if layer is not target:
            return layer.__class__.from_config(layer.get_config())
        return ColumnSplitDense(
            layer.units,
            len(strategy.devices),
            keras.activations.serialize(layer.activation),
            strategy.devices,
            name=layer.name,
        )

    model = keras.models.clone_model(whole, clone_function=clone)
    for old, new in zip(whole.layers, model.layers, strict=True):
        if old is target:
            edges = np.cumsum(new.widths)[:-1]
            kernels = np.split(keras.ops.convert_to_numpy(old.kernel), edges, axis=1)
            biases = np.split(keras.ops.convert_to_numpy(old.bias), edges)
            new.set_weights([w for pair in zip(kernels, biases, strict=True) for w in pair])
        elif old.weights:
            new.set_weights(old.get_weights())
    strategy.plan = plan_stages(model, 1, batch)
    return model


def build_staged(strategy: StagedDevices, build: Callable[[], Any], seed: int, batch: int) -> Any:
    """`build()`'s model with each stage's variables on that stage's device.

    The model is built once to read its shapes and cut it (`plan_stages`), then again with
    every variable created under its stage's device, in the same order and from the same
    seed, so the weights are those a one-device run starts from. The optimizer's slots
    follow their variables (Keras colocates them).
    """
    import keras
    import tensorflow as tf

    created: list[Any] = []

    def record(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        created.append(variable)
        return variable

    with tf.variable_creator_scope(record):
        draft = build()
    plan = plan_stages(draft, strategy.stages, batch, strategy.budget_bytes, strategy.cut_after)
    stage_of_op = {i: s for s, (lo, hi) in enumerate(plan.bounds) for i in range(lo, hi + 1)}
    position = {id(v): n for n, v in enumerate(created)}
    stage_of_variable = [0] * len(created)
    for i, op in enumerate(graph_of(draft).operations):
        for weight in getattr(op, "weights", []):
            stage_of_variable[position[id(weight.value)]] = stage_of_op.get(i, 0)
    del draft
    counter = iter(range(len(created)))

    def place(next_creator, **kwargs):
        n = next(counter, None)
        device = strategy.devices[stage_of_variable[n] if n is not None else 0]
        with tf.device(device):
            return next_creator(**kwargs)

    keras.utils.set_random_seed(seed)
    with tf.variable_creator_scope(place):
        model = build()
    strategy.plan = plan
    return model


def bytes_by_device(variables: list[Any]) -> dict[str, int]:
    """The bytes of `variables` on each device, read from where they were placed."""
    totals: dict[str, int] = {}
    for v in variables:
        value = getattr(v, "value", v)
        device = value.device.split("device:")[-1] if value.device else "?"
        totals[device] = totals.get(device, 0) + int(math.prod(value.shape) * value.dtype.size)
    return totals


def iter_placed(model: Any, optimizer: Any) -> Iterator[Any]:
    yield from model.weights
    yield from optimizer.variables
