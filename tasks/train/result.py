"""What a training run produced and how fast it went (`TrainResult`), as its run
directory's `metrics.json` holds it (`tasks.core.run_layout.METRICS`): plain data, with nothing
heavy imported, so reading a run's results needs no TensorFlow."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tfscale.tasks.core.fields import PARAM, tracked_as
from tfscale.tasks.settings.kinds import SpreadOver


@dataclass(frozen=True)
class TrainResult(SpreadOver):
    """What a training run produced and how fast it went."""

    run_dir: str
    model_path: str
    strategy: str = field(metadata=PARAM)
    reason: str
    replicas: int = field(metadata=PARAM)
    workers: int = field(metadata=PARAM)
    precision: str = field(metadata=PARAM)
    per_replica_batch: int = field(metadata=PARAM)
    global_batch: int = field(metadata=PARAM)
    grad_accum_steps: int = field(metadata=PARAM)
    learning_rate: float = field(metadata=PARAM)
    steps_per_epoch: int = field(metadata=PARAM)
    # the model's weights, and the optimizer that updated them (`tasks.train.optimizers`)
    model_parameters: int = field(default=0, metadata=PARAM)
    optimizer: str = field(default="Adam", metadata=PARAM)
    # the rule the rate followed (`learning_rate_rule`: a tag); an adaptive rule's gain is
    # in each window of `gradient_noise` (`lr_gain`)
    lr_scaling: str = "none"
    jit_compile: bool = field(default=False, metadata=PARAM)
    loop: str = field(default="tfscale", metadata=PARAM)  # `train.loop`: tfscale or fit
    # `train.class_weight` as trained: none, or each class's weight by index (`balanced`
    # made explicit by the run)
    class_weight: str = field(default="none", metadata=PARAM)
    # what each example's weight came from (`prepare.sample_weight`); none: unweighted
    sample_weight: str = field(default="none", metadata=PARAM)
    history: list[dict[str, float]] = field(default_factory=list)
    # over the epochs after the first (tracing); `examples_per_s` is each epoch's own curve
    examples_per_s: float = field(default=0.0, metadata=tracked_as("examples_per_s_after_epoch_1"))
    train_seconds: float = 0.0
    resumed_from_epoch: int = field(default=0, metadata=PARAM)  # how it began: once
    resumed_from_step: int = field(default=0, metadata=PARAM)
    weights_digest: str = ""
    # a pipeline (`tasks.train.gpipe`): its stages and micro-batches, where the model was cut,
    # and the bytes of weights and optimizer slots each device holds (read from the placed
    # variables)
    stages: int = field(default=1, metadata=PARAM)
    micro_batches: int = field(default=1, metadata=PARAM)
    splits: str = ""  # "stages" (a pipeline), "columns" (its widest layer split), or ""
    stage_plan: dict[str, Any] = field(default_factory=dict)
    device_bytes: dict[str, int] = field(default_factory=dict)
    device_bytes_max: int | None = None  # the fullest device's share (a split model only)
    # the probes measured after training (`tasks.measure.in_place`, `.diagnosis`), when asked
    probes: dict[str, Any] = field(default_factory=dict)
    # the held-out split's accuracy against `evaluate.target_accuracy` while training
    # (`tasks.train.to_target.ToTarget`), evaluated every `evaluate.every_epochs`
    to_target: dict[str, Any] = field(default_factory=dict)
    evaluations: list[dict[str, float]] = field(default_factory=list)  # `to_target.Evaluation`s
    # the gradient noise scale's norms (`tasks.train.steps.GradientNoise.read`), a window of
    # steps each, read at each evaluation (each epoch's end without evaluations):
    # `tasks.measure.noise_trajectory` makes the noise scale of them
    gradient_noise: list[dict[str, Any]] = field(default_factory=list)
    # epochs over which the rate ramped from the base rate to the rule's (`train.warmup_epochs`)
    warmup_epochs: int = field(default=0, metadata=PARAM)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timed_epochs(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """The epochs a run's throughput is taken over: all but the first (which traces the
    step) when there are more."""
    return history[1:] or history


def examples_per_s(history: list[dict[str, float]]) -> float:
    """A run's throughput: its examples over its seconds, over `timed_epochs`."""
    timed = timed_epochs(history)
    return sum(h["examples"] for h in timed) / sum(h["seconds"] for h in timed)
