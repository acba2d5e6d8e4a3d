"""The time-to-target comparison of a study's two trainings (`tasks.train.to_target`): the
examples and times to the target over seeds (MLPerf's score), the time-to-target speedup,
the baseline's gradient noise scale and the examples it predicts at the distributed
run's batch, and the summary's sentence of them (`ScalingSummary.to_target`)."""

from __future__ import annotations

import math
from typing import Any

from tasks.measure.noise_scale import predicted_steps_to, trajectory
from tasks.measure.rounds import Spread
from tasks.train.noise_estimates import efficiency
from tasks.train.to_target import OverSeeds, over_seeds, target_text
from tasks.train.training import TrainResult


def target_figures(
    baseline: TrainResult,
    distributed: TrainResult,
    target: float,
    speedup: Spread,
    repeats: tuple[list[dict], list[dict]] = ([], []),
) -> dict[str, Any]:
    """Examples and time to `target` of both trainings, and the time-to-target speedup:
    the examples/s `speedup` times the baseline's examples to target over the
    distributed's. With `repeats` (each training's `to_target` records for more seeds,
    `tasks.report.execute.repeat_to_target`) the examples and times are MLPerf's means over
    the seeds (`tasks.train.to_target.over_seeds`). The range takes the speedup's range and
    the seeds' spread together: its low end is the speedup's lowest round over the fewest
    examples the baseline needed against the most the distributed run did."""
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
        figures.update(
            time_to_target_speedup=speedup.median * b.mean / d.mean,
            time_to_target_speedup_low=speedup.low * b.low / d.high,
            time_to_target_speedup_high=speedup.high * b.high / d.low,
        )
    figures.update(noise_figures(baseline, distributed))
    figures["to_target"] = target_sentence(baseline, distributed, target, speedup, figures, (b, d))
    return figures


def noise_figures(baseline: TrainResult, distributed: TrainResult) -> dict[str, Any]:
    """The baseline's noise scale up to its target (or over its training, where it missed
    it), and the examples to target it predicts at the distributed run's global batch."""
    path = trajectory(baseline.gradient_noise)
    if not path.end_steps:
        return {}
    steps = baseline.to_target.get("steps") if baseline.to_target.get("reached") else None
    low, median, high = path.spread("raw", until=steps)
    figures: dict[str, Any] = {
        "noise_scale": median,
        "noise_scale_low": low,
        "noise_scale_high": high,
        "noise_scale_adam": path.spread("adam", until=steps)[1],
    }
    if steps:
        predicted = predicted_steps_to(
            path, steps, baseline.global_batch, distributed.global_batch, "raw"
        )
        figures["predicted_examples_to_target_distributed"] = predicted * distributed.global_batch
    return {k: v for k, v in figures.items() if v is None or math.isfinite(v)}


def _reached(to_target: dict, key: str) -> float | None:
    return to_target.get(key) if to_target.get("reached") else None


NO_TARGET = "no evaluate.target for the"  # what a summary's answer reads the reason by


def target_sentence(
    baseline: TrainResult,
    distributed: TrainResult,
    target: float,
    speedup: Spread,
    figures: dict[str, Any],
    examples: tuple[OverSeeds, OverSeeds],
) -> str:
    """`time to 95%: 2 replicas 0.93x (0.88-1.02) one device's, in examples/s 1.24x (...):
    5,632 examples to it against 4,224 at global batch 64 against 32`, over how many seeds
    (`examples`: each side's, `target_figures`), or who did not reach it and the best they
    reached."""
    base, dist = baseline.to_target, distributed.to_target
    metric = (base or {}).get("metric", "accuracy")
    head = f"time to {target_text(metric, (base or {}).get('target', target))}"
    if not base or not dist:
        return f"{head}: not measured (evaluate.every_epochs is 0, or there is no test split)"
    if base.get("target", target) is None:
        return f"time to target: not measured: {NO_TARGET} {target_text(metric, None)}"
    seeds = figures["seeds"]
    sides = ((("baseline", base), examples[0]), ((distributed.shape, dist), examples[1]))
    if seeds > 1:
        missed = [
            f"the {name} missed it in {over.missed} of {seeds} seeds"
            for (name, _), over in sides
            if over.mean is None
        ]
    else:
        missed = [
            f"the {name} did not reach it (best {t['best_accuracy']:.4f} at "
            f"{t['best_examples']:,} examples)"
            if t.get("best_accuracy") is not None
            else f"the {name} ended before its first evaluation"
            for (name, t), _ in sides
            if not t.get("reached")
        ]
    if missed:
        return f"{head}: " + "; ".join(missed) + "; more epochs or a lower target"
    spread = Spread(
        figures["time_to_target_speedup"],
        figures["time_to_target_speedup_low"],
        figures["time_to_target_speedup_high"],
    )
    b, d = figures["examples_to_target_baseline"], figures["examples_to_target_distributed"]
    text = (
        f"{head}: {distributed.shape} {spread.text()} one device's, in examples/s "
        f"{speedup.text()}: {d:,.0f} examples to it against {b:,.0f} ({d / b:.2f}x as many) "
        f"at global batch {distributed.global_batch} against {baseline.global_batch}"
    )
    text += _noise_clause(baseline, distributed, figures)
    if seeds > 1:
        dropped = ", the fastest and slowest dropped" if seeds >= 3 else ""
        ranges = [f"{over.low:,.0f}-{over.high:,.0f}" for over in examples]
        text += (
            f"; the mean of {seeds} seeds each{dropped} (MLPerf's score; the baseline's kept "
            f"seeds {ranges[0]}, the {distributed.shape}' {ranges[1]})"
        )
    return text


def _noise_clause(baseline: TrainResult, distributed: TrainResult, figures: dict) -> str:
    """`; the baseline's gradient noise scale 45 (30-60) predicted 5,300 examples for 2
    replicas`, and whether the distributed global batch is past it (each example then
    does less: the statistical efficiency against the baseline's batch)."""
    phi = figures.get("noise_scale")
    if phi is None:
        return ""
    low, high = figures["noise_scale_low"], figures["noise_scale_high"]
    text = f"; the baseline's gradient noise scale {phi:,.0f} ({low:,.0f}-{high:,.0f})"
    predicted = figures.get("predicted_examples_to_target_distributed")
    if predicted is not None:
        text += f" predicted {predicted:,.0f} examples for {distributed.shape}"
    if distributed.global_batch > phi:
        share = efficiency(phi, baseline.global_batch, distributed.global_batch)
        text += (
            f"; global batch {distributed.global_batch} is past it: an example there does "
            f"{share:.2f} of one at {baseline.global_batch}"
        )
    return text
