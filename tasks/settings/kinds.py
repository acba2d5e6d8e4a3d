"""Every tf.distribute strategy tfscale knows, as one table of values.

A `StrategyKind` says what the rest of the code needs to know about a strategy: where it
runs, how its replicas are counted, how it communicates, how it is built, the epoch
runner that drives it and how many examples one step consumes. Code elsewhere asks the
kind (`kind_of(choice.kind).runs_here`), never compares a strategy's name with a string.
Adding a strategy is one row here and its builder in `tasks/distribute/builders.py`.

This module is pure data: the builders (`tasks/distribute/builders.py`) and the epoch
runners (`tasks/train/steps.py`) are named here and imported when first called, so that
choosing a strategy (`tfscale hardware`, the config) stays free of TensorFlow.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfscale.tasks.core.errors import UsageError

HERE = "this process"
LOCAL_WORKERS = "local worker processes"
COORDINATOR = "a coordinator over a parameter-server cluster"


def _later(module: str, name: str) -> Callable[..., Any]:
    """`module.name`, imported on the first call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"{module}.{name}"
    return call


@dataclass(frozen=True)
class StrategyKind:
    """One strategy and everything that differs between strategies."""

    name: str
    runs: str  # HERE, LOCAL_WORKERS or COORDINATOR (when no cluster describes the tasks)
    count_replicas: Callable[[int, int, int], int]  # (requested replicas, gpus, workers)
    build: Callable[..., Any]  # (choice, resolver, collective timeout s) -> tf.distribute.Strategy
    # (the run's TrainingSetup, dataset_fn, XLA on) -> run(steps): (loss, correct)
    epoch_runner: Callable[..., Any] = _later("tfscale.tasks.train.steps", "make_epoch_runner")
    takes_workers: bool = False  # its worker count comes from --workers or the cluster
    all_reduce: bool = False  # replicas all-reduce gradients (NCCL on GPUs)
    cross_process: bool = False  # its collectives cross processes (RING on CPUs)
    one_worker_per_step: bool = False  # a step consumes one worker's batch, not the global one
    tasks_serve: bool = False  # in a cluster its ps and worker tasks serve; the chief trains

    in_sweep: bool = False  # a sweep can scale it over replica counts
    devices: str | None = None  # the device type it always runs on (None: GPUs, else CPUs)
    # (strategy, build, seed, batch) -> the model `build()` makes, its variables placed
    place_model: Callable[..., Any] = lambda strategy, build, seed, batch: build()
    # how it splits one model over devices: "stages" (pipeline), "columns" (a layer's kernel
    # split by columns), "" (it replicates the model, or keeps it on one device)
    splits: str = ""
    # its step is `replica_step` under `strategy.run`: the gradient noise scale is recorded
    # at its all-reduce
    records_noise: bool = False
    # the model in memory is one Keras model that evaluates outside the strategy: its final
    # evaluation is recorded for `tfscale evaluate` (`tasks.train.evaluation`)
    evaluated_after: bool = False
    # Keras's own `model.fit` trains under it (`train.loop: fit`): not MultiWorkerMirrored
    # (keras-team/keras#20585), ParameterServer (#18624) or a pipeline's stages
    keras_fit: bool = False

    @property
    def staged(self) -> bool:
        """Its devices hold stages of one model (a pipeline), not replicas of it."""
        return self.splits == "stages"

    @property
    def runs_here(self) -> bool:
        return self.runs == HERE

    def communication(self, devices: str) -> str:
        if devices == "gpu" and self.all_reduce:
            return "nccl"
        return "ring" if self.cross_process else "auto"

    def step_examples(self, per_replica: int, global_batch: int, accum_steps: int) -> int:
        """Examples one training step consumes."""
        return (per_replica if self.one_worker_per_step else global_batch) * accum_steps


def shape_text(replicas: int, stages: int = 1, micro_batches: int = 1, splits: str = "") -> str:
    """What a run spreads over: `2 replicas`, `1 replica`, `2 stages x 4 micro-batches`,
    `2 devices, its widest layer split by columns`."""
    if splits == "columns":
        return f"{stages} devices, its widest layer split by columns"
    if stages > 1:
        return f"{stages} stages x {micro_batches} micro-batches"
    return f"{replicas} replica{'s' if replicas != 1 else ''}"


class SpreadOver:
    """What a result trained over, from its `replicas`, `stages`, `micro_batches` and
    `splits` fields (a training's result and a study's summary share it)."""

    replicas: int
    stages: int
    micro_batches: int
    splits: str

    @property
    def devices(self) -> int:
        """Devices it trained on: its replicas, or a split model's parts."""
        return max(self.replicas, self.stages)

    @property
    def shape(self) -> str:
        """`2 replicas`, or `2 stages x 4 micro-batches`."""
        return shape_text(self.replicas, self.stages, self.micro_batches, self.splits)


KINDS: dict[str, StrategyKind] = {
    kind.name: kind
    for kind in (
        StrategyKind(
            "one_device",
            HERE,
            lambda replicas, gpus, workers: 1,
            _later("tfscale.tasks.distribute.builders", "build_one_device"),
            records_noise=True,
            evaluated_after=True,
            keras_fit=True,
        ),
        StrategyKind(
            "mirrored",
            HERE,
            lambda replicas, gpus, workers: gpus if gpus > 1 else replicas,
            _later("tfscale.tasks.distribute.builders", "build_mirrored"),
            all_reduce=True,
            in_sweep=True,
            records_noise=True,
            evaluated_after=True,
            keras_fit=True,
        ),
        StrategyKind(
            "multi_worker",
            LOCAL_WORKERS,
            lambda replicas, gpus, workers: workers * max(gpus, 1),
            _later("tfscale.tasks.distribute.builders", "build_multi_worker"),
            takes_workers=True,
            all_reduce=True,
            cross_process=True,
            in_sweep=True,
            records_noise=True,
            evaluated_after=True,
        ),
        StrategyKind(
            "parameter_server",
            COORDINATOR,
            lambda replicas, gpus, workers: workers,
            _later("tfscale.tasks.distribute.builders", "build_parameter_server"),
            epoch_runner=_later("tfscale.tasks.train.steps", "make_ps_epoch_runner"),
            takes_workers=True,
            one_worker_per_step=True,
            tasks_serve=True,
        ),
        StrategyKind(
            "tpu",
            HERE,
            lambda replicas, gpus, workers: replicas,
            _later("tfscale.tasks.distribute.builders", "build_tpu"),
            devices="tpu",
            records_noise=True,
        ),
        StrategyKind(
            "pipeline",
            HERE,
            lambda replicas, gpus, workers: 1,  # one copy of the model, cut across devices
            _later("tfscale.tasks.train.stage_models", "build_pipeline"),
            epoch_runner=_later("tfscale.tasks.train.gpipe", "make_pipeline_epoch_runner"),
            place_model=_later("tfscale.tasks.train.stage_models", "build_staged"),
            splits="stages",
            in_sweep=True,
        ),
        StrategyKind(
            "tensor_parallel",
            HERE,
            lambda replicas, gpus, workers: 1,  # one copy, its widest layer split by columns
            _later("tfscale.tasks.train.stage_models", "build_tensor_parallel"),
            epoch_runner=_later("tfscale.tasks.train.gpipe", "make_pipeline_epoch_runner"),
            place_model=_later("tfscale.tasks.train.stage_models", "build_column_split"),
            splits="columns",
        ),
    )
}
BASELINE = KINDS["one_device"]  # what every speedup divides by
STAGED = KINDS["pipeline"]  # what a model too large for one device is trained as


class UnknownStrategy(UsageError, ValueError):
    """A strategy name that is not in the table."""


def kind_of(name: str) -> StrategyKind:
    """The kind called `name`.

    Raises:
        UnknownStrategy: listing the known kinds.
    """
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownStrategy(f"unknown strategy {name!r}; known: {', '.join(KINDS)}") from None


def sweep_kinds() -> tuple[str, ...]:
    return tuple(name for name, kind in KINDS.items() if kind.in_sweep)
