"""The gradient noise scale's estimators and what they predict
(`tasks/measure/noise_trajectory.py`), checked against a problem whose true gradient and
covariance are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tfscale.tasks.measure.noise_trajectory import Hyperbola, fit_steps_hyperbola, predicted_steps
from tfscale.tasks.train.noise_estimates import (
    NoiseScale,
    efficiency,
    replicas_estimates,
    step_progress,
    two_batch_estimates,
)


class LinearRegression:
    """Squared loss 0.5 (x.w - y)^2 with x ~ N(0, I_D), y = x.w* + noise of variance s2,
    at a fixed w: a per-example gradient is g = x (x.d - n), d = w - w*. Then
    G = E[g] = d and S = Cov(g) = d d^T + (|d|^2 + s2) I, so tr(S) = |d|^2 (1 + D) + D s2."""

    def __init__(self, dim: int = 8, noise: float = 0.5, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.d = self.rng.normal(size=dim) * 0.3
        self.dim, self.noise = dim, noise

    @property
    def sq_norm(self) -> float:
        return float(self.d @ self.d)

    @property
    def trace(self) -> float:
        return self.sq_norm * (1 + self.dim) + self.dim * self.noise**2

    def gradients(self, n: int) -> np.ndarray:
        """`n` per-example gradients, one a row."""
        x = self.rng.normal(size=(n, self.dim))
        residual = x @ self.d - self.rng.normal(scale=self.noise, size=n)
        return x * residual[:, None]


def test_the_two_batch_estimates_are_unbiased_for_a_known_gradient_and_covariance():
    """Data-parallel steps of 4 replicas of 8 examples: each replica's squared norm before
    the all-reduce and the all-reduced one's. Over 20,000 steps the mean of each estimate
    lies within 3 standard errors of the truth (and the truth is not trivially met: B_simple
    is about 12 here, between the two batches)."""
    problem, replicas, per_replica, steps = LinearRegression(), 4, 8, 20_000
    g2s, traces = [], []
    for _ in range(steps):
        grads = problem.gradients(replicas * per_replica).reshape(replicas, per_replica, -1)
        replica_means = grads.mean(axis=1)
        small = [float(g @ g) for g in replica_means]
        big = replica_means.mean(axis=0)
        g2, trace = replicas_estimates(small, per_replica, float(big @ big))
        g2s.append(g2)
        traces.append(trace)
    for estimates, truth in ((g2s, problem.sq_norm), (traces, problem.trace)):
        mean, se = np.mean(estimates), np.std(estimates) / math.sqrt(steps)
        assert abs(mean - truth) < 3 * se, (mean, truth, se)
        assert se < 0.05 * truth  # precise enough for the check to mean something


def test_the_moving_average_is_bias_corrected_and_skips_non_finite_steps():
    scale = NoiseScale(beta=0.9)
    assert math.isnan(scale.value())
    scale.update(2.0, 10.0)
    assert scale.sq_norm == pytest.approx(2.0) and scale.value() == pytest.approx(5.0)
    scale.update(math.nan, 10.0)  # a step whose loss scale overflowed
    scale.update(2.0, math.inf)
    assert scale.value() == pytest.approx(5.0)
    for _ in range(50):
        scale.update(1.0, 10.0)
    assert scale.value() == pytest.approx(10.0, rel=0.02)
    assert NoiseScale().value() != NoiseScale().value()  # nan before any step
    gone = NoiseScale()
    gone.update(-1.0, 3.0)
    assert math.isnan(gone.value())  # not measurable: never infinity's perfect scaling


def test_the_efficiency_is_one_with_all_signal_the_base_over_the_batch_with_all_noise():
    m0, m = 32, 512
    assert efficiency(1e12, m0, m) == pytest.approx(1.0, rel=1e-6)
    assert efficiency(math.inf, m0, m) == 1.0
    assert efficiency(0.0, m0, m) == pytest.approx(m0 / m)
    phis = [0.0, 1, 10, 100, 1_000, 10_000]
    by_phi = [efficiency(phi, m0, m) for phi in phis]
    assert by_phi == sorted(by_phi) and all(0 < e <= 1 for e in by_phi)
    for phi in phis:
        by_batch = [efficiency(phi, m0, b) for b in (32, 64, 128, 1024)]
        assert by_batch == sorted(by_batch, reverse=True) and max(by_batch) <= 1
        assert step_progress(phi, m0, m0) == 1.0


def test_predicted_steps_go_from_perfect_scaling_to_none_as_the_noise_scale_falls():
    base_steps, m0, m = 600, 32, 128
    assert predicted_steps([1e12] * base_steps, m0, m) == pytest.approx(base_steps * m0 / m)
    assert predicted_steps([0.0] * base_steps, m0, m) == pytest.approx(base_steps)
    # a rising trajectory (the noise scale grows as training goes on): between the two
    rising = list(np.linspace(40, 200, base_steps))
    assert base_steps * m0 / m < predicted_steps(rising, m0, m) < base_steps
    assert predicted_steps(rising, m0, m0) == pytest.approx(base_steps)
    # the figures FACTS records for digits: phi about 200, M = 512 from M0 = 32
    assert predicted_steps([200.0] * 550, 32, 512) == pytest.approx(550 * 32 / 512 * 712 / 232)


def test_the_hyperbola_fit_recovers_the_planted_minimum_steps_and_examples():
    planted = Hyperbola(s_min=150.0, b_noise=400.0)
    batches = [16, 32, 64, 128, 512]
    fitted = fit_steps_hyperbola(batches, [planted.steps(b) for b in batches])
    assert fitted.s_min == pytest.approx(150.0) and fitted.e_min == pytest.approx(60_000.0)
    assert fitted.b_crit == pytest.approx(400.0)
    rng = np.random.default_rng(3)
    noisy = [planted.steps(b) * rng.normal(1, 0.03) for b in batches]
    rough = fit_steps_hyperbola(batches, noisy)
    assert rough.s_min == pytest.approx(150.0, rel=0.2)
    assert rough.e_min == pytest.approx(60_000.0, rel=0.2)


def test_bad_inputs_are_refused_with_what_is_needed():
    with pytest.raises(ValueError, match="small batch < big batch"):
        two_batch_estimates(64, 1.0, 32, 1.0)
    with pytest.raises(ValueError, match="at least 2 replicas"):
        replicas_estimates([1.0], 32, 1.0)
    with pytest.raises(ValueError, match="three or more"):
        fit_steps_hyperbola([32, 64], [100, 60])
    with pytest.raises(ValueError, match="do not fall"):
        fit_steps_hyperbola([32, 64, 128], [50, 100, 200])


def _window(end: int, steps: int, g2: float, trace: float, small=16, big=32, adam=None) -> dict:
    """A window of norms as a training records it, from a planted |G|^2 and tr(S)."""
    a_g2, a_trace = adam or (g2, trace)
    return {
        "end_step": end,
        "steps": steps,
        "small": g2 + trace / small,
        "big": g2 + trace / big,
        "small_adam": a_g2 + a_trace / small,
        "big_adam": a_g2 + a_trace / big,
        "small_batch": small,
        "big_batch": big,
    }


def test_a_trajectory_recovers_each_windows_planted_noise_scale_and_averages_them():
    """Windows planted at B_simple 20, then 60 (and 200 under Adam's preconditioning): each
    window's own value is exact; the averages of |G|^2 and tr(S) weigh the newer window
    twice the older (beta 0.5, bias-corrected: the first window is its own), and an empty
    window (no recorded call) adds nothing."""
    from tfscale.tasks.measure.noise_trajectory import trajectory

    windows = [
        _window(22, 10, 1.0, 20.0, adam=(1.0, 200.0)),
        {"end_step": 44, "steps": 0, "small": None, "big": None, "small_batch": 16},
        _window(66, 10, 0.5, 30.0, adam=(1.0, 200.0)),
    ]
    path = trajectory(windows)
    assert path.end_steps == (22, 66) and path.recorded_steps == 20
    assert path.window["raw"] == pytest.approx((20.0, 60.0))
    assert path.window["adam"] == pytest.approx((200.0, 200.0))
    # after the second window: |G|^2 (0.25 x 1 + 0.5 x 0.5)/0.75, tr(S) (0.25 x 20 + 0.5 x 30)
    # /0.75: 40
    assert path.averaged["raw"] == pytest.approx((20.0, 40.0))
    assert path.at(10, "raw") == pytest.approx(20.0)  # before any window ended: the first
    assert path.at(66, "raw") == pytest.approx(40.0)
    # the headline: the ratio of the step-weighted means, tr 25 over |G|^2 0.75; its
    # bootstrap over the two windows draws 20 (the first twice), 33.3 or 60
    assert path.headline("raw") == pytest.approx((20.0, 100 / 3, 60.0))
    assert path.headline("raw", until=30) == pytest.approx((20.0, 20.0, 20.0))
    # its value alone (what a walk along the path needs), without the bootstrap
    assert path.headline_value("raw") == pytest.approx(100 / 3)
    assert path.headline_value("raw", until=30) == pytest.approx(20.0)
    assert math.isnan(path.headline_value("raw", until=5))  # no window ended yet


def test_steps_to_target_at_another_batch_follow_the_efficiency_of_each_step():
    """A constant noise scale phi = 32: a training at 32 that reached the target in 100
    steps needs 100 x (32/64) x (32+64)/(32+32) = 75 steps at 64 (a quarter saved, not
    half); with no noise (phi near 0) every example counts as at 32 and 64 saves nothing
    (100 steps: each step's progress is 1); with all noise, half (50)."""
    from tfscale.tasks.measure.noise_trajectory import predicted_steps_to, trajectory

    path = trajectory([_window(50, 10, 1.0, 32.0, small=16, big=32)])
    assert predicted_steps_to(path, 100, 32, 64, "raw") == pytest.approx(75.0)
    noiseless = trajectory([_window(50, 10, 1.0, 1e-9, small=16, big=32)])
    assert predicted_steps_to(noiseless, 100, 32, 64, "raw") == pytest.approx(100.0, rel=1e-6)
    all_noise = trajectory([_window(50, 10, 1.0, 1e9, small=16, big=32)])
    assert predicted_steps_to(all_noise, 100, 32, 64, "raw") == pytest.approx(50.0, rel=1e-6)


def _replica_windows(problem: LinearRegression, steps: int, per_replica: int) -> list[dict]:
    """What 2 replicas of `per_replica` examples record, a window a step."""
    windows = []
    for step in range(1, steps + 1):
        grads = problem.gradients(2 * per_replica)
        replicas = [grads[:per_replica].mean(0), grads[per_replica:].mean(0)]
        whole = grads.mean(0)
        windows.append(
            {
                "end_step": step,
                "steps": 1,
                "small": float(np.mean([r @ r for r in replicas])),
                "big": float(whole @ whole),
                "small_batch": per_replica,
                "big_batch": 2 * per_replica,
            }
        )
    return windows


def test_the_headline_noise_scale_counts_every_window_and_divides_the_averages():
    """2 replicas of 8 examples, a true noise scale of 56: a single step's |G|^2 estimate
    comes out at or below zero in about a third of the windows. The ratio of the averaged
    estimates, every window counted, holds the truth in its interval; the median of the
    windows' own ratios with those windows dropped reads under half of it."""
    from tfscale.tasks.measure.noise_trajectory import trajectory

    problem = LinearRegression(noise=1.5, seed=1)
    truth = problem.trace / problem.sq_norm
    path = trajectory(_replica_windows(problem, 2000, 8))
    low, value, high = path.headline("raw")
    assert low < truth < high and value == pytest.approx(truth, rel=0.15)
    own = sorted(v for v in path.window["raw"] if math.isfinite(v))
    assert len(own) < 0.75 * 2000  # the windows a median of ratios would have dropped
    assert own[len(own) // 2] < truth / 2


def test_the_noise_scale_is_corrected_for_batches_drawn_from_a_small_split():
    """256 examples, 2 replicas of 32 drawn without replacement each epoch: the two-batch
    estimate reads |G|^2 - tr(S)/256, so the uncorrected noise scale reads high, its
    interval above the population's own; told the split's size, the interval holds it."""
    from tfscale.tasks.measure.noise_trajectory import trajectory

    population = LinearRegression(noise=2.0, seed=2).gradients(256)
    mean = population.mean(0)
    truth = float(((population - mean) ** 2).sum(1).mean()) / float(mean @ mean)
    rng = np.random.default_rng(0)
    windows = []
    for _ in range(300):
        order = rng.permutation(256)
        for k in range(4):
            grads = population[order[64 * k : 64 * (k + 1)]]
            replicas = [grads[:32].mean(0), grads[32:].mean(0)]
            whole = grads.mean(0)
            windows.append(
                {
                    "end_step": len(windows) + 1,
                    "steps": 1,
                    "small": float(np.mean([r @ r for r in replicas])),
                    "big": float(whole @ whole),
                    "small_batch": 32,
                    "big_batch": 64,
                }
            )
    plain = trajectory(windows).headline("raw")
    corrected = trajectory(windows, examples=256).headline("raw")
    assert plain[0] > truth
    assert corrected[0] < truth < corrected[2]


def test_a_noise_scale_measurable_nowhere_predicts_nothing_rather_than_perfect_scaling():
    """Every window's |G|^2 at or below zero: no figure, where infinity (every batch below
    the noise, so steps falling as 1/B) would have been the most optimistic answer."""
    from tfscale.tasks.measure.noise_trajectory import predicted_steps_to, trajectory

    noise_only = {"end_step": 50, "steps": 10, "small_batch": 16, "big_batch": 32}
    path = trajectory([noise_only | {"small": 3.0, "big": 1.4}])  # (32 x 1.4 - 16 x 3)/16 < 0
    assert math.isnan(path.headline("raw")[1])
    assert math.isnan(path.headline_value("raw"))
    assert math.isnan(predicted_steps_to(path, 100, 32, 64, "raw"))


def test_a_rules_progress_follows_the_quadratic_model_and_its_headroom_is_recovered():
    """McCandlish's quadratic model at noise scale 64, base batch 32: a rule that keeps
    the rate's share of its optimum (AdaScale's gain) makes step_progress whatever that
    share; a base rate far below its optimum makes steps fall as 1/gain; a rate twice its
    optimum or more makes no progress; and the share a measured pair implies is the one
    planted, for a gain above the share-keeping one and below it."""
    from tfscale.tasks.train.noise_estimates import headroom_from, rule_progress

    best = step_progress(64.0, 32, 128)
    for share in (0.1, 0.5, 1.0):
        assert rule_progress(64.0, 32, 128, best, share) == pytest.approx(best)
    assert rule_progress(64.0, 32, 128, 4.0, 1e-9) == pytest.approx(4.0, rel=1e-6)
    assert rule_progress(64.0, 32, 128, 2 * best / 0.9, 0.9) == 0.0
    # at the base batch with the base rate, a step is a base step
    assert rule_progress(64.0, 32, 32, 1.0, 0.7) == pytest.approx(1.0)
    for gain in (4.0, 1.5):  # above the share-keeping gain of 2, and below it
        for share in (0.2, 0.6, 0.9):
            made = rule_progress(64.0, 32, 128, gain, share)
            assert headroom_from(64.0, 32, 128, gain, made) == pytest.approx(share)
    assert headroom_from(64.0, 32, 128, best, best) is None  # the pair says nothing of it


def test_steps_for_a_fixed_rule_are_a_range_until_its_headroom_is_known():
    """Linear's doubled rate at batch 64 (noise scale 32): from 50 steps (a base rate far
    below its optimum: each step does twice the work) to the steps of a rate at it, which
    overshoots; with the headroom known, the point; adascale's, the point without it."""
    from tfscale.tasks.measure.noise_trajectory import rule_steps, trajectory

    # by hand: the share-keeping gain g* = (64/32)(32 + 32)/(32 + 64) = 4/3, and a step at
    # gain 2 and headroom h makes g* (2r - r^2)/(2h - h^2) of a base step, r = 2h/g*:
    # h = 1: r = 1.5, (4/3)(3 - 2.25)/1 = 1, so 100 / 1 = 100 steps;
    # h = 0.5: r = 0.75, (4/3)(1.5 - 0.5625)/0.75 = 5/3, so 100 / (5/3) = 60 steps
    path = trajectory([_window(50, 10, 1.0, 32.0, small=16, big=32)])
    linear = rule_steps(path, 100, (32, 64), "linear")
    assert linear.steps is None
    assert (linear.low, linear.high) == pytest.approx((50.0, 100.0))
    known = rule_steps(path, 100, (32, 64), "linear", headroom=0.5)
    assert known.steps == pytest.approx(60.0)
    assert rule_steps(path, 100, (32, 64), "adascale").steps == pytest.approx(75.0)


def test_a_pair_made_at_a_headroom_reads_back_as_that_headroom_under_either_gain():
    """A pair made at headroom 0.5 with the noise scale as measured reads back as headroom
    0.5, factor 1, under sqrt's gain and linear's; a gain that keeps the rate's share of
    its optimum says nothing of either."""
    from tfscale.tasks.train.noise_estimates import calibrated, rule_progress

    for gain in (2**0.5, 2.0):
        made = rule_progress(60.0, 32, 64, gain, 0.5)
        assert calibrated(60.0, 32, 64, lambda _, g=gain: g, made) == pytest.approx((0.5, 1.0))
    best = step_progress(60.0, 32, 64)
    assert calibrated(60.0, 32, 64, lambda _: best, best) == (None, 1.0)


# Each branch of `calibrated`, worked by hand at base batch 32 and batch 64, where the
# share-keeping gain is g* = 2(phi + 32)/(phi + 64) and a pair at headroom h and gain g
# gives g (2 - h g/g*)/(2 - h): so h = 2(k - q)/(k^2 - q), k = g/g*, q = measured/g*.


def test_linear_past_what_a_base_rate_at_its_optimum_allows_reads_a_headroom_above_1():
    """Noise scale 100, linear's gain 2, a measured ratio of 1.30: g* = 1.6098, k = 1.2424,
    q = 0.8076, so h = 1.1816 (a base rate 18% past its optimum), which gives 1.3000 back.
    A base rate at its optimum would give 1.515: the pair is not that."""
    from tfscale.tasks.train.noise_estimates import calibrated, rule_progress

    headroom, factor = calibrated(100.0, 32, 64, lambda _: 2.0, 1.30)
    assert (headroom, factor) == pytest.approx((1.1816, 1.0), abs=1e-4)
    assert rule_progress(100.0, 32, 64, 2.0, headroom) == pytest.approx(1.30, rel=1e-6)
    assert rule_progress(100.0, 32, 64, 2.0, 1.0) == pytest.approx(1.5152, abs=1e-4)


def test_sqrt_beating_a_base_rate_at_its_optimum_assumes_the_measured_noise_scale():
    """Noise scale 61, sqrt's gain 1.4142, a measured ratio of 1.6: g* = 1.4880, k = 0.9504,
    q = 1.0753, so h = 1.4520 with the noise scale as measured (the plan says it assumed
    that), where a base rate at its optimum needs a noise scale 1.77x the measured one."""
    from tfscale.tasks.train.noise_estimates import calibrated

    sqrt = 2**0.5
    assert calibrated(61.0, 32, 64, lambda _: sqrt, 1.6) == pytest.approx((1.4520, 1.0), abs=1e-4)


def test_a_pair_read_as_a_headroom_has_its_other_reading_at_a_base_rate_at_its_optimum():
    """Noise scale 64, linear's gain 2, a measured 1.6: g* = 1.5, k = 4/3, q = 16/15, so
    h = 2(4/3 - 16/15)/(16/9 - 16/15) = 0.75 as measured. At headroom 1 a pair makes
    g*' k'(2 - k') = 4 - 4/g*' = 4f/(1 + 2f) with the noise 64f (g*' = (1 + 2f)/(1 + f)),
    so f = m/(4 - 2m) = 2: the other reading. Past 2 (f -> infinity) none gives it: 1.99
    needs f = 99.5, beyond the bound of 64."""
    from tfscale.tasks.train.noise_estimates import calibrated, factor_at_optimum, rule_progress

    assert calibrated(64.0, 32, 64, lambda _: 2.0, 1.6) == pytest.approx((0.75, 1.0))
    assert factor_at_optimum(64.0, 32, 64, lambda _: 2.0, 1.6) == pytest.approx(2.0)
    assert rule_progress(128.0, 32, 64, 2.0, 1.0) == pytest.approx(1.6)
    assert factor_at_optimum(64.0, 32, 64, lambda _: 2.0, 1.9) == pytest.approx(9.5)
    assert factor_at_optimum(64.0, 32, 64, lambda _: 2.0, 1.99) is None


def test_sqrt_worse_than_its_gain_alone_reads_a_noise_scale_measured_high():
    """Noise scale 61, sqrt's gain, a measured ratio of 1.3, below the gain 1.4142 a base
    rate far below its optimum gives: no headroom in [0, 2) (h = 5.18), so a base rate at
    its optimum, which gives 2g - g^2/g*: g* = 2/(2.8284 - 1.3) = 1.3085, so phi = 28.56,
    0.4682 of the measured 61."""
    from tfscale.tasks.train.noise_estimates import calibrated, rule_progress

    sqrt = 2**0.5
    headroom, factor = calibrated(61.0, 32, 64, lambda _: sqrt, 1.3)
    assert (headroom, factor) == pytest.approx((1.0, 0.4682), abs=1e-4)
    assert rule_progress(61.0 * factor, 32, 64, sqrt, 1.0) == pytest.approx(1.3, rel=1e-6)


def test_a_pair_better_than_its_rates_gain_allows_is_not_explained():
    """Linear's gain 2 and a measured 2.1: no headroom gives more than the gain itself
    (h -> 0), and at headroom 1 no noise scale gives more than 2 either."""
    from tfscale.tasks.train.noise_estimates import NOT_EXPLAINED, calibrated

    assert calibrated(100.0, 32, 64, lambda _: 2.0, 2.1) == (None, NOT_EXPLAINED)


def test_the_headline_interval_reads_a_draw_of_no_measurable_noise_as_unbounded():
    """Eight windows of which only one has a positive |G|^2 large enough to carry the mean
    above zero: every draw without it (about (7/8)^8 = 34% of them) has no measurable noise
    scale and reads infinity, so the high end is unbounded; sorting NaN left it anywhere."""
    from tfscale.tasks.measure.noise_trajectory import interval_text, trajectory

    windows = [_window(10, 10, 8.0, 40.0)]
    windows += [_window(10 * (i + 2), 10, -0.5, 40.0) for i in range(7)]
    low, value, high = trajectory(windows).headline("raw")
    assert value == pytest.approx(40.0 / 0.5625) and math.isinf(high)
    assert math.isfinite(low) and low <= value
    assert interval_text(low, high).endswith("-unbounded")


def test_one_noisy_window_past_twice_its_optimum_does_not_make_a_reached_target_never():
    """Linear's gain 4 at batch 128 (base 32), headroom 1: at noise scale 1 the rate is
    4/g* = 4/1.03 of its optimum, past twice it, so a step there makes no progress (the
    quadratic model's g*(2r - r^2) < 0). A first window reading noise scale 1 over 4 of 100
    steps: those steps are priced at the headline noise scale, and the prediction is the
    sum of 1/progress over the steps. The same window over 30 of them: "never"."""
    from tfscale.tasks.measure.noise_trajectory import predicted_steps_to, trajectory

    def progress(phi: float) -> float:  # headroom 1, by hand
        best = 4 * (phi + 32) / (phi + 128)
        share = 4 / best
        return max(best * (2 * share - share**2), 0.0)

    assert progress(1.0) == 0.0 and progress(1000.0) > 0
    for noisy_until, expected_never in ((5, False), (31, True)):
        path = trajectory(
            [
                _window(noisy_until - 1, noisy_until - 1, 10.0, 10.0),
                _window(noisy_until, 1, 1.0, 1000.0),
                _window(100, 100 - noisy_until, 1.0, 1000.0),
            ]
        )
        got = predicted_steps_to(path, 100, 32, 128, "raw", progress)
        if expected_never:
            assert math.isinf(got)
            continue
        headline = path.headline("raw", until=100)[1]
        in_force = [path.at(t, "raw") for t in range(1, 101)]
        assert sum(p == pytest.approx(1.0) for p in in_force) == 4  # the stalled steps
        expected = sum(1 / progress(headline if progress(p) <= 0 else p) for p in in_force)
        assert got == pytest.approx(expected) and math.isfinite(got)


def test_an_adaptive_optimizers_step_grows_by_the_root_of_the_batchs_step_progress():
    """Adam's step at one rate, in SGD's terms: sqrt((1 + phi/M0)/(1 + phi/M)); at phi 64,
    32 to 64: sqrt(3/2) = 1.2247. Far below the noise scale (phi 1e9) its `sqrt` gain 2 at
    4x the batch is a step 2 x sqrt(4) = 4 = g*: the rate keeps its share of its optimum,
    so a step makes g* = 4 of a base step, as SGD's does under `linear`."""
    from tfscale.tasks.train.noise_estimates import Gain, is_adaptive, rule_progress

    assert Gain(2.0, adaptive=True).factor(64.0, 32, 64) == pytest.approx(1.224745, abs=1e-6)
    assert Gain(2.0, adaptive=True).at(64.0, 32, 64) == pytest.approx(2.449490, abs=1e-6)
    assert Gain(2.0).at(64.0, 32, 64) == 2.0
    step = Gain(2.0, adaptive=True).at(1e9, 32, 128)
    assert step == pytest.approx(4.0, rel=1e-6)
    assert rule_progress(1e9, 32, 128, step, 0.5) == pytest.approx(4.0, rel=1e-6)
    assert [is_adaptive(o) for o in ("Adam", "AdamW", "RMSprop", "SGD (momentum 0.9)", "")] == [
        True, True, True, False, False
    ]  # fmt: skip
