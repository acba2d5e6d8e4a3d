"""Training steps: the per-replica step (with gradient accumulation and loss scaling),
driven by `strategy.run` for synchronous strategies or by a ClusterCoordinator for
ParameterServerStrategy, the warm-up learning-rate schedule, and Adam with each variable's
update one fused kernel (`FusedAdam`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from tfscale.tasks.core.internals import cluster_resolver_of, input_pipelines_of
from tfscale.tasks.data.inputs import distributed_iterator
from tfscale.tasks.train.keras_meaning import own_train_step, run_own_train_step, step_loss
from tfscale.tasks.train.objectives import Built

EpochRunner = Callable[..., tuple[float, float]]  # (steps, after_steps) -> (loss, correct)


def _nothing(steps: int) -> None:
    """The default `after_steps` hook (told how many steps just completed): nothing."""


SUM = tf.distribute.ReduceOp.SUM


@keras.saving.register_keras_serializable(package="tfscale")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from the base rate to the target rate; with `gain` (a variable that
    an adaptive rule updates as the training runs, `noise_estimates.AdaptiveGain`), to the
    target times the gain."""

    def __init__(self, base: float, target: float, warmup_steps: int, gain=None):
        self.base, self.target, self.warmup_steps, self.gain = base, target, warmup_steps, gain

    def __call__(self, step):
        target = self.target if self.gain is None else self.target * self.gain
        if self.warmup_steps <= 0:
            return tf.cast(target, tf.float32)
        fraction = tf.minimum(tf.cast(step, tf.float32) / self.warmup_steps, 1.0)
        return self.base + (target - self.base) * fraction

    def get_config(self) -> dict:
        return {"base": self.base, "target": self.target, "warmup_steps": self.warmup_steps}


class NoiseAtAllReduce:
    """An optimizer mix-in: `noise` (a `GradientNoise`, None by default) records the
    gradient noise scale's norms at the all-reduce, the one place the replicas' and the
    all-reduced gradients both exist (`tasks.train.optimizers` mixes it into a user's)."""

    noise: Any = None

    def _all_reduce_sum_gradients(self, grads_and_vars):
        reduced = super()._all_reduce_sum_gradients(grads_and_vars)
        if self.noise is not None:
            self.noise.record([g for g, _ in reduced])
        return reduced


@keras.saving.register_keras_serializable(package="tfscale")
class FusedAdam(NoiseAtAllReduce, keras.optimizers.Adam):
    """Keras's Adam, each variable's update one kernel (TensorFlow's `ResourceApplyAdam`)
    instead of Keras's dozen small ops: the same arithmetic (the bias-corrected step
    `lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`, epsilon added to `sqrt(v)`) on the same
    slot variables, so checkpoints and models are Keras's own.

    Under Mirrored every update is traced and run once per device, so the ops it saves
    count twice. Measured (2 logical CPUs, 300-step blocks in 7 alternating rounds, one
    process): the digits CNN 30,039 against 27,906 ex/s (per-round ratio 1.05-1.11 in 6 of
    7 rounds), the 32x32x3 CNN 10,161 against 9,628 ex/s; the first graph call, which
    traces the step, 0.63 against 0.86 s (digits) and 0.42-0.70 against 0.92-0.93 s.

    AMSGrad and sparse gradients (an embedding's `IndexedSlices`) take Keras's own update.
    """

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
        )


def _handle(variable) -> tf.Tensor:
    """The resource handle of a Keras or TensorFlow variable (under a strategy's update, the
    copy on the device being updated)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


def make_warmup_schedule(
    base: float, target: float, warmup_steps: int, gain=None
) -> WarmupSchedule:
    return WarmupSchedule(base, target, warmup_steps, gain)


def replica_step(
    built: Built, optimizer, batch: tuple, accum_steps: int, effective_batch: int, noise=None
):
    """One optimizer update from `accum_steps` micro-batches of this replica's batch, as
    Keras's `fit` means it (`tasks.train.keras_meaning`): the model's own `train_step` where
    it has one, else the loss its `compute_loss` gives (the compiled loss and
    `model.losses`), scaled so that summing across replicas (which the optimizer does) gives
    the effective global batch's mean gradient. Returns (loss, the sum of the examples'
    scores: the correct count for classes; `tasks.train.objectives`). `batch`: this
    replica's (features, labels) and each example's weight where the data has them.

    With `noise` (a `GradientNoise`, also set on the optimizer whose all-reduce records
    it), each micro-batch's gradient is kept for it; a lone replica with no micro-batches
    also takes its first half's gradient from the same forward pass, so that there is a
    smaller batch to compare the whole with while the update is the whole batch's, as `fit`
    makes it (BatchNormalization's statistics and Dropout's draws are the whole batch's).
    """
    model, objective = built
    images, labels, weights = (*batch, None)[:3]
    if own_train_step(model):
        return run_own_train_step(model, objective, images, labels, weights)
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    halves = noise is not None and noise.split_batch
    grads, total_loss, correct, micro = None, 0.0, 0.0, []
    for piece in _split((images, labels, weights), accum_steps):
        images_i, labels_i = piece[:2]
        with tf.GradientTape(persistent=halves) as tape:
            logits = model(images_i, training=True)
            loss = step_loss(model, objective, piece, logits, effective_batch)
            target = optimizer.scale_loss(loss) if scaled else loss
            if halves:
                half = _first_half_loss(model, objective, piece, logits)
                half = optimizer.scale_loss(half) if scaled else half
        step_grads = tape.gradient(target, model.trainable_variables)
        if halves:
            micro = half_gradients(tape.gradient(half, model.trainable_variables), step_grads)
        elif noise is not None:
            micro.append(step_grads)
        grads = (
            step_grads if grads is None else [a + b for a, b in zip(grads, step_grads, strict=True)]
        )
        total_loss += loss
        correct += tf.reduce_sum(objective.score(labels_i, logits))
    if noise is not None:
        scale = optimizer.scale_loss(1.0) if scaled else 1.0
        rows = tf.nest.flatten(images_i)[0].shape[0]
        factor = 1.0 if halves else effective_batch / rows
        noise.stage(micro, model.trainable_variables, factor, scale)
    optimizer.apply(grads, model.trainable_variables)
    return total_loss, correct


def _first_half_loss(model, objective, batch: tuple, logits) -> tf.Tensor:
    """The loss of the first half of a lone replica's batch (features, labels, weights or
    None), from the whole batch's forward pass (its mean: the loss of a batch of half as
    many examples)."""
    rows = batch[1].shape[0] // 2
    return step_loss(model, objective, first_rows(batch, rows), logits[:rows], rows)


def first_rows(parts: tuple, rows: Any) -> tuple:
    """The first `rows` examples of each part of a batch (tensors or structures of them;
    None kept)."""
    return tuple(
        None if part is None else tf.nest.map_structure(lambda t: t[:rows], part) for part in parts
    )


def half_gradients(first: list, whole: list) -> list[list]:
    """The mean gradients of a batch's two halves, from the first's and the whole's (whose
    mean of the two it is)."""
    second = [2.0 * w - f for f, w in zip(first, whole, strict=True)]
    return [first, second]


def _split(features: Any, parts: int) -> list[Any]:
    """`tf.split` of a tensor, or of each tensor of a structure of them (None kept), into
    `parts` along the batch."""
    if parts == 1:
        return [features]
    pieces = [[t] * parts if t is None else tf.split(t, parts) for t in tf.nest.flatten(features)]
    return [tf.nest.pack_sequence_as(features, list(p)) for p in zip(*pieces, strict=True)]


class GradientNoise:
    """Sums, one copy per replica (sync-on-read), of the squared gradient norms the gradient
    noise scale is estimated from (`tasks.measure.noise_trajectory`): each micro-batch's gradient
    before the all-reduce (a batch of `small_batch` examples) and the all-reduced gradient
    (`big_batch`), raw and as Adam preconditions them (divided by sqrt(v_hat) + epsilon,
    with v_hat the second moment before this step's gradient), over the steps since the
    last `read`.

    Gradients are taken in float32, with the loss scale undone; a step whose norms are not
    finite is not counted (LossScaleOptimizer skips such steps before the all-reduce, so
    they never reach `record`). Set on `FusedAdam.noise`, it is staged by `replica_step`
    and recorded by the optimizer's all-reduce, the one place both gradients exist.
    """

    KEYS = ("small", "big", "small_adam", "big_adam", "steps", "adam_steps")
    # the graph calls that record, one in this many (`train.noise_scale_every`): on the
    # default training (digits, the CNN, 1-2 ms steps that are mostly per-op dispatch) a
    # recording call costs 9-13% more than a plain one, one call in 5 4-6%, one in 10 0-3%
    # (`benchmarks/noise_scale_cost.py`, two runs of 15 alternating rounds)
    EVERY_CALLS = 10

    def __init__(
        self,
        strategy: Any,
        optimizer: FusedAdam,
        replicas: int,
        per_replica: int,
        accum_steps: int,
        effective_batch: int,
        every_calls: int = EVERY_CALLS,
    ):
        self.optimizer, self.replicas = optimizer, replicas
        self.every_calls = every_calls  # as an epoch runner made now will record
        # one replica with whole batches: its batch in two halves (an even batch only); with
        # gradient accumulation each micro-batch is `per_replica` examples
        self.split_batch = replicas == 1 and accum_steps == 1 and per_replica % 2 == 0
        self.small_batch = per_replica // 2 if self.split_batch else per_replica
        self.big_batch = effective_batch
        self.on = self.small_batch < self.big_batch
        self.sums = _replica_sums(strategy, 1, shape=(len(self.KEYS),))[0]
        # what each replica staged, by its replica's id (`_replica_key`): Mirrored traces
        # its replicas' steps in threads of their own, at once
        self._staged: dict[int, tuple[Any, Any, list[Any]]] = {}

    def stage(self, micro: list[list], variables: list, factor: float, scale: Any) -> None:
        """The micro-batches' gradients of this step (of the loss over the effective batch,
        times `scale`): each one's mean gradient is `factor / scale` times it.

        Each list of gradients is flattened into one vector first, so that a norm is a
        handful of ops whatever the model's variable count (the step of a small model is
        mostly per-op dispatch)."""
        adam = self.optimizer
        if hasattr(adam, "_velocities") and hasattr(adam, "beta_2"):  # the Adam family
            t = tf.cast(adam.iterations, tf.float32)
            unbias = 1.0 - tf.pow(tf.cast(adam.beta_2, tf.float32), t)
            velocity = _flat([adam._velocities[adam._get_variable_index(v)] for v in variables])
            precondition = tf.sqrt(velocity / unbias) + adam.epsilon
            weights = 1.0 / tf.square(precondition)  # |g / p|^2 = sum(g^2 w)
        else:  # no preconditioner: its norms are NaN, so never counted (`record`)
            weights = tf.constant(float("nan"))
        to_mean = tf.square(tf.cast(factor, tf.float32) / tf.cast(scale, tf.float32))
        raw, adam_sq = [], []
        for grads in micro:
            squares = tf.square(_flat(grads))
            raw.append(tf.reduce_sum(squares))
            adam_sq.append(tf.reduce_sum(squares * weights))
        self._staged[_replica_key()] = (
            tf.add_n(raw) * to_mean / len(micro),
            tf.add_n(adam_sq) * to_mean / len(micro),
            weights,
        )

    def record(self, reduced: list[Any]) -> None:
        """The all-reduced gradient of the step staged last: adds both norms, divided by the
        replicas (each replica adds its share; reading sums them)."""
        staged = self._staged.pop(_replica_key(), None)
        if staged is None:
            return
        small, small_adam, weights = staged
        squares = tf.square(_flat(reduced))
        big, big_adam = tf.reduce_sum(squares), tf.reduce_sum(squares * weights)
        raw_ok = tf.math.is_finite(small) & tf.math.is_finite(big)
        adam_ok = tf.math.is_finite(small_adam) & tf.math.is_finite(big_adam)
        values = tf.stack([small, big, small_adam, big_adam, 1.0, 1.0])
        ok = tf.stack([raw_ok, raw_ok, adam_ok, adam_ok, raw_ok, adam_ok])
        self.sums.assign_add(tf.where(ok, values / self.replicas, 0.0))

    def read(self) -> dict[str, float]:
        """The means over the steps since the last read (of every replica's micro-batches
        for `small`), with the batches, then starts over."""
        totals = dict(zip(self.KEYS, self.sums.read_value().numpy().tolist(), strict=True))
        self.sums.assign(tf.zeros(len(self.KEYS)))
        steps, adam_steps = totals.pop("steps"), totals.pop("adam_steps")
        return {
            "small": totals["small"] / steps if steps else None,
            "big": totals["big"] / steps if steps else None,
            "small_adam": totals["small_adam"] / adam_steps if adam_steps else None,
            "big_adam": totals["big_adam"] / adam_steps if adam_steps else None,
            "steps": round(steps),
            "small_batch": self.small_batch,
            "big_batch": self.big_batch,
        }


def _replica_key() -> Any:
    """Which replica this is, the same in every replica context the step passes through:
    LossScaleOptimizer (mixed_float16) applies its update from a replica context of its
    own, made by a `merge_call`, not the step's (so a key by context object found nothing
    staged there, and nothing was recorded)."""
    ctx = tf.distribute.get_replica_context()
    replica = tf.get_static_value(ctx.replica_id_in_sync_group)
    return int(replica) if replica is not None else id(ctx)


def _flat(values: list[Any]) -> tf.Tensor:
    """Tensors (gradients, variables) as one float32 vector, in order."""
    return tf.concat(
        [tf.reshape(tf.cast(tf.convert_to_tensor(v), tf.float32), [-1]) for v in values], 0
    )


def replica_batches(strategy, dataset_fn) -> Callable[[], tuple]:
    """`next_batches()`, for use inside the training step's `tf.function`: the next batch of
    every local replica, as the strategy's per-replica values.

    Replicas on CPUs (OneDevice, Mirrored over logical CPU devices, CPU worker processes)
    read a plain iterator of their worker's input pipeline, one batch per local replica:
    the device iterator of `distribute_datasets_from_function` costs as much as the step
    itself there (a 3-conv CNN at batch 32: 600-650 ex/s through it against 1,080-1,320
    without, on one device and on two logical CPUs alike; two worker processes at 128 a
    worker: 305 ms a step through it against 209 ms without). Across workers it also
    all-reduces, at every step, whether each worker still has data, which a repeated input
    never runs out of. On GPUs and TPUs the distributed iterator fetches each replica's
    batch to its device ahead of the step.
    """
    devices = strategy.extended.worker_devices
    if not all("CPU" in device.upper() for device in devices):
        iterator = distributed_iterator(strategy, dataset_fn)
        return lambda: next(iterator)
    iterator = iter(dataset_fn(input_context_of(strategy)))
    local = len(devices)

    def next_batches() -> tuple:
        batches = [next(iterator) for _ in range(local)]
        # a replica's id counts across workers, whose replicas are numbered in turn
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: batches[ctx.replica_id_in_sync_group % local]
        )

    return next_batches


def input_context_of(strategy) -> tf.distribute.InputContext:
    """This worker's input pipeline among the strategy's (one per worker process)."""
    resolver = cluster_resolver_of(strategy)
    workers = input_pipelines_of(strategy)
    return tf.distribute.InputContext(
        num_input_pipelines=workers,
        input_pipeline_id=resolver.task_id if resolver is not None and workers > 1 else 0,
        num_replicas_in_sync=strategy.num_replicas_in_sync,
    )


def make_epoch_runner(setup: Any, dataset_fn: Callable, jit_compile: bool = False) -> EpochRunner:
    """An epoch runner for OneDevice, Mirrored, MultiWorkerMirrored and TPU strategies, over
    a run's `setup` (`tasks.train.training.TrainingSetup`: its strategy, model built with
    its objective, optimizer, accumulation steps, examples a step and steps a call).

    One graph call runs up to `steps_per_call` steps (the idea of Keras's
    `steps_per_execution`), so Python dispatches once per call, not once per step. Each
    replica sums its loss and correct count into its own copy of a sync-on-read variable;
    they are reduced across replicas once per epoch when read, so a step makes one
    collective (the gradients' all-reduce, which the optimizer packs into one) instead of
    three. With `jit_compile` (one device only: `tasks.distribute.strategy`), XLA compiles the step
    (the input and the loop stay outside it).
    """
    strategy, built, optimizer = setup.strategy, setup.built, setup.optimizer
    accum_steps, effective_batch = setup.accum_steps, setup.step_examples
    next_batches = replica_batches(strategy, dataset_fn)
    sums = _replica_sums(strategy, 2)
    graph = _StepsGraph(
        strategy, built, optimizer, next_batches, sums, (accum_steps, effective_batch),
        jit_compile,
    )  # fmt: skip
    train_steps = _recording_every(graph, _noise_of(optimizer))

    @tf.function
    def reset():
        strategy.run(lambda: [total.assign(0.0) for total in sums])

    def run_epoch(steps: int, after_steps: Callable[[int], None] = _nothing) -> tuple[float, float]:
        reset()
        run_in_calls(train_steps, steps, setup.steps_per_call, after_steps)
        return running()

    def running() -> tuple[float, float]:  # the sums so far, as a batch hook reads them
        return float(sums[0].read_value()), float(sums[1].read_value())

    run_epoch.running = running
    return run_epoch


@dataclass(frozen=True)
class _StepsGraph:
    """What one graph call of `make_epoch_runner` runs: up to n steps on the replicas, each
    summing its loss and correct count into `sums`; `batches`: the step's examples over
    its accumulated micro-batches (accumulation steps, effective batch)."""

    strategy: Any
    built: Built  # the model and its objective
    optimizer: Any
    next_batches: Callable[[], tuple]
    sums: list
    batches: tuple[int, int]
    jit_compile: bool

    def train_steps(self, recorder: GradientNoise | None) -> Callable:
        """The graph of n steps, recording the gradient noise scale into `recorder` (None:
        plain steps)."""
        accum_steps, effective_batch = self.batches
        built, optimizer, sums = self.built, self.optimizer, self.sums

        def step_and_count(*batch):
            loss, correct = replica_step(
                built, optimizer, batch, accum_steps, effective_batch, recorder
            )
            sums[0].assign_add(loss)
            sums[1].assign_add(correct)

        def one_step(*batch):  # (features, labels), and weights where the data has them
            self.strategy.run(step_and_count, args=batch)

        step = tf.function(one_step, jit_compile=True) if self.jit_compile else one_step

        @tf.function
        def train_steps(n):
            for _ in tf.range(n):
                step(*self.next_batches())

        return train_steps


def _recording_every(graph: _StepsGraph, noise: GradientNoise | None) -> Callable[[int], None]:
    """The graph call to run: plain steps, or (recording the noise scale) one call in
    `noise.every_calls` recording, the first among them."""
    plain = graph.train_steps(None)
    if noise is None:
        return plain
    recording, every, calls = graph.train_steps(noise), noise.every_calls, itertools.count()

    def train_steps(n):
        (recording if next(calls) % every == 0 else plain)(n)

    return train_steps


def adam_of(optimizer: Any) -> Any:
    """The optimizer itself, or the one a LossScaleOptimizer wraps (mixed_float16)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def _noise_of(optimizer: Any) -> GradientNoise | None:
    """The gradient noise scale's recorder set on the optimizer (`FusedAdam.noise`), if any."""
    return getattr(adam_of(optimizer), "noise", None)


def _replica_sums(strategy: Any, n: int, shape: tuple[int, ...] = ()) -> list[Any]:
    """`n` float sums (of `shape`), one copy per replica (sync-on-read), added together
    when read."""
    with strategy.scope():
        return [
            tf.Variable(
                tf.zeros(shape),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )
            for _ in range(n)
        ]


def run_in_calls(
    train_steps: Callable, steps: int, steps_per_call: int, after_steps: Callable[[int], None]
) -> None:
    """`steps` steps as graph calls of up to `steps_per_call` each (`train_steps(n)`),
    telling `after_steps` after each call how many it ran."""
    done = 0
    while done < steps:
        n = min(steps_per_call, steps - done)
        train_steps(tf.constant(n))
        done += n
        after_steps(n)


def make_ps_epoch_runner(
    setup: Any,
    dataset_fn: Callable,
    jit_compile: bool = False,  # refused for this strategy by `select_strategy`
) -> EpochRunner:
    """An epoch runner for ParameterServerStrategy over a run's `setup` (as
    `make_epoch_runner`'s): steps scheduled on workers as they free up, one per closure
    (its steps a call do not apply: the coordinator schedules)."""
    strategy, built, optimizer = setup.strategy, setup.built, setup.optimizer
    accum_steps, worker_batch = setup.accum_steps, setup.step_examples
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    per_worker = coordinator.create_per_worker_dataset(lambda: dataset_fn(None))
    iterator = iter(per_worker)

    @tf.function
    def train_step(iterator):
        return strategy.run(
            lambda *batch: replica_step(built, optimizer, batch, accum_steps, worker_batch),
            args=next(iterator),
        )

    def run_epoch(steps: int, after_steps: Callable[[int], None] = _nothing) -> tuple[float, float]:
        results = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(steps)]
        coordinator.join()
        after_steps(steps)
        fetched = [r.fetch() for r in results]
        return float(sum(f[0] for f in fetched)), float(sum(f[1] for f in fetched))

    return run_epoch
