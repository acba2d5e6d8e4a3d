"""The gradient noise scale's estimators, used while training (the learning-rate gain of
`train.lr_scaling: adascale` and `auto`) and after it (`tasks.measure.noise_trajectory`).

A gradient averaged over a batch of B examples has E|G_B|^2 = |G|^2 + tr(S)/B, where G is
the true gradient and S the per-example gradients' covariance (McCandlish et al. 2018).
Two batch sizes give unbiased estimates of both (`two_batch_estimates`); their ratio, the
simple noise scale B_simple = tr(S)/|G|^2, is not unbiased, so `NoiseScale` keeps a
bias-corrected moving average of each and divides the averages. With noise scale phi a
step at global batch M does `step_progress` of the work of one at M0: (M/M0) times the
statistical efficiency (phi + M0)/(phi + M) of an example (Pollux, OSDI 2021), which is
also AdaScale's gain for SGD.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def two_batch_estimates(
    small_batch: float, small_sq_norm: float, big_batch: float, big_sq_norm: float
) -> tuple[float, float]:
    """Unbiased estimates of (|G|^2, tr(S)) from the squared norm of a gradient averaged
    over `small_batch` examples and of one averaged over `big_batch` examples (McCandlish
    et al., Appendix A.1). Either may come out negative on one pair: average before
    dividing."""
    if not 0 < small_batch < big_batch:
        raise ValueError(f"need 0 < small batch < big batch, got {small_batch}, {big_batch}")
    g2 = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch)
    trace = (small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch)
    return g2, trace


def replicas_estimates(
    replica_sq_norms: Sequence[float], per_replica: float, global_sq_norm: float
) -> tuple[float, float]:
    """`two_batch_estimates` from a data-parallel step: the replicas' squared gradient norms
    before the all-reduce (their mean is the small batch's), and the all-reduced
    gradient's over every replica's examples."""
    replicas = len(replica_sq_norms)
    if replicas < 2:
        raise ValueError("the two-batch estimate needs at least 2 replicas (or micro-batches)")
    small = sum(replica_sq_norms) / replicas
    return two_batch_estimates(per_replica, small, per_replica * replicas, global_sq_norm)


@dataclass
class NoiseScale:
    """Bias-corrected exponential moving averages of |G|^2 and tr(S), and the noise scale
    as the ratio of the averages. `beta` weighs the past (0.9: about the last ten steps
    count)."""

    beta: float = 0.9
    _g2: float = 0.0
    _trace: float = 0.0
    _weight: float = 0.0  # 1 - beta^n: what the averages' zero start leaves out

    def update(self, g2: float, trace: float) -> None:
        """One step's estimates; a step whose figures are not finite is skipped."""
        if not (math.isfinite(g2) and math.isfinite(trace)):
            return
        self._g2 = self.beta * self._g2 + (1 - self.beta) * g2
        self._trace = self.beta * self._trace + (1 - self.beta) * trace
        self._weight = self.beta * self._weight + (1 - self.beta)

    @property
    def sq_norm(self) -> float:
        """The averaged |G|^2, bias-corrected."""
        return self._g2 / self._weight if self._weight else math.nan

    @property
    def trace(self) -> float:
        """The averaged tr(S), bias-corrected."""
        return self._trace / self._weight if self._weight else math.nan

    def value(self, floor: float = 1e-12) -> float:
        """B_simple = tr(S)/|G|^2 of the averages. An averaged |G|^2 at or below `floor`
        (two replicas' estimate can fall below zero; near zero loss it vanishes) gives NaN:
        the noise is not measurable there, and infinity, which would say every batch scales
        perfectly, is the most optimistic stand-in for a figure missing."""
        if not self._weight:
            return math.nan
        trace = max(self.trace, 0.0)
        return math.nan if self.sq_norm <= floor else trace / self.sq_norm


def efficiency(noise_scale: float, base_batch: float, batch: float) -> float:
    """The statistical efficiency of an example at global batch `batch` against one at
    `base_batch` (Pollux): (phi + M0)/(phi + M). 1 as the noise scale phi grows, M0/M as it
    shrinks; for a batch at or above the base, never above 1."""
    if math.isinf(noise_scale):
        return 1.0
    return (noise_scale + base_batch) / (noise_scale + batch)


def step_progress(noise_scale: float, base_batch: float, batch: float) -> float:
    """How much of a step at `base_batch` one step at `batch` achieves: (M/M0) times the
    efficiency, (1 + phi/M0)/(1 + phi/M). Between 1 (all noise: phi far below both) and
    M/M0 (no noise); a batch may be infinite (`sampled_batch`: the whole split, no noise)."""
    if math.isinf(noise_scale):
        return batch / base_batch
    return (1 + noise_scale / base_batch) / (1 + noise_scale / batch)


def sampled_batch(batch: float, examples: int | None) -> float:
    """The batch whose noise a batch of `batch` examples drawn without replacement from a
    split of `examples` has: its gradient's noise is tr(S)(1/B - 1/N), not tr(S)/B, so
    the quadratic model's noise term takes 1/(1/B - 1/N) for B (a batch of a tenth of the
    split has 10% less noise than the model reads; the whole split, none: infinite).
    `batch` itself where the split's size is not known."""
    if not examples:
        return batch
    if batch >= examples:
        return math.inf
    return 1 / (1 / batch - 1 / examples)


def two_point_noise(base_batch: float, batch: float, measured: float) -> float:
    """The B_noise of McCandlish's hyperbola S = S_min(1 + B_noise/B) through a measured
    pair (`measured`: the steps at `base_batch` over those at `batch`), from
    m = (1 + B/M0)/(1 + B/M): B = (m - 1)/(1/M0 - m/M). Where the pair scaled perfectly
    or better (m at or above M/M0) infinite, where the larger batch took as many steps or
    more (m at or below 1) 0: the hyperbola's ends."""
    if measured <= 1:
        return 0.0
    if measured >= batch / base_batch:
        return math.inf
    return (measured - 1) / (1 / base_batch - measured / batch)


def rule_progress(
    noise_scale: float, base_batch: float, batch: float, gain: float, headroom: float
) -> float:
    """How much of a step at `base_batch` at the base rate one step at `batch` achieves with
    the rate `gain` times the base rate, on McCandlish et al.'s quadratic model of a step
    (Section 2.2): a step at rate e makes e|G|^2 - e^2 (G'HG + tr(HS)/B)/2 of progress,
    greatest at e_opt(B) = e_max/(1 + phi/B). `headroom` is the base rate's share of its
    optimum at the base batch (1: tuned there; near 0: far below it). The rate's share of
    the optimum at `batch` is r = headroom x gain / g*, where g* = `step_progress` is the
    gain that keeps the share (AdaScale's), and a step makes (2r - r^2) of its best: so

        progress = g* (2r - r^2) / (2h - h^2),

    `step_progress` itself for a rule that keeps the share (adascale), the gain itself for a
    rate far below its optimum (headroom -> 0: steps fall as 1/gain), and 0 at r >= 2 (a
    rate twice its optimum or more makes no progress: the training does not converge)."""
    best = step_progress(noise_scale, base_batch, batch)
    if headroom <= 0:
        return gain
    share = headroom * gain / best
    if share >= 2:
        return 0.0
    return best * (2 * share - share**2) / (2 * headroom - headroom**2)


ADAPTIVE = ("adam", "adamw", "adamax", "nadam", "rmsprop", "adagrad", "adadelta", "adafactor",
            "lamb")  # fmt: skip


def is_adaptive(optimizer: str) -> bool:
    """Whether `optimizer` (`tasks.train.optimizers.describe`'s words: `Adam`, `SGD
    (momentum 0.9)`) divides its step by a running root of the squared gradient."""
    words = optimizer.split()
    return bool(words) and words[0].lower() in ADAPTIVE


@dataclass(frozen=True)
class Gain:
    """A rule's gain on the base rate (`rule`), as the quadratic model's SGD rate takes it.
    An adaptive optimizer (`adaptive`: Adam's kind) divides each coordinate's step by the
    root of its second moment, G_i^2 + S_ii/B: at a fixed rate a batch M's step is
    sqrt((1 + phi/M0)/(1 + phi/M)) = sqrt(`step_progress`) larger than one at M0, in SGD's
    terms (reading the noise scale phi as each coordinate's noise over its signal). So at
    the rate its rule gives it, Adam's step is SGD's at `rule` times that root: under
    `sqrt` a batch far below phi keeps the rate's share of its optimum, as SGD does under
    `linear` (Malladi et al., NeurIPS 2022: the square-root rule is Adam's)."""

    rule: float
    adaptive: bool = False

    def factor(self, noise_scale: float, base_batch: float, batch: float) -> float:
        """The step's size at `batch` over the rate's gain: Adam's root, or 1."""
        if not self.adaptive:
            return 1.0
        return math.sqrt(step_progress(noise_scale, base_batch, batch))

    def at(self, noise_scale: float, base_batch: float, batch: float) -> float:
        """The gain SGD's model takes at noise scale `noise_scale`."""
        return self.rule * self.factor(noise_scale, base_batch, batch)


def headroom_from(
    noise_scale: float, base_batch: float, batch: float, gain: float, measured: float
) -> float | None:
    """The base rate's share of its optimum (`rule_progress`'s `headroom`) that explains
    `measured`, the steps to a target at `base_batch` over the steps at `batch` with the
    rate `gain` times the base: solving measured/g* = k(2 - hk)/(2 - h), k = gain/g*, so
    h = 2(k - q)/(k^2 - q) with q = measured/g*. None where the pair says nothing of it (a
    gain that keeps the share: k = 1), or where no headroom in [0, 2) gives the pair with
    its rate below twice its optimum (a pair better than the rate's gain alone allows, or
    worse than any base rate explains: `calibrated` then reads the noise scale)."""
    best = step_progress(noise_scale, base_batch, batch)
    k, q = gain / best, measured / best
    if abs(k - 1) < 1e-6 or abs(k * k - q) < 1e-12:
        return None
    headroom = 2 * (k - q) / (k * k - q)
    if not 0.0 <= headroom < 2.0 or headroom * k >= 2.0:
        return None
    return headroom


NOT_EXPLAINED = -1.0  # `calibrated`'s factor where no headroom and noise scale explain a pair


def calibrated(
    noise_scale: float,
    base_batch: float,
    batch: float,
    gain_at: Callable[[float], float],
    measured: float,
) -> tuple[float | None, float]:
    """What a measured pair (`measured`: the steps to a target at `base_batch` over those at
    `batch`, the rate there `gain_at(phi)` times the base) says of the quadratic model's two
    unknowns, as (headroom, noise factor). One pair cannot tell them apart (a base rate past
    its optimum reads as a noise scale measured low), so the noise scale is taken as
    measured first, and the plan says it assumed so:

    - the headroom in [0, 2) that gives the pair at the measured noise scale
      (`headroom_from`), factor 1;
    - where none does, a base rate at its optimum (headroom 1) and the noise scale
      `factor` times the measured one, in [1/64, 64], that gives it (B_simple can read
      below the critical batch: McCandlish et al., Appendix D; on tfscale's synthetic
      task it read half of it);
    - (None, `NOT_EXPLAINED`) where neither does: the pair is outside what the model can
      make (better than its rate's gain alone allows);
    - (None, 1) where the pair says nothing (a gain that keeps the rate's share of its
      optimum).

    Each returned (headroom, factor) gives the pair back to 1e-6."""
    if keeps_share(noise_scale, base_batch, batch, gain_at(noise_scale)):
        return None, 1.0
    headroom = headroom_from(noise_scale, base_batch, batch, gain_at(noise_scale), measured)
    if headroom is not None:
        return headroom, 1.0
    factor = factor_at_optimum(noise_scale, base_batch, batch, gain_at, measured)
    return (None, NOT_EXPLAINED) if factor is None else (1.0, factor)


def keeps_share(noise_scale: float, base_batch: float, batch: float, gain: float) -> bool:
    """Whether a rate `gain` times the base at `batch` keeps the base rate's share of its
    optimum (it is the optimum's own growth, `step_progress`): a pair then says nothing of
    that share, and `calibrated` reads neither unknown from it."""
    return abs(gain / step_progress(noise_scale, base_batch, batch) - 1) < 1e-6


FACTOR_BOUND = 64.0  # the widest noise factor a pair is read at, either way


def factor_at_optimum(
    noise_scale: float,
    base_batch: float,
    batch: float,
    gain_at: Callable[[float], float],
    measured: float,
) -> float | None:
    """The pair's other reading (`calibrated`): a base rate at its optimum (headroom 1) and
    the factor in [1/64, 64] on the measured noise scale that gives the pair; None where
    no factor there does."""

    def made(factor: float) -> float:  # the pair's steps ratio at headroom 1: rises with it
        phi = noise_scale * factor
        return rule_progress(phi, base_batch, batch, gain_at(phi), 1.0)

    low, high = 1 / FACTOR_BOUND, FACTOR_BOUND
    if not made(low) <= measured <= made(high):
        return None
    for _ in range(80):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if made(middle) < measured else (low, middle)
    return high


def window_estimates(window: dict, variant: str = "raw") -> tuple[float, float] | None:
    """`two_batch_estimates` of a window of norms a training recorded
    (`tasks.train.steps.GradientNoise.read`): of the raw gradient, or (`adam`) as Adam
    preconditions it; None for a window that recorded no step; NaNs where the variant has
    no norms in a window that did."""
    if not window.get("steps") or window.get("small") is None:
        return None
    key = "" if variant == "raw" else f"_{variant}"
    small, big = window.get(f"small{key}"), window.get(f"big{key}")
    if small is None or big is None:
        return math.nan, math.nan
    return two_batch_estimates(window["small_batch"], small, window["big_batch"], big)


LR_RULES = ("auto", "linear", "sqrt", "adascale", "none")


def static_gain(rule: str, scale: float) -> float:
    """The learning-rate gain a fixed rule gives a global batch `scale` times the one the
    base rate was set for: linear, its square root, or none. AdaScale's rules (`adascale`,
    `auto`) start from 1 and follow the noise scale (`AdaptiveGain`)."""
    return {"linear": scale, "sqrt": math.sqrt(scale), "none": 1.0}.get(rule, 1.0)


def planned_gain(rule: str, scale: float, phi: float, base_batch: float) -> float:
    """The gain a rule gives a global batch `scale` times the base rate's `base_batch`, at
    noise scale `phi`: a fixed rule's (`static_gain`), or the one AdaScale's rules settle
    at (`AdaptiveGain`: (M/M0)(phi + M0)/(phi + M); `auto`, its square root)."""
    if rule not in ("adascale", "auto"):
        return static_gain(rule, scale)
    gain = step_progress(phi, base_batch, scale * base_batch)
    return math.sqrt(gain) if rule == "auto" else gain


class AdaptiveGain:
    """AdaScale's learning-rate gain, from the noise scale measured as the training runs:
    r = (M/M0)(phi + M0)/(phi + M) for global batch M against the base rate's M0, between 1
    (phi far below both: a larger batch does no more) and M/M0 (linear, far below the
    critical batch); with `sqrt` (Adam: `auto`) its square root. Each window of norms
    (`tasks.train.steps.GradientNoise.read`) updates the moving averages; the gain goes to
    `variable`, which the learning-rate schedule multiplies its target by."""

    def __init__(self, variable, base_batch: float, batch: float, sqrt: bool, beta: float = 0.5):
        self.variable, self.base_batch, self.batch, self.sqrt = variable, base_batch, batch, sqrt
        self.noise = NoiseScale(beta)

    def update(self, window: dict) -> float | None:
        """The gain after `window` (unchanged by a window that recorded no step)."""
        estimates = window_estimates(window)
        if estimates is None:
            return None
        self.noise.update(*estimates)
        phi = self.noise.value()
        if math.isnan(phi):
            return None
        gain = step_progress(phi, self.base_batch, self.batch)
        gain = math.sqrt(gain) if self.sqrt else gain
        self.variable.assign(gain)
        return gain
