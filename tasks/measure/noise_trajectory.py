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
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfscale.tasks.train.noise_estimates import (
    Gain,
    NoiseScale,
    planned_gain,
    rule_progress,
    step_progress,
    window_estimates,
)


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
RESAMPLES = 1000  # the headline's bootstrap over windows


@dataclass(frozen=True)
class Trajectory:
    """A training's noise scale over its steps, from the windows of norms it recorded
    (`tasks.train.steps.GradientNoise.read`): after each window that recorded steps, its
    end step, the window's own B_simple and the moving average's (`NoiseScale`, over the
    windows so far), for each variant; and each window's estimates (|G|^2, tr(S), steps),
    which the headline figure averages."""

    end_steps: tuple[int, ...]
    window: dict[str, tuple[float, ...]]
    averaged: dict[str, tuple[float, ...]]
    recorded_steps: int
    estimates: dict[str, tuple[tuple[float, float, int], ...]] = field(default_factory=dict)

    def at(self, step: int, variant: str) -> float:
        """The averaged noise scale in force at `step`: the last window's that ended at or
        before it (the first window's before any ended); NaN where it was not measurable."""
        values = self.averaged[variant]
        if not values:
            return math.nan
        done = [v for end, v in zip(self.end_steps, values, strict=True) if end <= step]
        return done[-1] if done else values[0]

    def headline(self, variant: str, until: int | None = None) -> tuple[float, float, float]:
        """The noise scale of the windows up to step `until`, as (low, value, high): the
        ratio of the step-weighted means of the windows' tr(S) and |G|^2 estimates, each
        unbiased, so their ratio is consistent where a mean of ratios, or a median of
        them, is not; a window whose |G|^2 came out at or below zero counts (dropping it
        would bias the figure low). The interval is a bootstrap over the windows' 95%; a
        draw whose mean |G|^2 is at or below zero reads infinity (every batch below the
        noise), so more than 2.5% of such draws make the high end infinite: unbounded
        (`interval_text`). NaN where the mean |G|^2 is at or below zero: the noise is not
        measurable."""
        kept = self._kept(variant, until)
        value = _ratio_of_means(kept)
        if not kept or math.isnan(value):
            return (math.nan, math.nan, math.nan)
        draw = random.Random(len(kept))  # the same windows give the same interval
        draws = (_ratio_of_means([draw.choice(kept) for _ in kept]) for _ in range(RESAMPLES))
        resampled = sorted(math.inf if math.isnan(d) else d for d in draws)
        low = resampled[int(0.025 * RESAMPLES)]
        high = resampled[int(0.975 * RESAMPLES) - 1]
        return min(low, value), value, max(high, value)

    def headline_value(self, variant: str, until: int | None = None) -> float:
        """`headline`'s value alone, without its interval's bootstrap: NaN where the noise
        is not measurable."""
        kept = self._kept(variant, until)
        return _ratio_of_means(kept) if kept else math.nan

    def _kept(self, variant: str, until: int | None) -> list:
        """The windows up to step `until` whose two estimates are both finite."""
        return [
            e
            for end, e in zip(self.end_steps, self.estimates.get(variant, ()), strict=True)
            if (until is None or end <= until) and math.isfinite(e[0]) and math.isfinite(e[1])
        ]


def interval_text(low: float, high: float) -> str:
    """`18-52`, or `18-unbounded` where the high end is infinite (`Trajectory.headline`)."""
    return f"{low:,.0f}-{'unbounded' if math.isinf(high) else f'{high:,.0f}'}"


def _ratio_of_means(estimates: Sequence[tuple[float, float, int]]) -> float:
    """tr(S)/|G|^2 of the step-weighted means; NaN where the mean |G|^2 is not above 0 (an
    interval's draw of such windows reads infinity: every batch below the noise)."""
    steps = sum(n for _, _, n in estimates)
    if not steps:
        return math.nan
    g2 = sum(g * n for g, _, n in estimates) / steps
    trace = max(sum(t * n for _, t, n in estimates) / steps, 0.0)
    return trace / g2 if g2 > 0 else math.nan


def trajectory(
    windows: Sequence[dict], beta: float = 0.5, examples: int | None = None
) -> Trajectory:
    """The noise scale over a training's recorded windows: each window's two-batch
    estimates (its norms are means over its steps, so unbiased over the window), and the
    bias-corrected moving average of the estimates over windows (`beta`: each window weighs
    as much as all before it, at 0.5). With `examples`, the training split's size, each
    |G|^2 is corrected for batches drawn without replacement from it: the two-batch
    estimate reads |G|^2 - tr(S)/N there, which at a batch that is a sizable share of a
    small split halves a noise scale's reading or worse (700 reads 1,400 at N = 1,437)."""
    end_steps: list[int] = []
    window: dict[str, list[float]] = {v: [] for v in VARIANTS}
    averaged: dict[str, list[float]] = {v: [] for v in VARIANTS}
    kept: dict[str, list[tuple[float, float, int]]] = {v: [] for v in VARIANTS}
    scales = {v: NoiseScale(beta) for v in VARIANTS}
    recorded = 0
    for w in windows:
        estimates = {variant: window_estimates(w, variant) for variant in VARIANTS}
        if estimates["raw"] is None:  # no step recorded in it
            continue
        recorded += w["steps"]
        end_steps.append(int(w["end_step"]))
        for variant, (g2, trace) in estimates.items():
            if examples:
                g2 += trace / examples
            kept[variant].append((g2, trace, int(w["steps"])))
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
        {k: tuple(v) for k, v in kept.items()},
    )


def split_examples(record: Any) -> int | None:
    """The training split's examples as a training's epochs of full steps count them
    (steps an epoch x global batch x accumulation), from a `TrainResult` or its
    metrics.json; None where it does not say."""
    get = record.get if isinstance(record, Mapping) else lambda k, d=None: getattr(record, k, d)
    steps = get("steps_per_epoch")
    if not steps:
        return None
    return int(steps) * int(get("global_batch")) * int(get("grad_accum_steps", 1) or 1)


def predicted_steps_to(
    path: Trajectory,
    steps_to_target: int,
    base_batch: float,
    batch: float,
    variant: str,
    progress: Callable[[float], float] | None = None,
) -> float:
    """The steps a training at global batch `batch` needs to the target a training at
    `base_batch` reached in `steps_to_target` steps along `path`: each of its steps at the
    noise scale then in force (the headline's where a window's was not measurable), its
    progress at `batch` against one at `base_batch` from `progress(phi)` (default:
    `step_progress`, a rate that keeps its share of its optimum). NaN where the noise was
    measurable nowhere; infinity ("never") where the steps making no progress (the rate
    twice its optimum or more at the noise scale then) are a sustained share of the run's,
    more than `NEVER_SHARE`; fewer, from a window or two of a noisy estimate (an early one,
    most often), are priced at the headline noise scale instead, where one window used to
    make every batch's prediction "never" though the run reached the target."""
    step = progress or (lambda phi: step_progress(phi, base_batch, batch))
    headline: list[float] = []  # computed once where a window needs it

    def overall() -> float:
        headline[:] = headline or [path.headline_value(variant, until=steps_to_target)]
        return headline[0]

    total, stalled = 0.0, 0
    for at in range(1, steps_to_target + 1):
        phi = path.at(at, variant)
        if not math.isfinite(phi):
            phi = overall()
        if math.isnan(phi):
            return math.nan
        made = step(phi)
        if made <= 0:
            stalled += 1
            made = step(overall()) if math.isfinite(overall()) else 0.0
            if made <= 0:
                return math.inf
        total += 1 / made
    return math.inf if stalled > NEVER_SHARE * steps_to_target else total


NEVER_SHARE = 0.1  # "never" where more of the run's steps than this would make no progress


def rule_gain(rule: str, base_batch: float, batch: float) -> Callable[[float], float]:
    """The learning-rate gain `rule` (`train.lr_scaling`) gives global batch `batch` over the
    base rate's `base_batch`, at noise scale phi (`planned_gain`: fixed for `linear`,
    `sqrt` and `none`, AdaScale's settled gain for `adascale`, its root for `auto`)."""
    return lambda phi: planned_gain(rule, batch / base_batch, phi, base_batch)


@dataclass(frozen=True)
class RuleSteps:
    """The steps to a target predicted at another global batch for the rate a rule gives
    it: a point where the rate's headroom is known (calibrated from a measured pair, or not
    needed: `adascale` keeps it), else the range from a base rate far below its optimum
    (`low`: steps fall as the gain grows) to one at it (`high`)."""

    rule: str
    steps: float | None
    low: float
    high: float
    headroom: float | None = None  # the base rate's share of its optimum, where calibrated

    def text(self, per_step: float = 1.0) -> str:
        """`5,300` or `4,100-6,900` (in examples, with `per_step` examples a step)."""
        if self.steps is not None:
            return _count(self.steps * per_step)
        return f"{_count(self.low * per_step)}-{_count(self.high * per_step)}"


def _count(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) else "never (the rate too high)"


def rule_steps(
    path: Trajectory,
    steps_to_target: int,
    batches: tuple[float, float],
    rule: str,
    headroom: float | None = None,
    noise_factor: float = 1.0,
    adaptive: bool = False,
) -> RuleSteps:
    """`predicted_steps_to` for a training at `batch` whose rate follows `rule` from the
    base rate set for `base_batch` (`batches`: the two), each step's progress on the quadratic model
    (`rule_progress`). `headroom` unknown: a point for `adascale` (its gain keeps the rate's
    share of its optimum, whatever that is), the range over headroom 0 to 1 for the rest.
    `noise_factor`: the noise scale's, where a calibration took it above the measured one
    (`tasks.train.noise_estimates.calibrated`); `adaptive`: an optimizer of Adam's kind,
    whose step at a rate grows with the batch (`Gain`)."""
    base_batch, batch = batches
    gain = rule_gain(rule, base_batch, batch)

    def made(phi: float, share: float) -> float:
        scaled = phi * noise_factor
        step = Gain(gain(phi), adaptive).at(scaled, base_batch, batch)
        return rule_progress(scaled, base_batch, batch, step, share)

    def at(share: float) -> float:
        return predicted_steps_to(
            path,
            steps_to_target,
            base_batch,
            batch,
            "raw",
            lambda phi: made(phi, share),
        )

    if rule == "adascale" or batch == base_batch:
        point = predicted_steps_to(path, steps_to_target, base_batch, batch, "raw")
        return RuleSteps(rule, point, point, point, headroom)
    if headroom is not None:
        point = at(headroom)
        return RuleSteps(rule, point, point, point, headroom)
    ends = sorted((at(0.0), at(1.0)))
    return RuleSteps(rule, None, ends[0], ends[1])
