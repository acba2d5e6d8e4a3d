"""The diagnosis probes of a multi-process run, measured where it trains.

Under MultiWorkerMirrored every worker process runs them together, after training, on the
run's own strategy and model, so a step's all-reduce is the real one between the real
processes (or hosts). Under ParameterServer the coordinator runs them with its workers.
Per step they measure:

- `step_s`: the training step with its communication, on one cached batch;
- `local_step_s`: the same step on the same batch with no communication at all (a copy of
  the model outside the strategy, in the same process, on the same cores);
- `comm_s`: the communication alone: an all-reduce of the model's gradient bytes
  (MultiWorkerMirrored), or a push and pull of its variables (ParameterServer);
- `end_to_end_s`: the training step fed by the real input pipeline;
- each worker's input pipeline alone (examples/s).

Every worker's own figures reach every worker through one more all-reduce, so the chief
holds them all (no shared file system is needed). Nothing here is an ideal: each figure is
a measurement.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from tfscale.tasks.distribute.run import Run
from tfscale.tasks.measure.timing import (
    SUM,
    all_reduce_by_size,
    all_reduce_seconds,
    gradient_bytes,
    input_only_rate,
    seconds_per_call,
)
from tfscale.tasks.train.steps import input_context_of
from tfscale.tasks.train.training import TrainingSetup, local_copy, train_dataset_fn


@dataclass(frozen=True)
class InPlaceProbes:
    """Per-step figures measured inside a multi-process run (seconds unless named)."""

    where: str  # "2 worker processes", "the coordinator and 2 workers"
    comm: str  # what `comm_s` moved: "all-reduce" or "push and pull"
    replicas: int
    workers: int
    step_examples: int  # examples one step consumes (all replicas)
    replica_examples: int  # examples one replica's part of a step consumes
    worker_examples: int  # examples one worker's part of a step consumes
    gradient_bytes: int
    step_s: float
    local_step_s: float  # the slowest replica's
    comm_s: float
    end_to_end_s: float
    input_examples_per_s: list[float] = field(default_factory=list)  # one per worker
    # one device at the whole global batch (weak scaling), per step; 0 when not measured
    local_global_batch_step_s: float = 0.0
    seconds: float = 0.0  # time the probes took
    # for the cost model (`tasks.report.forecast`): [per-replica batch, local step s] at a few
    # batch sizes, and [message bytes, all-reduce s] at a few message sizes
    local_step_s_by_batch: list[list[float]] = field(default_factory=list)
    comm_s_by_bytes: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _WorkerFigures:
    """One worker's own measurements; `_gather` carries them to every worker as a row."""

    local_step_s: float  # at the per-replica batch
    local_global_batch_step_s: float  # at the global batch (0: not measured)
    local_step_s_by_batch: tuple[float, ...]  # at each of the probed batch sizes
    input_examples_per_s: float

    def row(self) -> list[float]:
        return [
            self.local_step_s,
            self.local_global_batch_step_s,
            *self.local_step_s_by_batch,
            self.input_examples_per_s,
        ]

    @classmethod
    def of_row(cls, row: list[float]) -> _WorkerFigures:
        return cls(row[0], row[1], tuple(row[2:-1]), row[-1])


def probe_in_place(setup: TrainingSetup, run: Run, steps: int) -> InPlaceProbes:
    """Measures a trained run's steps on the strategy and model it trained (`setup`).

    Every worker of a MultiWorkerMirrored run must call this with the same arguments: its
    probes are collectives.
    """
    started = time.perf_counter()
    strategy, ps = setup.strategy, run.choice.spec.one_worker_per_step
    batch = setup.per_replica * setup.accum_steps
    pipeline = train_dataset_fn(run.train, setup.manifest, run.data_dir, batch)
    per_call = min(setup.steps_per_call, max(steps // 3, 1))
    calls = max(steps // per_call, 1)
    step_s, end_to_end_s, comm_s = _step_and_comm_seconds(setup, run, pipeline, per_call, calls)
    grad_bytes = gradient_bytes(setup.model)
    sizes, local = _local_step_seconds_by_batch(setup, run, batch, per_call, calls)
    global_s = 0.0
    if run.train.scaling == "weak" and setup.replicas > 1 and not ps:  # a PS step: one worker
        global_s = _local_step_seconds_at(setup, run, setup.global_batch, per_call, calls)
    mine = _WorkerFigures(local[sizes.index(batch)], global_s, local, 0.0)
    workers = _every_workers_figures(setup, ps, mine, pipeline, batch, steps)
    where = (
        f"the coordinator and {setup.workers} workers"
        if ps
        else f"{setup.workers} worker processes"
    )
    return InPlaceProbes(
        where=where,
        comm="push and pull" if ps else "all-reduce",
        replicas=setup.replicas,
        workers=setup.workers,
        step_examples=setup.step_examples,
        replica_examples=batch,
        worker_examples=setup.step_examples if ps else setup.step_examples // setup.workers,
        gradient_bytes=grad_bytes,
        step_s=step_s,
        # the slowest worker's, as for the step itself
        local_step_s=max(w.local_step_s for w in workers),
        comm_s=comm_s,
        end_to_end_s=end_to_end_s,
        input_examples_per_s=[w.input_examples_per_s for w in workers],
        local_global_batch_step_s=max(w.local_global_batch_step_s for w in workers),
        seconds=time.perf_counter() - started,
        local_step_s_by_batch=[
            [float(size), max(w.local_step_s_by_batch[i] for w in workers)]
            for i, size in enumerate(sizes)
        ],
        comm_s_by_bytes=[] if ps else all_reduce_by_size(strategy, grad_bytes, per_call, calls),
    )


def _step_and_comm_seconds(
    setup: TrainingSetup, run: Run, pipeline: Callable, per_call: int, calls: int
) -> tuple[float, float, float]:
    """Seconds of a step compute-only and end to end on the run's strategy, and of its
    communication alone: an all-reduce of the gradients, or a ParameterServer step's push
    and pull (whose step is its own, not the side-by-side workers' share)."""
    step_s, end_to_end_s = _strategy_step_seconds(setup, run, pipeline, per_call, calls)
    variables = setup.model.trainable_variables
    if not run.choice.spec.one_worker_per_step:
        return step_s, end_to_end_s, all_reduce_seconds(setup.strategy, variables, per_call, calls)
    comm_s = _push_pull_seconds(setup.strategy, variables, per_call, calls)
    return step_s * setup.workers, end_to_end_s * setup.workers, comm_s


def _every_workers_figures(
    setup: TrainingSetup, ps: bool, mine: _WorkerFigures, pipeline: Callable, batch: int, steps: int
) -> list[_WorkerFigures]:
    """Every worker's figures, with its input pipeline's rate: gathered from every worker
    process of a MultiWorkerMirrored run; under ParameterServer, the coordinator's own
    (every worker's input read through its scheduled closures) for each worker."""
    strategy = setup.strategy
    if ps:
        rate = _ps_input_rate(strategy, pipeline, batch, steps) / setup.workers
        return [dataclasses.replace(mine, input_examples_per_s=rate)] * setup.workers
    rate = _input_rate(strategy, pipeline, batch, steps)
    row = dataclasses.replace(mine, input_examples_per_s=rate).row()
    return [_WorkerFigures.of_row(values) for values in _gather(strategy, row)]


def _strategy_step_seconds(
    setup: TrainingSetup, run: Run, pipeline: Callable, per_call: int, calls: int
) -> tuple[float, float]:
    """Seconds per step on the run's strategy: compute-only (one cached batch, the best of
    three blocks, so a slow spell on a shared machine does not pull it off) and fed by the
    real input pipeline."""

    def one_batch(ctx: tf.distribute.InputContext | None) -> tf.data.Dataset:
        return pipeline(ctx).take(1).cache().repeat()

    compute = setup.epoch_runner(run.choice, one_batch)
    end_to_end = setup.epoch_runner(run.choice, pipeline)
    step_s = min(seconds_per_call(lambda: compute(per_call), calls) for _ in range(3))
    end_to_end_s = seconds_per_call(lambda: end_to_end(per_call), calls)
    return step_s / per_call, end_to_end_s / per_call


def _local_step_seconds_by_batch(
    setup: TrainingSetup, run: Run, batch: int, per_call: int, calls: int
) -> tuple[list[int], tuple[float, ...]]:
    """(sizes, seconds) of the local step at half, one and two times `batch` (rounded to
    whole micro-batches): the points the cost model's per-example compute is fitted to."""
    double = train_dataset_fn(run.train, setup.manifest, run.data_dir, 2 * batch)
    examples = next(iter(double(None)))
    accum = setup.accum_steps
    sizes = sorted({size - size % accum for size in (max(batch // 2, accum), batch, 2 * batch)})
    seconds = tuple(
        _local_step_seconds(run, setup, _first(examples, size), per_call, calls) for size in sizes
    )
    return sizes, seconds


def _first(batch: tuple, rows: int) -> tuple:
    """The first `rows` examples of a batch (features, labels and any weights)."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: t[:rows], batch)


def _local_step_seconds_at(
    setup: TrainingSetup, run: Run, batch: int, per_call: int, calls: int
) -> float:
    """The local step at `batch` examples per micro-batch group."""
    whole = train_dataset_fn(run.train, setup.manifest, run.data_dir, batch * setup.accum_steps)
    return _local_step_seconds(run, setup, next(iter(whole(None))), per_call, calls)


def _push_pull_seconds(strategy: Any, variables: list, per_call: int, calls: int) -> float:
    """Seconds per push and pull of every variable between a worker and the ps tasks, one
    scheduled closure at a time (the communication of a ParameterServer step alone)."""
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    @tf.function
    def push_pull():
        def replica():
            for v in variables:
                v.assign_add(tf.zeros(v.shape, v.dtype))
            return tf.add_n([tf.reduce_sum(tf.cast(v.value, tf.float32)) for v in variables])

        return strategy.run(replica)

    def call():
        results = [coordinator.schedule(push_pull) for _ in range(per_call)]
        coordinator.join()
        return [r.fetch() for r in results]

    return seconds_per_call(call, calls) / per_call


def _local_step_seconds(
    run: Run,
    setup: TrainingSetup,
    batch: tuple,
    per_call: int,
    calls: int,
) -> float:
    """Seconds per training step of a copy of the model outside the strategy on `batch`
    (features, labels and any weights): the step with no communication, on this process's
    devices."""
    step = local_copy(run.train, run.manifest, setup.accum_steps)

    @tf.function
    def local_steps():
        loss = tf.constant(0.0)
        for _ in tf.range(per_call):
            loss += tf.cast(step(*batch), tf.float32)
        return loss

    return min(seconds_per_call(local_steps, calls) for _ in range(3)) / per_call


def _input_rate(strategy: Any, pipeline: Callable, batch: int, steps: int) -> float:
    """Examples/s of this worker's own input pipeline alone (its share of the input)."""
    local = len(strategy.extended.worker_devices)  # each local replica reads a batch
    return input_only_rate(pipeline(input_context_of(strategy)), batch, steps * local)


def _ps_input_rate(strategy: Any, pipeline: Callable, batch: int, steps: int) -> float:
    """Examples/s of every worker's input pipeline together, read in scheduled closures."""
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    iterator = iter(coordinator.create_per_worker_dataset(lambda: pipeline(None)))

    @tf.function
    def read(iterator):
        return tf.shape(next(iterator)[1])[0]

    def call():
        results = [coordinator.schedule(read, args=(iterator,)) for _ in range(steps)]
        coordinator.join()
        return [r.fetch() for r in results]

    return batch * steps / seconds_per_call(call, 1)


def _gather(strategy: Any, values: list[float]) -> list[list[float]]:
    """Every worker's `values`, one row per worker (in task order), on every worker: one
    all-reduce of a matrix where each replica fills its own row."""
    replicas = strategy.num_replicas_in_sync
    local = max(len(strategy.extended.worker_devices), 1)
    mine = tf.constant(values, tf.float32)

    @tf.function
    def gather():
        def replica():
            ctx = tf.distribute.get_replica_context()
            row = tf.one_hot(ctx.replica_id_in_sync_group, replicas)
            return ctx.all_reduce(SUM, row[:, None] * mine[None, :])

        return strategy.experimental_local_results(strategy.run(replica))[0]

    rows = np.asarray(gather())
    return [rows[i].tolist() for i in range(0, replicas, local)]
