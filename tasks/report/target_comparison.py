"""The time-to-target comparison of a study's two trainings (`tasks.train.to_target`): the
examples and times to the target over seeds (MLPerf's score), the time-to-target speedup,
the baseline's gradient noise scale and the examples it predicts at the distributed
run's batch, and the summary's sentence of them (`ScalingSummary.to_target`)."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

from tfscale.tasks.measure.noise_trajectory import (
    RuleSteps,
    interval_text,
    rule_steps,
    split_examples,
    trajectory,
)
from tfscale.tasks.measure.rounds import Spread, ratio_t_interval
from tfscale.tasks.train.noise_estimates import efficiency, is_adaptive
from tfscale.tasks.train.to_target import (
    SEED_SPREAD,
    SEED_SPREADS_MEASURED,
    OverSeeds,
    over_seeds,
    target_text,
)

if TYPE_CHECKING:  # the training module imports TensorFlow, which `tfscale plan` never needs
    from tfscale.tasks.train.result import TrainResult

DRAWS = 2000  # the interval's draws


def target_figures(
    baseline: TrainResult,
    distributed: TrainResult,
    target: tuple[float | None, str],
    speedup: Spread,
    repeats: tuple[list[dict], list[dict]] = ([], []),
    speedup_kind: str = "",
) -> dict[str, Any]:
    """Examples and time to `target` (its value and metric: the trainings' recorded ones,
    else the config's) of both trainings, and the time-to-target speedup:
    the examples/s `speedup` times the baseline's examples to target over the
    distributed's. With `repeats` (each training's `to_target` records for more seeds,
    `tasks.execute.trainings.repeat_to_target`) the examples and times are MLPerf's means over
    the seeds (`tasks.train.to_target.over_seeds`). Its 95% interval takes every source of
    doubt together (`speedup_interval`): `speedup`'s must be a 95% interval
    (`tasks.measure.rounds.interval_95`, what it is in words: `speedup_kind`), never the
    rounds' lowest to highest."""
    base = [baseline.to_target, *repeats[0]]
    dist = [distributed.to_target, *repeats[1]]
    examples = [over_seeds([_reached(t, "examples") for t in side]) for side in (base, dist)]
    seconds = [over_seeds([_reached(t, "seconds") for t in side]) for side in (base, dist)]
    figures: dict[str, Any] = {
        "seeds": len(base),
        "examples_to_target_baseline": examples[0].mean,
        "examples_to_target_distributed": examples[1].mean,
        "time_to_target_s_baseline": seconds[0].mean,
        "time_to_target_s_distributed": seconds[1].mean,
        "examples_to_target_by_seed": [list(examples[0].values), list(examples[1].values)],
    }
    (b, d) = examples
    if b.mean is not None and d.mean is not None:
        every = (base[0].get("every_examples") or 0, dist[0].get("every_examples") or 0)
        figures.update(time_figures(speedup, (b, d), every))
    figures.update(noise_figures(baseline, distributed))
    figures["to_target"] = target_sentence(
        baseline, distributed, target, (speedup, speedup_kind), figures, (b, d)
    )
    return figures


def time_figures(
    speedup: Spread, examples: tuple[OverSeeds, OverSeeds], every: tuple[int, int]
) -> dict[str, Any]:
    """The time-to-target speedup, with its 95% interval (`speedup_interval`). One seed a
    side cannot show its own spread: the interval assumes `SEED_SPREAD` (said in words,
    `seed_spread_assumed`)."""
    (b, d) = examples
    values = (b.values, d.values)
    point = speedup.median * b.mean / d.mean
    low, high = speedup_interval(speedup, values, every)
    figures: dict[str, Any] = {
        "time_to_target_speedup": point,
        "time_to_target_speedup_low": min(low, point),
        "time_to_target_speedup_high": max(high, point),
    }
    if b.seeds == 1 or d.seeds == 1:
        figures["seed_spread_assumed"] = SEED_SPREAD_ASSUMED
    return figures


# what a one-seed interval says of the seed spread it took, in the text and the JSON
SEED_SPREAD_ASSUMED = f"assuming a {SEED_SPREAD:.0%} seed spread, not measured here"


def speedup_interval(
    speedup: Spread,
    examples: tuple[tuple, tuple],
    every: tuple[int, int],
    seed_spread: float = SEED_SPREAD,
) -> tuple[float, float]:
    """The time-to-target speedup's 95% interval, from every source of doubt at once:
    - the rounds': the examples/s speedup's 95% interval, as a log-normal of that width
      (the normal whose 95% ends are the interval's; a t-interval of a few rounds has
      heavier tails, its ends are what is kept). It must be a 95% interval: the rounds'
      lowest to highest, read as +-1.96 sigma, made 2 rounds' (their median between them
      half the time) or 3 rounds' (75%) as sure as a 95% interval;
    - the seeds': with two or more a side, a two-sample t-interval of the ratio of the
      sides' geometric means of examples to target (`rounds.ratio_t_interval`: pooled, the
      rounds' doubt beside the seeds'), whose seeds' crossings already vary by where in
      its evaluation interval each fell; an end unbounded where a side's seed never
      reached the target. A bootstrap over the seeds held the truth 70% of the time with
      2 a side, 91% with 3 (`benchmarks/interval_coverage.py`). With one seed a side,
      drawn (seeded: the same figures give the same interval): that seed's examples
      spread as `seed_spread` (`SEED_SPREAD`, measured for a task) does, since one seed
      cannot show its own spread, and where its crossing fell: in the evaluation interval
      before the evaluation that found it (`every`: each side's)."""
    width = math.log(speedup.high / speedup.low) if speedup.low > 0 else 0.0
    rounds_sigma = width / (2 * 1.96)
    if min(len(examples[0]), len(examples[1])) > 1:
        return seeds_interval(speedup.median, examples, rounds_sigma)
    draw = random.Random(0)

    def side(values: tuple, interval: int) -> float:
        mean = values[0] * math.exp(draw.gauss(0.0, seed_spread))
        return max(mean - draw.random() * interval, 1.0)

    ratios = sorted(
        speedup.median
        * math.exp(draw.gauss(0.0, rounds_sigma))
        * side(examples[0], every[0])
        / side(examples[1], every[1])
        for _ in range(DRAWS)
    )
    return ratios[int(0.025 * DRAWS)], ratios[int(0.975 * DRAWS) - 1]


def seeds_interval(
    scale: float, examples: tuple[tuple, tuple], known_sigma: float = 0.0
) -> tuple[float, float]:
    """`scale` times the 95% interval of the baseline's examples to target over the
    distributed run's, over seeds (`rounds.ratio_t_interval` of the seeds that reached
    it, `known_sigma` beside them): the low end 0 where a distributed seed never reached
    the target, the high end infinite where a baseline's did not, and both where a side
    has fewer than 2 seeds that reached it."""
    reached = [[v for v in side if v is not None] for side in examples]
    if min(len(side) for side in reached) < 2:
        return 0.0, math.inf
    low, high = ratio_t_interval(reached[0], reached[1], known_sigma)
    base_missed, dist_missed = (len(r) < len(e) for r, e in zip(reached, examples, strict=True))
    return 0.0 if dist_missed else scale * low, math.inf if base_missed else scale * high


def noise_figures(baseline: TrainResult, distributed: TrainResult) -> dict[str, Any]:
    """The baseline's noise scale up to its target (or over its training, where it missed
    it; `Trajectory.headline`), and the examples to target it predicts at the distributed
    run's global batch for the rate the distributed run's rule gave it (`rule_steps`: a
    range where that depends on how near its optimum the base rate was)."""
    path = trajectory(baseline.gradient_noise, examples=split_examples(baseline))
    if not path.end_steps:
        return {}
    steps = baseline.to_target.get("steps") if baseline.to_target.get("reached") else None
    low, value, high = path.headline("raw", until=steps)
    figures: dict[str, Any] = {
        "noise_scale": value,
        "noise_scale_low": low,
        "noise_scale_high": high,
        "noise_scale_adam": path.headline_value("adam", until=steps),
    }
    if steps and math.isfinite(value):
        base_batch, batch = effective_batch(baseline), effective_batch(distributed)
        rule = distributed.lr_scaling
        adaptive = is_adaptive(distributed.optimizer)
        predicted = rule_steps(path, steps, (base_batch, batch), rule, adaptive=adaptive)
        figures.update(
            predicted_examples_to_target_distributed=None
            if predicted.steps is None
            else predicted.steps * batch,
            predicted_examples_to_target_low=predicted.low * batch,
            predicted_examples_to_target_high=predicted.high * batch,
            predicted_for_rule=predicted.rule,
        )
    return {k: v for k, v in figures.items() if not isinstance(v, float) or math.isfinite(v)}


def effective_batch(result: TrainResult) -> int:
    """The examples of one optimizer step: the global batch times its accumulation."""
    return result.global_batch * max(result.grad_accum_steps, 1)


def _reached(to_target: dict, key: str) -> float | None:
    return to_target.get(key) if to_target.get("reached") else None


NO_TARGET = "no evaluate.target for the"  # what a summary's answer reads the reason by


def target_sentence(
    baseline: TrainResult,
    distributed: TrainResult,
    target: tuple[float | None, str],
    speedup: tuple[Spread, str],
    figures: dict[str, Any],
    examples: tuple[OverSeeds, OverSeeds],
) -> str:
    """`time to 95%: 2 replicas 0.93x (0.88-1.02) one device's, in examples/s 1.24x (...:
    what its 95% interval is): 5,632 examples to it against 4,224 at global batch 64
    against 32`, over how many seeds (`examples`: each side's, `target_figures`; one seed:
    what it assumed, and whether that decides), or who did not reach it and the best they
    reached. `speedup`: the examples/s speedup and what its interval is, in words."""
    speedup, kind = speedup
    base, dist = baseline.to_target, distributed.to_target
    value, metric = target  # as the trainings recorded it, else as given (`summary._aimed`)
    if value is None:  # a metric with no target (a real-valued label's error): evaluated or not
        return f"time to target: not measured: {NO_TARGET} {target_text(metric, None)}"
    head = f"time to {target_text(metric, value)}"
    if not base or not dist:
        return f"{head}: not measured (evaluate.every_epochs is 0, or there is no test split)"
    missed = _missed(baseline, distributed, figures["seeds"], examples)
    if missed:
        return f"{head}: " + "; ".join(missed) + "; more epochs or a lower target"
    spread = Spread(
        figures["time_to_target_speedup"],
        figures["time_to_target_speedup_low"],
        figures["time_to_target_speedup_high"],
    )
    b, d = figures["examples_to_target_baseline"], figures["examples_to_target_distributed"]
    speed = speedup.text()[:-1] + f": {kind})" if kind else speedup.text()
    text = (
        f"{head}: {distributed.shape} {spread.text()} one device's, in examples/s "
        f"{speed}: {d:,.0f} examples to it against {b:,.0f} ({d / b:.2f}x as many) "
        f"at global batch {distributed.global_batch} against {baseline.global_batch}"
    )
    text += _clock_clause(figures) + _noise_clause(baseline, distributed, figures)
    return text + _seeds_clause(figures, distributed.shape, examples)


def _missed(
    baseline: TrainResult,
    distributed: TrainResult,
    seeds: int,
    examples: tuple[OverSeeds, OverSeeds],
) -> list[str]:
    """Who did not reach the target: in how many seeds, or (one seed) the best reached."""
    sides = (
        (("baseline", baseline.to_target), examples[0]),
        ((distributed.shape, distributed.to_target), examples[1]),
    )
    if seeds > 1:
        return [
            f"the {name} missed it in {over.missed} of {seeds} seeds"
            for (name, _), over in sides
            if over.mean is None
        ]
    return [
        f"the {name} did not reach it (best {t['best_accuracy']:.4f} at "
        f"{t['best_examples']:,} examples)"
        if t.get("best_accuracy") is not None
        else f"the {name} ended before its first evaluation"
        for (name, t), _ in sides
        if not t.get("reached")
    ]


def _seeds_clause(figures: dict, shape: str, examples: tuple[OverSeeds, OverSeeds]) -> str:
    """What the figures are over: MLPerf's mean of the seeds, or one seed and what its
    interval assumed; below `VERDICT_SEEDS`, that they are too few to tell."""
    seeds = figures["seeds"]
    if seeds == 1:
        return "; " + one_seed_text(figures)
    dropped = ", the fastest and slowest dropped" if seeds >= 3 else ""
    ranges = [f"{over.low:,.0f}-{over.high:,.0f}" for over in examples]
    few = f"; {undecided(seeds)}" if seeds < VERDICT_SEEDS else ""
    return (
        f"; the mean of {seeds} seeds each{dropped} (MLPerf's score; the baseline's kept "
        f"seeds {ranges[0]}, the {shape}' {ranges[1]}){few}"
    )


def one_seed_text(figures: dict) -> str:
    """`one seed is too few to tell which finishes sooner (--seeds 3 narrows the interval);
    its interval takes the evaluation interval, assuming a 37% seed spread, not measured
    here (the judge's seed spreads pooled over its tasks: ...)`."""
    return (
        f"{undecided(figures['seeds'])}; its interval takes the evaluation interval, "
        f"{SEED_SPREAD_ASSUMED} ({SEED_SPREADS_MEASURED})"
    )


# the seeds a side below which no verdict of who finishes sooner is given: with 2, the
# pooled t has 2 degrees of freedom (4.30) and a bootstrap's "95%" held the truth 70% of the time
VERDICT_SEEDS = 3


def undecided(seeds: int) -> str:
    """What a time to target over fewer than `VERDICT_SEEDS` seeds a side says of who
    finishes sooner: that they are too few to tell, and how to narrow its interval."""
    few = "one seed is" if seeds == 1 else f"{seeds} seeds are"
    more = max(VERDICT_SEEDS, seeds + 1)
    return f"{few} too few to tell which finishes sooner (--seeds {more} narrows the interval)"


def _noise_clause(baseline: TrainResult, distributed: TrainResult, figures: dict) -> str:
    """`; the baseline's gradient noise scale B_simple 45 (30-60) predicted 5,300 examples for 2
    replicas at linear's rate` (a range where that depends on how near its optimum the base
    rate was), and whether the distributed global batch is past it (each example then does
    less: the statistical efficiency against the baseline's batch)."""
    phi = figures.get("noise_scale")
    if phi is None:
        return ""
    low, high = figures["noise_scale_low"], figures.get("noise_scale_high", math.inf)
    text = f"; the baseline's gradient noise scale B_simple {phi:,.0f} ({interval_text(low, high)})"
    rule = figures.get("predicted_for_rule")
    if rule is not None:
        point = figures.get("predicted_examples_to_target_distributed")
        low = figures.get("predicted_examples_to_target_low", math.nan)
        high = figures.get("predicted_examples_to_target_high", math.inf)  # inf: dropped
        span = RuleSteps(rule, point, low, high).text()  # in examples already
        text += f" predicted {span} examples for {distributed.shape} at {rule}'s rate"
        if point is None:
            text += " (from a base rate far below its best to one at it)"
    base_batch, batch = effective_batch(baseline), effective_batch(distributed)
    if batch > phi:
        share = efficiency(phi, base_batch, batch)
        text += (
            f"; global batch {batch} is past it: an example there does about "
            f"{share:.2f} of one at {base_batch} (B_simple read as the critical batch, "
            "which it can read below)"
        )
    return text


def _clock_clause(figures: dict) -> str:
    """`; on the trainings' own clocks, MLPerf's (tracing and evaluation in them, one run
    after the other), 2.2 s against 2.9 s`."""
    base, dist = (
        figures.get("time_to_target_s_baseline"),
        figures.get("time_to_target_s_distributed"),
    )
    if not base or not dist:
        return ""
    return (
        f"; on the trainings' own clocks, MLPerf's (tracing and evaluation in them, one run "
        f"after the other), {dist:.1f} s against {base:.1f} s: {base / dist:.2f}x"
    )
