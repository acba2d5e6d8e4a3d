"""What a pipeline's step is made of, measured: each stage alone, the activations and their
gradients moving between stages, and the whole step at 1, 4 and 8 micro-batches (and the
run's own), beside GPipe's own bubble (S-1)/(M+S-1).

The measured bubble is the share of the stages' device time a step leaves idle:
1 - sum(stage alone) / (stages x step). With stages that overlap perfectly it is the
schedule's; with devices that share their compute (logical CPU devices on the same cores)
the stages cannot overlap, and it stays near 1 - 1/S whatever the micro-batches.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import tensorflow as tf

from tfscale.tasks.distribute.run import Run
from tfscale.tasks.train.gpipe import pipeline_step
from tfscale.tasks.train.stage_models import stage_models
from tfscale.tasks.train.stage_plan import schedule_bubble
from tfscale.tasks.train.training import set_up_training, train_dataset_fn

IMBALANCE = 1.4  # the heaviest stage over the mean stage: the cut is uneven (1.4: the stages
# could run 1.4x as fast balanced; two stages split 3:1, as a cut before the logits layer
# alone makes, measure 1.5 with a stage's fixed dispatch in both, so 1.5 named it one run in two)
TRANSFER_SHARE = 0.3  # activations moving between stages, of a step: bound by the transfer
BUBBLE_BOUND = 0.3  # measured idle share of the stages' time at the run's micro-batches
BUBBLE_FALLS = 0.1  # more micro-batches lower the measured bubble by this much: they help
MICRO_BATCHES = (1, 4, 8)  # measured beside the run's own


@dataclass(frozen=True)
class StageProbes:
    """A pipeline's step, taken apart (seconds; medians over repeats)."""

    stages: int
    micro_batches: int  # the run's
    names: list[str]  # each stage's first and last layer
    step_seconds: dict[str, float]  # by micro-batches: the whole step, update included
    stage_seconds: dict[str, list[float]]  # by micro-batches: each stage alone, fwd + bwd
    transfer_seconds: float  # a step's activations and gradients moved between stages

    def measured_bubble(self, micro: int) -> float:
        alone = sum(self.stage_seconds[str(micro)])
        return max(0.0, 1.0 - alone / (self.stages * self.step_seconds[str(micro)]))

    def schedule_bubble(self, micro: int) -> float:
        return schedule_bubble(self.stages, micro)

    @property
    def measured(self) -> list[int]:
        return sorted(int(m) for m in self.step_seconds)

    def bubble_table(self) -> str:
        """`1: 0.50 (schedule 0.50); 4: 0.49 (0.20); 8: 0.48 (0.11)`."""
        return "; ".join(
            f"{m} micro-batch{'es' if m > 1 else ''}: {self.measured_bubble(m):.2f} "
            f"(schedule {self.schedule_bubble(m):.2f})"
            for m in self.measured
        )

    def to_dict(self) -> dict:
        return asdict(self)


def measure_stages(run: Run, repeats: int = 5) -> StageProbes:
    """Times a fresh copy of the run's pipeline (same cut, devices and batch) on one batch of
    its input: the step at each of `MICRO_BATCHES` that divides the batch and the run's own,
    each stage alone at the same micro-batches, and the transfers between stages."""
    cfg, data_dir, choice = run.train, run.data_dir, run.choice
    setup = set_up_training(cfg, run.manifest, choice)
    devices, plan = setup.strategy.devices, setup.strategy.plan
    stages = stage_models(setup.model, plan)
    batch = setup.per_replica * setup.accum_steps
    images, labels = next(iter(train_dataset_fn(cfg, setup.manifest, data_dir, batch)(None)))
    micros = sorted({m for m in (*MICRO_BATCHES, choice.micro_batches) if batch % m == 0})
    inputs = _stage_inputs(stages, devices, images)
    step_s, stage_s, last = {}, {}, len(stages) - 1
    for m in micros:
        step = tf.function(
            pipeline_step(
                stages,
                devices,
                setup.optimizer,
                m,
                setup.global_batch * setup.accum_steps,
                setup.objective,
            )
        )
        step_s[str(m)] = _seconds(lambda step=step: step(images, labels)[0], repeats)
        alone = [
            _stage_alone(stage, devices[s], inputs[s], labels, m, s == last, setup.objective)
            for s, stage in enumerate(stages)
        ]
        stage_s[str(m)] = [_seconds(run, repeats) for run in alone]
    return StageProbes(
        stages=plan.stages,
        micro_batches=choice.micro_batches,
        names=list(plan.names),
        step_seconds=step_s,
        stage_seconds=stage_s,
        transfer_seconds=_seconds(_transfers(devices, inputs[1:]), repeats),
    )


def _stage_inputs(stages: list[Any], devices: list[str], images: Any) -> list[Any]:
    """The batch as each stage receives it, on that stage's device."""
    inputs, x = [], images
    for stage, device in zip(stages, devices, strict=True):
        with tf.device(device):
            x = tf.identity(x)
            inputs.append(x)
            x = stage(x, training=False)
    return inputs


def _stage_alone(
    stage: Any, device: str, x: Any, labels: Any, micro: int, last: bool, objective: Any
) -> Callable[[], Any]:
    """One stage's forward and backward over `micro` micro-batches, on its device (the last
    stage from the loss; the others from their outputs' sum, a gradient of their size)."""

    @tf.function
    def run():
        total = 0.0
        for part, y in zip(tf.split(x, micro), tf.split(labels, micro), strict=True):
            with tf.device(device):
                floating = part.dtype.is_floating  # the first stage's input: uint8 images
                with tf.GradientTape() as tape:
                    if floating:
                        tape.watch(part)
                    out = stage(part, training=True)
                    target = (
                        tf.reduce_sum(objective.loss(y, out))
                        if last
                        else tf.reduce_sum(tf.cast(out, tf.float32))
                    )
                sources = [part] if floating else []
                grads = tape.gradient(target, [*sources, *stage.trainable_variables])
                for grad in [g for g in grads if g is not None][:1]:  # the work, not pruned
                    total += tf.reduce_sum(tf.cast(grad, tf.float32))
        return total

    return run


def _transfers(devices: list[str], activations: list[Any]) -> Callable[[], Any]:
    """Each boundary's activations to the next stage's device and a tensor of their size back
    (the gradients), for the whole batch."""

    @tf.function
    def run():
        total = 0.0
        for s, x in enumerate(activations):
            with tf.device(devices[s + 1]):
                forward = tf.identity(x) + 1.0
            with tf.device(devices[s]):
                back = tf.identity(forward) * 0.5
            total += tf.reduce_sum(back)
        return total

    return run


def _seconds(call: Callable[[], Any], repeats: int) -> float:
    """The median seconds of `call` (its result read back), after one warm-up call."""
    float(call())
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        float(call())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def classify_stages(p: StageProbes) -> tuple[str, str, list[str]]:
    """The pipeline's bottleneck class, its evidence and the advice, from its probes."""
    m = p.micro_batches
    stage_s, step = p.stage_seconds[str(m)], p.step_seconds[str(m)]
    mean = sum(stage_s) / len(stage_s)
    heavy = max(range(len(stage_s)), key=lambda s: stage_s[s])
    ms = ", ".join(f"{t * 1000:.1f}" for t in stage_s)
    if stage_s[heavy] >= IMBALANCE * mean:
        return (
            "imbalanced-stage",
            f"stage {heavy + 1} ({p.names[heavy]}) takes {stage_s[heavy] * 1000:.1f} ms of a "
            f"step, {stage_s[heavy] / mean:.1f}x the mean stage (stages alone: {ms} ms)",
            [
                f"cut the model elsewhere so stage {heavy + 1} holds fewer layers: set "
                "train.cut_after (or leave it empty to balance the stages by their compute)"
            ],
        )
    share = p.transfer_seconds / step
    if share >= TRANSFER_SHARE:
        return (
            "transfer-bound",
            f"moving activations and gradients between stages takes "
            f"{p.transfer_seconds * 1000:.1f} ms of a {step * 1000:.1f} ms step ({share:.0%})",
            ["cut where the activations are smaller, or use fewer stages"],
        )
    return _classify_bubble(p, ms)


def _classify_bubble(p: StageProbes, ms: str) -> tuple[str, str, list[str]]:
    """The class of a pipeline whose stages balance and whose transfers are cheap: by how
    idle its stages are, and whether more micro-batches shrink that (`ms`: the stages'
    times alone, as shown)."""
    m = p.micro_batches
    bubble = p.measured_bubble(m)
    if bubble < BUBBLE_BOUND:
        return (
            "pipeline-balanced",
            f"the stages are idle {bubble:.2f} of a step at {m} micro-batches (schedule "
            f"{p.schedule_bubble(m):.2f}); stages alone: {ms} ms",
            [],
        )
    most = p.measured[-1]
    if p.measured_bubble(most) <= bubble - BUBBLE_FALLS:
        return (
            "bubble-bound",
            f"the stages are idle {bubble:.2f} of a step at {m} micro-batches and "
            f"{p.measured_bubble(most):.2f} at {most} (schedule {p.schedule_bubble(m):.2f}, "
            f"{p.schedule_bubble(most):.2f})",
            [f"more micro-batches per step (train.micro_batches: {most})"],
        )
    return (
        "serialized-stages",
        f"the stages are idle {bubble:.2f} of a step at {m} micro-batches and "
        f"{p.measured_bubble(most):.2f} at {most}, where the schedule's bubble falls to "
        f"{p.schedule_bubble(most):.2f}: the stages do not overlap, because their devices share "
        "the same compute (logical CPU devices on the same cores)",
        [
            "on these devices a pipeline buys memory, not speed: use it for a model that does "
            "not fit one device, with stages on devices of their own (GPUs) to overlap"
        ],
    )
