"""Pipeline parallelism: a model too large for one device, cut into contiguous stages, each
stage's variables on a device of its own, trained with GPipe's schedule.

A model is cut only where one tensor alone crosses from the layers before to the layers
after (`cut_points`): every layer of a chain, a residual block's end. Its training footprint
(weights, the optimizer's two Adam slots, the accumulated gradients, and the activations a
step keeps for its backward pass) is estimated per layer from the built model's shapes
(`layer_costs`), and so is its compute (multiply-adds per example). `plan_stages` cuts the
layers into S stages that balance compute while each stage's footprint stays within a
device's memory; `fit_to_memory` is the choice `auto` makes from it (the fewest stages that
hold the model) and the refusal a data-parallel strategy gets.

Each step splits the batch into M micro-batches and runs stage s of micro-batch m under
stage s's device (`pipeline_step`); TensorFlow's executor runs an op as soon as its inputs
are ready, so stage s of micro-batch m+1 overlaps stage s+1 of micro-batch m. Backward runs
stage by stage from the last, the gradients of every micro-batch are summed, and one update
is applied: the same update one device makes on the whole batch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from tasks.errors import UsageError

OPTIMIZER_SLOTS = 2  # Adam: first and second moments, each the size of the weights
MB = 1 << 20


@dataclass(frozen=True)
class LayerCost:
    """One operation of a functional model: what it costs to train, per example."""

    index: int  # its place in `model.operations` (0 is the input)
    name: str
    flops: float  # multiply-adds x 2 per example, forward (an estimate from shapes)
    weight_bytes: int
    activation_bytes: int  # its output, per example, kept for the backward pass


@dataclass(frozen=True)
class Footprint:
    """Bytes one device needs to train a stage (or the whole model) at a batch."""

    weights: int
    optimizer: int
    gradients: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.optimizer + self.gradients + self.activations

    def describe(self) -> str:
        return (
            f"{mb(self.total)} (weights {mb(self.weights)}, optimizer {mb(self.optimizer)}, "
            f"gradients {mb(self.gradients)}, activations {mb(self.activations)})"
        )


def mb(n: float) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):,.2f} GB"
    return f"{n / MB:,.{2 if n < 10 * MB else 1}f} MB"


def footprint(costs: list[LayerCost], batch: int) -> Footprint:
    """The training footprint of these layers at `batch` examples kept for backward."""
    weights = sum(c.weight_bytes for c in costs)
    return Footprint(
        weights=weights,
        optimizer=OPTIMIZER_SLOTS * weights,
        gradients=weights,
        activations=batch * sum(c.activation_bytes for c in costs),
    )


@dataclass(frozen=True)
class StagePlan:
    """Where a model is cut: stage s holds operations `bounds[s][0]..bounds[s][1]`."""

    bounds: tuple[tuple[int, int], ...]
    names: tuple[str, ...]  # each stage's first and last layer, for people
    flops: tuple[float, ...]  # each stage's estimated forward compute per example
    footprints: tuple[Footprint, ...]  # each stage's at the batch it keeps

    @property
    def stages(self) -> int:
        return len(self.bounds)

    @property
    def cut_after(self) -> list[int]:
        return [hi for _, hi in self.bounds[:-1]]

    def describe(self) -> str:
        return "; ".join(
            f"stage {s + 1}: {name} ({fp.describe()})"
            for s, (name, fp) in enumerate(zip(self.names, self.footprints, strict=True))
        )

    def to_dict(self) -> dict:
        return {
            "cut_after": self.cut_after,
            "stages": [
                {"layers": name, "flops_per_example": f, **asdict(fp), "total": fp.total}
                for name, f, fp in zip(self.names, self.flops, self.footprints, strict=True)
            ],
        }


def _flat(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _elements(tensor: Any) -> int:
    return math.prod(int(d) for d in tensor.shape[1:])


def layer_costs(model: Any) -> list[LayerCost]:
    """Every operation of a built functional model, with its estimated costs per example
    (float32 bytes: what a float32 copy of the weights and slots takes)."""
    costs = []
    for i, op in enumerate(model.operations):
        if i == 0:
            continue
        out = _flat(op.output)[0]
        weights = getattr(op, "weights", [])  # keras.ops in a functional model have none
        kernel = next((w for w in weights if w.path.endswith("kernel")), None)
        per_position = _elements(out) // max(int(out.shape[-1]), 1) if out.shape[1:] else 1
        flops = 2.0 * math.prod(kernel.shape) * per_position if kernel is not None else 0.0
        costs.append(
            LayerCost(
                index=i,
                name=op.name,
                flops=flops + _elements(out),
                weight_bytes=sum(4 * math.prod(w.shape) for w in weights),
                activation_bytes=4 * _elements(out),
            )
        )
    return costs


def cut_points(model: Any) -> list[int]:
    """The operations after which one tensor alone crosses to the rest of the model: where a
    stage may end (never after the last operation)."""
    ops = model.operations
    last_use: dict[int, int] = {}
    for i, op in enumerate(ops):
        for tensor in _flat(op.input):
            last_use[id(tensor)] = i
    cuts = []
    for k in range(1, len(ops) - 1):
        live = {
            id(t) for op in ops[: k + 1] for t in _flat(op.output) if last_use.get(id(t), -1) > k
        }
        if len(live) == 1:
            cuts.append(k)
    return cuts


def plan_stages(
    model: Any,
    stages: int,
    batch: int,
    budget_bytes: int = 0,
    cut_after: tuple[int, ...] = (),
) -> StagePlan:
    """The cut of `model` into `stages` contiguous stages: `cut_after` when given, else the
    one whose heaviest stage (estimated compute) is lightest among those whose every stage
    fits `budget_bytes` (0: no budget) at `batch` examples kept for backward.

    Raises:
        UsageError: more stages than the model has places to cut, a `cut_after` that is not
            such a place, or no cut that fits the budget.
    """
    costs = layer_costs(model)
    cuts = cut_points(model)
    name = model.name
    if stages > len(cuts) + 1:
        raise UsageError(
            f"train.stages ({stages}) is more than model {name} can be cut into: "
            f"{len(cuts) + 1} stages at most (it can be cut after {len(cuts)} of its layers)",
            f"set train.stages to {len(cuts) + 1} or fewer.",
        )
    by_index = {c.index: c for c in costs}
    last = costs[-1].index
    if cut_after:
        bad = [k for k in cut_after if k not in cuts]
        if bad or len(cut_after) != stages - 1 or list(cut_after) != sorted(set(cut_after)):
            raise UsageError(
                f"train.cut_after {list(cut_after)} is not {stages - 1} increasing places "
                f"where model {name} can be cut (after layer {', '.join(map(str, cuts))})",
                f"give {stages - 1} of those, in order, or leave train.cut_after empty to "
                "balance the stages.",
            )
        chosen = list(cut_after)
    else:
        chosen = _balanced(costs, cuts, stages, batch, budget_bytes)
        if chosen is None:
            whole = footprint(costs, batch)
            raise UsageError(
                f"model {name} needs {mb(whole.total)} to train at batch {batch}, and no cut "
                f"into {stages} stages keeps every stage within a device's "
                f"{mb(budget_bytes)}",
                "raise train.device_memory_mb, lower the batch, or use more stages (and devices).",
            )
    edges = [0, *chosen, last]
    bounds = tuple((edges[s] + 1, edges[s + 1]) for s in range(stages))
    parts = [[by_index[i] for i in range(lo, hi + 1) if i in by_index] for lo, hi in bounds]
    return StagePlan(
        bounds=bounds,
        names=tuple(f"{p[0].name}..{p[-1].name}" if len(p) > 1 else p[0].name for p in parts),
        flops=tuple(sum(c.flops for c in p) for p in parts),
        footprints=tuple(footprint(p, batch) for p in parts),
    )


def _balanced(
    costs: list[LayerCost], cuts: list[int], stages: int, batch: int, budget: int
) -> list[int] | None:
    """The cut points (stages - 1 of `cuts`) that minimise the heaviest stage's compute with
    every stage's footprint within `budget` (0: none), or None when none fits."""
    last = costs[-1].index
    by_index = {c.index: c for c in costs}
    ends = [*cuts, last]

    def segment(lo: int, hi: int) -> tuple[float, int]:  # operations lo+1..hi
        part = [by_index[i] for i in range(lo + 1, hi + 1) if i in by_index]
        return sum(c.flops for c in part), footprint(part, batch).total

    # best[s][e]: (heaviest stage, cuts) for the first s stages ending at operation e
    best: list[dict[int, tuple[float, list[int]]]] = [{0: (0.0, [])}]
    for s in range(1, stages + 1):
        row: dict[int, tuple[float, list[int]]] = {}
        for end in ends if s < stages else [last]:
            for start, (heaviest, chosen) in best[s - 1].items():
                if start >= end:
                    continue
                flops, size = segment(start, end)
                if budget and size > budget:
                    continue
                candidate = (max(heaviest, flops), chosen + ([end] if end != last else []))
                if end not in row or candidate[0] < row[end][0]:
                    row[end] = candidate
        best.append(row)
    found = best[stages].get(last)
    return found[1] if found else None


def stage_models(model: Any, plan: StagePlan) -> list[Any]:
    """The stages as Keras models sharing `model`'s layers (and so its variables)."""
    import keras

    ops = model.operations
    models = []
    for s, (lo, hi) in enumerate(plan.bounds):
        inputs = model.inputs if s == 0 else ops[lo - 1].output
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

    from tasks.process import logical_cpus

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
    devices (`tasks.models.ColumnSplitDense`), starting from the same weights: the rest of
    the model stays on the first device."""
    import keras
    import numpy as np

    from tasks.models import ColumnSplitDense

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
    for i, op in enumerate(draft.operations):
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


def pipeline_step(
    stages: list[Any],
    devices: list[str],
    optimizer: Any,
    micro_batches: int,
    effective_batch: int,
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """`step(images, labels) -> (loss, correct)`: one update from `micro_batches`
    micro-batches run through the stages (GPipe: every forward, then every backward), for
    use inside a `tf.function`."""
    import keras
    import tensorflow as tf

    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    count = len(stages)

    def step(images, labels):
        kept = []  # per micro-batch: each stage's (tape, its input, its output)
        total_loss, correct = 0.0, 0
        for x, y in zip(
            tf.split(images, micro_batches), tf.split(labels, micro_batches), strict=True
        ):
            records = []
            for s, stage in enumerate(stages):
                with tf.device(devices[s]):
                    x = tf.identity(x)  # the activation moves to this stage's device
                    with tf.GradientTape() as tape:
                        tape.watch(x)
                        out = stage(x, training=True)
                        if s == count - 1:
                            per_example = keras.losses.sparse_categorical_crossentropy(
                                y, out, from_logits=True
                            )
                            loss = tf.reduce_sum(per_example) / effective_batch
                            target = optimizer.scale_loss(loss) if scaled else loss
                records.append((tape, x, target if s == count - 1 else out))
                x = out
            kept.append(records)
            total_loss += loss
            predicted = tf.argmax(out, axis=-1, output_type=tf.int32)
            correct += tf.reduce_sum(tf.cast(predicted == y, tf.int32))
        sums: list[list[Any] | None] = [None] * count
        for records in reversed(kept):
            upstream = None
            for s in reversed(range(count)):
                tape, x_in, out = records[s]
                variables = stages[s].trainable_variables
                with tf.device(devices[s]):
                    grads = tape.gradient(out, [x_in, *variables], output_gradients=upstream)
                upstream = grads[0]
                sums[s] = (
                    grads[1:]
                    if sums[s] is None
                    else [a + b for a, b in zip(sums[s], grads[1:], strict=True)]
                )
        variables = [v for stage in stages for v in stage.trainable_variables]
        optimizer.apply([g for part in sums for g in part], variables)
        return total_loss, correct

    return step


def make_pipeline_epoch_runner(
    strategy: StagedDevices,
    model: Any,
    optimizer: Any,
    dataset_fn: Callable,
    accum_steps: int,
    effective_batch: int,
    steps_per_call: int = 1,
    jit_compile: bool = False,  # refused for this strategy by `select_strategy`
) -> Callable[..., tuple[float, float]]:
    """An epoch runner for a pipeline: up to `steps_per_call` steps per graph call, each
    `pipeline_step` over `micro_batches x accum_steps` micro-batches."""
    import tensorflow as tf

    from tasks.steps import run_in_calls

    stages = stage_models(model, strategy.plan)
    iterator = iter(dataset_fn(None))
    # a column split places its own parts' ops; a pipeline places each stage
    devices = strategy.devices if strategy.splits == "stages" else [None]
    step = pipeline_step(
        stages, devices, optimizer, strategy.micro_batches * accum_steps, effective_batch
    )
    sums = [tf.Variable(0.0, trainable=False) for _ in range(2)]

    @tf.function
    def train_steps(n):
        for _ in tf.range(n):
            images, labels = next(iterator)
            loss, correct = step(images, labels)
            sums[0].assign_add(loss)
            sums[1].assign_add(tf.cast(correct, tf.float32))

    def run_epoch(steps: int, after_steps: Callable[[int], None] = lambda n: None):
        for total in sums:
            total.assign(0.0)
        run_in_calls(train_steps, steps, steps_per_call, after_steps)
        return float(sums[0].numpy()), float(sums[1].numpy())

    return run_epoch


def fit_to_memory(choice: Any, cfg: Any, manifest: Any) -> Any:
    """`choice`, or, when the model does not fit one device's memory (`choice.device_memory_mb`;
    0: not checked), the fewest pipeline stages that hold it where the strategy is `auto`. A
    pipeline's own cut is checked here, before any work.

    Raises:
        UsageError: a strategy that keeps the whole model on each device (asked for by
            name) and a model that does not fit; or no cut into the devices there are fits.
    """
    import dataclasses

    from tasks.models import build_model
    from tasks.strategy_kinds import STAGED

    budget = int(choice.device_memory_mb * MB)
    if choice.spec.splits == "columns" or (not budget and not choice.spec.staged):
        return choice  # a column split is not checked against the budget
    model = build_model(cfg.model, manifest.shape, manifest.num_classes)
    if choice.spec.staged:  # its cut, checked before any work (the training cuts it again)
        plan_stages(model, choice.stages, cfg.per_replica_batch, budget, choice.cut_after)
        return choice
    per_replica = cfg.per_replica_batch * cfg.grad_accum_steps
    whole = footprint(layer_costs(model), per_replica)
    if whole.total <= budget:
        return choice
    needs = f"model {cfg.model} needs {whole.describe()} to train at batch {per_replica}"
    if cfg.strategy != "auto":
        raise UsageError(
            f"{needs}, and {choice.kind} keeps the whole model on each device, which has "
            f"{mb(budget)} (train.device_memory_mb)",
            "train it as pipeline stages (--strategy pipeline, or auto, which cuts it), or "
            "lower the batch.",
        )
    for stages in range(2, choice.stages + 1):
        try:
            plan = plan_stages(model, stages, cfg.per_replica_batch, budget)
        except UsageError:
            continue
        reason = (
            f"{needs}; a device has {mb(budget)}: {stages} pipeline stages of "
            f"{cfg.micro_batches} micro-batches ({plan.describe()})"
        )
        return dataclasses.replace(
            choice,
            kind=STAGED.name,
            replicas=1,
            workers=1,
            stages=stages,
            micro_batches=cfg.micro_batches,
            reason=f"{reason}; {choice.reason.split('; ', 1)[-1]}",
        )
    raise UsageError(
        f"{needs}; a device has {mb(budget)}, and no cut into {choice.stages} stages or fewer "
        "fits it",
        "raise train.stages (one device each) or train.device_memory_mb, lower the batch, "
        "or split its widest layer by columns (--strategy tensor_parallel).",
    )


def schedule_bubble(stages: int, micro_batches: int) -> float:
    """GPipe's idle share of a step with balanced stages: (S-1)/(M+S-1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def iter_placed(model: Any, optimizer: Any) -> Iterator[Any]:
    yield from model.weights
    yield from optimizer.variables
