"""Time to a target accuracy, measured the way MLPerf Training measures time to train: the
held-out split is evaluated at fixed example intervals while the model trains, on the
clock (evaluation time counts), and the first evaluation at or above the target gives the
time, steps and examples to it. A target never reached is an answer too: the best
accuracy reached, and where.

Both trainings of a study are evaluated at the same example counts (to the step), so their
examples to the target compare directly: the ratio is what the larger global batch costs
(or saves) in statistical efficiency, and times the examples/s speedup it gives the
time-to-target speedup (`tasks.report.summary`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from tasks.data.manifest import Manifest


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of the held-out split during training."""

    steps: int  # optimizer steps done
    examples: int  # training examples seen
    seconds: float  # on the clock: training and evaluation since the first step
    accuracy: float


@dataclass(frozen=True)
class ToTarget:
    """When a training first reached `target` held-out accuracy, or the best it reached
    (`target` None: a real-valued label, whose held-out metric, the mean absolute error,
    has no target: its best, the lowest)."""

    target: float | None
    every_examples: int  # the evaluation interval
    evaluations: int
    reached: bool
    steps: int | None = None
    examples: int | None = None
    seconds: float | None = None
    epochs: float | None = None  # examples over the training split
    best_accuracy: float | None = None
    best_examples: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """`0.95 at 5,632 examples (3.9 epochs, 176 steps), 4.1 s` or why not."""
        if self.reached:
            return (
                f"{self.target:g} at {self.examples:,} examples ({self.epochs:.1f} epochs, "
                f"{self.steps:,} steps), {self.seconds:.1f} s"
            )
        if self.target is None:
            best = "" if self.best_accuracy is None else f": best {self.best_accuracy:.4f}"
            return f"no target for a real-valued label's mean absolute error{best}"
        if self.best_accuracy is None:
            return f"{self.target:g} not evaluated (no evaluation interval ended)"
        return (
            f"{self.target:g} not reached in {self.evaluations} evaluations: best "
            f"{self.best_accuracy:.4f} at {self.best_examples:,} examples"
        )


def to_target(
    evaluations: list[Evaluation], target: float | None, every_examples: int, train_examples: int
) -> ToTarget:
    """The first evaluation at or above `target`, else the best one (no target: the lowest,
    an error)."""
    common = {"target": target, "every_examples": every_examples, "evaluations": len(evaluations)}
    if target is None:
        lowest = min(evaluations, key=lambda e: e.accuracy, default=None)
        return ToTarget(
            **common,
            reached=False,
            best_accuracy=lowest.accuracy if lowest else None,
            best_examples=lowest.examples if lowest else None,
        )
    for e in evaluations:
        if e.accuracy >= target:
            return ToTarget(
                **common,
                reached=True,
                steps=e.steps,
                examples=e.examples,
                seconds=e.seconds,
                epochs=e.examples / train_examples,
                best_accuracy=e.accuracy,
                best_examples=e.examples,
            )
    best = max(evaluations, key=lambda e: e.accuracy, default=None)
    return ToTarget(
        **common,
        reached=False,
        best_accuracy=best.accuracy if best else None,
        best_examples=best.examples if best else None,
    )


def interval_examples(every_epochs: float, train_examples: int) -> int:
    """The evaluation interval in training examples (0: no evaluation during training)."""
    return max(round(every_epochs * train_examples), 1) if every_epochs > 0 else 0


def evaluation_steps(every_examples: int, step_examples: int, first: int, last: int) -> list[int]:
    """The step counts in (first, last] after which the held-out split is evaluated: the
    first step by which the examples seen reach each multiple of the interval."""
    if every_examples <= 0:
        return []
    k = first * step_examples // every_examples + 1
    steps = []
    while (step := math.ceil(k * every_examples / step_examples)) <= last:
        if step > first and (not steps or step > steps[-1]):
            steps.append(step)
        k += 1
    return steps


class HeldOut:
    """The held-out split kept in memory, and the model's accuracy on it, in one graph."""

    def __init__(self, model: Any, manifest: Manifest, data_dir: str, batch_size: int):
        import tensorflow as tf

        from tasks.data.inputs import build_dataset
        from tasks.train.objectives import objective_of

        self.dataset = build_dataset(
            manifest, data_dir, "test", batch_size, training=False, cache=True
        )
        self.examples = manifest.splits["test"]

        objective = objective_of(model)

        @tf.function
        def correct() -> tf.Tensor:
            total = tf.constant(0.0, tf.float32)
            for images, labels in self.dataset:
                logits = model(images, training=False)
                total += tf.reduce_sum(objective.score(labels, logits))
            return total

        self._correct = correct

    def accuracy(self) -> float:
        """The held-out score: accuracy, or for real values the mean absolute error."""
        return float(self._correct()) / self.examples


class TargetClock:
    """The evaluations of one training against its target, on its clock.

    The clock starts at the first step (`start`) and runs through training and evaluation
    alike; a resumed training goes on from its last recorded evaluation's time.
    """

    def __init__(
        self,
        held_out: HeldOut | None,
        target: float | None,
        every_examples: int,
        step_examples: int,
        train_examples: int,
        earlier: list[Evaluation] = (),  # type: ignore[assignment]
        score: str = "accuracy",
    ):
        self.held_out, self.target = held_out, target
        self.score = score  # what the evaluations measure: the key of an epoch's record
        self.every_examples, self.step_examples = every_examples, step_examples
        self.train_examples = train_examples
        self.evaluations: list[Evaluation] = list(earlier)
        self._offset = self.evaluations[-1].seconds if self.evaluations else 0.0
        self._started: float | None = None

    @property
    def on(self) -> bool:
        return self.held_out is not None and self.every_examples > 0

    def start(self) -> None:
        if self._started is None:
            self._started = time.perf_counter()

    def cuts(self, first: int, last: int) -> list[int]:
        """The steps in (first, last] after which to evaluate."""
        if not self.on:
            return []
        return evaluation_steps(self.every_examples, self.step_examples, first, last)

    def evaluate(self, steps: int) -> float:
        """Evaluates the held-out split after `steps` steps; returns the seconds it took."""
        assert self.held_out is not None and self._started is not None
        began = time.perf_counter()
        accuracy = self.held_out.accuracy()
        now = time.perf_counter()
        self.evaluations.append(
            Evaluation(
                steps=steps,
                examples=steps * self.step_examples,
                seconds=self._offset + now - self._started,
                accuracy=accuracy,
            )
        )
        return now - began

    @property
    def reached(self) -> bool:
        last = self.evaluations[-1].accuracy if self.evaluations else None
        return last is not None and self.target is not None and last >= self.target

    def result(self) -> ToTarget:
        return to_target(self.evaluations, self.target, self.every_examples, self.train_examples)


@dataclass(frozen=True)
class OverSeeds:
    """A to-target figure over seeds, scored as MLPerf Training scores its runs: with three
    or more, the mean without the fastest and the slowest, a seed that never reached the
    target counting as the slowest; with fewer, the mean. `mean` is None where a seed kept
    did not reach the target. `low` and `high` span the seeds kept."""

    values: tuple[float | None, ...]
    mean: float | None
    low: float | None
    high: float | None

    @property
    def seeds(self) -> int:
        return len(self.values)

    @property
    def missed(self) -> int:
        return sum(v is None for v in self.values)


def over_seeds(values: list[float | None]) -> OverSeeds:
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    kept = ordered[1:-1] if len(ordered) >= 3 else ordered
    if not kept or any(v is None for v in kept):
        return OverSeeds(tuple(values), None, None, None)
    return OverSeeds(tuple(values), sum(kept) / len(kept), min(kept), max(kept))
