"""The gradient noise scale over a training and what it predicts: how many steps a
training needs to reach a target at another global batch (McCandlish et al. 2018, "An
Empirical Model of Large-Batch Training"; the efficiency of Pollux, OSDI 2021). The
estimators themselves (two batch sizes' norms to |G|^2 and tr(S), their moving average,
the statistical efficiency) are `tasks.train.noise_estimates`, which training uses too.

A training records its norms in windows (`tasks.train.steps.GradientNoise`): `trajectory`
makes the noise scale of them, window by window. With noise scale phi, a step at global
batch M makes (M/M0)(phi+M0)/(phi+M) of the progress of a step at M0 (`step_progress`):
summing the inverse over a baseline's trajectory predicts the steps at M
(`predicted_steps`, `predicted_steps_to`). Trainings measured at three or more batches fit
McCandlish's hyperbola S = S_min(1 + B_noise/B) (`fit_steps_hyperbola`), whose B_noise is
the critical batch B_crit = E_min/S_min.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tasks.train.noise_estimates import NoiseScale, step_progress, window_estimates


def predicted_steps(noise_scales: Sequence[float], base_batch: float, batch: float) -> float:
    """The steps a training at global batch `batch` needs to make the progress a training
    at `base_batch` made in `len(noise_scales)` steps, each of which had the noise scale
    given: the sum of the inverse progress of each."""
    return sum(1 / step_progress(phi, base_batch, batch) for phi in noise_scales)


@dataclass(frozen=True)
class Hyperbola:
    """McCandlish's S = S_min (1 + B_noise/B): steps to a target at global batch B."""

    s_min: float
    b_noise: float

    @property
    def e_min(self) -> float:
        """The fewest examples to the target (a batch far below B_noise)."""
        return self.s_min * self.b_noise

    @property
    def b_crit(self) -> float:
        """The critical batch E_min/S_min: past it, more examples per step buy little."""
        return self.e_min / self.s_min

    def steps(self, batch: float) -> float:
        return self.s_min * (1 + self.b_noise / batch)

    def examples(self, batch: float) -> float:
        return self.steps(batch) * batch


def fit_steps_hyperbola(batches: Sequence[float], steps: Sequence[float]) -> Hyperbola:
    """The hyperbola through steps measured at three or more global batches: S is linear in
    1/B (S = S_min + S_min B_noise / B), fitted by least squares of the relative error
    (each point weighed by 1/S^2: a small batch's many steps would otherwise outweigh the
    large batches', where S_min shows)."""
    if len(batches) != len(steps) or len(set(batches)) < 3:
        raise ValueError("the fit needs steps measured at three or more different batches")
    xs = [1 / b for b in batches]
    weights = [1 / s**2 for s in steps]
    total = sum(weights)
    mean_x = sum(w * x for w, x in zip(weights, xs, strict=True)) / total
    mean_s = sum(w * s for w, s in zip(weights, steps, strict=True)) / total
    spread = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs, strict=True))
    slope = (
        sum(w * (x - mean_x) * (s - mean_s) for w, x, s in zip(weights, xs, steps, strict=True))
        / spread
    )
    s_min = mean_s - slope * mean_x
    if s_min <= 0 or slope < 0:
        raise ValueError(
            f"steps {list(steps)} at batches {list(batches)} do not fall as the batch grows "
            "the way the model needs (S_min > 0, B_noise >= 0)"
        )
    return Hyperbola(s_min, slope / s_min)


VARIANTS = ("raw", "adam")  # the gradient as it is, and as Adam preconditions it


@dataclass(frozen=True)
class Trajectory:
    """A training's noise scale over its steps, from the windows of norms it recorded
    (`tasks.train.steps.GradientNoise.read`): after each window that recorded steps, its
    end step, the window's own B_simple and the moving average's (`NoiseScale`, over the
    windows so far), for each variant."""

    end_steps: tuple[int, ...]
    window: dict[str, tuple[float, ...]]
    averaged: dict[str, tuple[float, ...]]
    recorded_steps: int

    def at(self, step: int, variant: str) -> float:
        """The averaged noise scale in force at `step`: the last window's that ended at or
        before it (the first window's before any ended)."""
        values = self.averaged[variant]
        if not values:
            return math.nan
        done = [v for end, v in zip(self.end_steps, values, strict=True) if end <= step]
        return done[-1] if done else values[0]

    def spread(self, variant: str, until: int | None = None) -> tuple[float, float, float]:
        """The windows' own noise scales up to step `until`: (lower quartile, median, upper
        quartile), the estimate's spread."""
        values = sorted(
            v
            for end, v in zip(self.end_steps, self.window[variant], strict=True)
            if (until is None or end <= until) and math.isfinite(v)
        )
        if not values:
            return (math.nan, math.nan, math.nan)
        pick = lambda q: values[min(int(q * len(values)), len(values) - 1)]  # noqa: E731
        return pick(0.25), pick(0.5), pick(0.75)


def trajectory(windows: Sequence[dict], beta: float = 0.5) -> Trajectory:
    """The noise scale over a training's recorded windows: each window's two-batch
    estimates (its norms are means over its steps, so unbiased over the window), and the
    bias-corrected moving average of the estimates over windows (`beta`: each window weighs
    as much as all before it, at 0.5)."""
    end_steps: list[int] = []
    window: dict[str, list[float]] = {v: [] for v in VARIANTS}
    averaged: dict[str, list[float]] = {v: [] for v in VARIANTS}
    scales = {v: NoiseScale(beta) for v in VARIANTS}
    recorded = 0
    for w in windows:
        estimates = {variant: window_estimates(w, variant) for variant in VARIANTS}
        if estimates["raw"] is None:  # no step recorded in it
            continue
        recorded += w["steps"]
        end_steps.append(int(w["end_step"]))
        for variant, (g2, trace) in estimates.items():
            scales[variant].update(g2, trace)
            own = NoiseScale(0.0)
            own.update(g2, trace)
            window[variant].append(own.value())
            averaged[variant].append(scales[variant].value())
    return Trajectory(
        tuple(end_steps),
        {k: tuple(v) for k, v in window.items()},
        {k: tuple(v) for k, v in averaged.items()},
        recorded,
    )


def predicted_steps_to(
    path: Trajectory, steps_to_target: int, base_batch: float, batch: float, variant: str
) -> float:
    """The steps a training at global batch `batch` needs to the target a training at
    `base_batch` reached in `steps_to_target` steps along `path`: each of its steps at the
    noise scale then in force (`predicted_steps`)."""
    scales = [path.at(step, variant) for step in range(1, steps_to_target + 1)]
    return predicted_steps(
        [s if math.isfinite(s) or s > 0 else math.inf for s in scales], base_batch, batch
    )
