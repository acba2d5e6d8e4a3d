"""`tfscale plan`: the fastest way to a held-out target on up to N devices, from one run's
measurements. Every configuration of devices (powers of 2 up to N, and N) and per-replica
batch is priced as time to target = predicted steps x predicted step time:

- the step time from the run's cost model (`tasks.report.forecast`: compute per example,
  all-reduce, sync, input) on the named link;
- the steps from the run's own steps to the target and its gradient noise scale
  (`tasks.measure.noise_scale.predicted_steps_to`), with the interval of the noise scale's
  quartiles.

Each figure says which measurement it came from (`Plan.sources`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tasks.core.errors import UsageError
from tasks.measure.noise_scale import predicted_steps_to, trajectory
from tasks.report.forecast import MEASURED, fit_cost_model
from tasks.train.noise_estimates import planned_gain, static_gain, step_progress
from tasks.train.to_target import Target, target_text

BATCHES = (16, 32, 64, 128, 256, 512)  # per replica, searched
# the fewest optimizer steps an epoch a priced global batch leaves: a batch that is a large
# share of the data takes few steps an epoch, each a near-full-data gradient, and its rate
# scaled far past any measured (the digits' 1,437 examples at 8 x 64: 2 steps, 16x the rate)
MIN_STEPS_PER_EPOCH = 8


@dataclass(frozen=True)
class PlanRow:
    devices: int
    per_replica_batch: int
    global_batch: int
    learning_rate: float  # by the run's own rule (`train.lr_scaling`)
    steps: float  # to the target, predicted
    steps_low: float
    steps_high: float
    step_s: float
    time_s: float
    time_low_s: float
    time_high_s: float
    examples_per_s_speedup: float  # against one device at the run's per-replica batch
    time_speedup: float  # time to target, against the same
    past_noise_scale: bool  # the global batch above the noise scale B_simple


@dataclass(frozen=True)
class Plan:
    run_dir: str
    target: float
    metric: str  # the target's (`tasks.train.to_target.Target`)
    link: str
    noise_scale: float
    rows: list[PlanRow]
    best: int  # the fastest row's index
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def fastest(self) -> PlanRow:
        return self.rows[self.best]


def _steps_to(metrics: dict, target: float | None) -> tuple[float, int]:
    """The run's target and its steps to it: the first evaluation at or above `target`
    (default: the run's own target)."""
    own = metrics.get("to_target") or {}
    target = own.get("target") if target is None else target
    evaluations = metrics.get("evaluations") or []
    if target is None or not evaluations:
        raise UsageError(
            f"{metrics.get('run_dir')} has no held-out evaluations during training",
            "plan from a run trained with evaluate.every_epochs above 0 (the default).",
        )
    aim = Target(own.get("metric", "accuracy"), target, own.get("lower_is_better", False))
    for e in evaluations:
        if aim.met(e["accuracy"]):
            return target, int(e["steps"])
    best = aim.best([e["accuracy"] for e in evaluations])
    raise UsageError(
        f"{metrics.get('run_dir')} did not reach {aim.text()} (best {best:.4f})",
        "give a lower --target, or plan from a run that reached it (more --epochs).",
    )


def make_plan(
    metrics: dict,
    devices: int,
    link_name: str,
    link_gbit: float,
    target: float | None = None,
    batches: tuple[int, ...] = BATCHES,
) -> Plan:
    """Every (devices, per-replica batch) priced from the run's `metrics` (its
    metrics.json), on a link of `link_gbit` (`link_name`; MEASURED: the run's own)."""
    if devices < 1:
        raise UsageError(f"--devices must be 1 or more, not {devices}")
    if not batches:
        raise UsageError(
            f"no per-replica batch of {', '.join(map(str, BATCHES))} fits a device of the "
            "memory given",
            "give a larger --device-memory-mb, or cut the model into pipeline stages.",
        )
    target, steps_run = _steps_to(metrics, target)
    path = trajectory(metrics.get("gradient_noise") or [])
    if not path.end_steps:
        raise UsageError(
            f"{metrics.get('run_dir')} recorded no gradient noise scale",
            "plan from a run with train.noise_scale: true (the default) on one_device, "
            "mirrored or multi_worker.",
        )
    low_phi, phi, high_phi = path.headline("raw", until=steps_run)
    if not phi > 0:  # NaN: no window whose batch gradient stood above its noise
        raise UsageError(
            f"{metrics.get('run_dir')} recorded no measurable gradient noise scale: in every "
            "window the batch gradient's squared norm |G|^2 came out at or below zero (the "
            "gradient is all noise at its batches), so no batch's steps can be predicted",
            "plan from a run at a larger global batch or with more steps before the target "
            "(a longer run, or a higher --target).",
        )
    model = fit_cost_model(metrics.get("probes") or {}, metrics.get("history"))
    accum = metrics.get("grad_accum_steps", 1)
    run_batch = metrics["global_batch"] * accum
    own_per_replica = model.per_replica_batch
    link = None if link_name == MEASURED else link_gbit * 1e9 / 8
    # the rule the run's config names (at its base batch the run itself followed `none`);
    # an adaptive rule's recorded rate is its base rate, before the gain it settles at
    followed = metrics.get("lr_scaling") or "linear"
    rule = metrics.get("lr_scaling_rule") or followed
    base_batch = own_per_replica * accum
    base_rate = metrics["learning_rate"] / static_gain(followed, run_batch / base_batch)

    def gain(batch: float) -> float:
        return planned_gain(rule, batch / base_batch, phi, base_batch)

    def steps_at(batch: float) -> tuple[float, float, float]:
        """The steps along the run's noise scale, and the interval of its quartiles held
        constant, widened to the point where a changing noise scale puts it outside."""
        steps = predicted_steps_to(path, steps_run, run_batch, batch, "raw")
        ends = [steps_run / step_progress(q, run_batch, batch) for q in (low_phi, high_phi)]
        return steps, min(*ends, steps), max(*ends, steps)

    one_step = model.compute_s(own_per_replica)
    one_time = steps_at(own_per_replica * accum)[0] * one_step
    one_rate = own_per_replica / one_step
    counts = sorted({*(2**i for i in range(devices.bit_length()) if 2**i <= devices), devices})
    data = _training_examples(metrics)
    rows, too_large = [], 0
    for n in counts:
        for b in batches:
            batch = n * b * accum
            if data is not None and batch * MIN_STEPS_PER_EPOCH > data:
                too_large += 1
                continue
            priced = dataclasses.replace(model, per_replica_batch=b)
            p = priced.predict(n, link, "weak")
            steps, low, high = steps_at(batch)
            rows.append(
                PlanRow(
                    devices=n,
                    per_replica_batch=b,
                    global_batch=n * b,
                    learning_rate=base_rate
                    * planned_gain(rule, batch / base_batch, phi, base_batch),
                    steps=steps,
                    steps_low=low,
                    steps_high=high,
                    step_s=p.step_s,
                    time_s=steps * p.step_s,
                    time_low_s=low * p.step_s,
                    time_high_s=high * p.step_s,
                    examples_per_s_speedup=p.examples_per_s / one_rate,
                    time_speedup=one_time / (steps * p.step_s),
                    past_noise_scale=batch > phi,
                )
            )
    if not rows:
        raise UsageError(
            f"every global batch priced leaves fewer than {MIN_STEPS_PER_EPOCH} steps an epoch "
            f"of the run's {data:,} training examples",
            "plan for fewer devices (--devices), or from a run on more data.",
        )
    best = min(range(len(rows)), key=lambda i: rows[i].time_s)
    sources = {
        "step time": f"the cost model fitted to the run's probes (compute at per-replica "
        f"batches {_probed_batches(metrics)}, the all-reduce at 3 sizes; fit errors "
        f"{model.compute_fit_error:.1%} and {model.comm_fit_error:.1%}); other batches "
        "extrapolate its line",
        "steps to target": f"the run's {steps_run} steps to {target:g} at global batch "
        f"{run_batch}, scaled by its gradient noise scale {phi:,.0f} (quartiles "
        f"{low_phi:,.0f}-{high_phi:,.0f}, {path.recorded_steps} steps recorded)",
        "learning rate": f"the run's base rate {base_rate:g} scaled {rule}"
        + (
            f" (the gain it settles at with the noise scale {phi:,.0f})"
            if rule in ("adascale", "auto")
            else ""
        ),
        "link": link_name if link is None else f"{link_name} ({link_gbit:g} Gbit/s)",
        "batches": ", ".join(map(str, batches))
        + ("" if batches == BATCHES else " (those that fit --device-memory-mb)")
        + (
            f"; {too_large} device counts and batches left out: a global batch over "
            f"{data // MIN_STEPS_PER_EPOCH:,} leaves fewer than {MIN_STEPS_PER_EPOCH} steps an "
            f"epoch of the {data:,} training examples"
            if too_large
            else ""
        ),
    }
    metric = (metrics.get("to_target") or {}).get("metric", "accuracy")
    return Plan(str(metrics.get("run_dir")), target, metric, link_name, phi, rows, best, sources)


def _training_examples(metrics: dict) -> int | None:
    """The run's training examples, as its epochs of full batches count them (None where
    its metrics do not say)."""
    steps = metrics.get("steps_per_epoch")
    if not steps:
        return None
    return int(steps) * int(metrics["global_batch"]) * int(metrics.get("grad_accum_steps", 1))


def _probed_batches(metrics: dict) -> str:
    measured = (metrics.get("probes") or {}).get("local_step_s_by_batch") or []
    return ", ".join(str(int(b)) for b, _ in measured) or "?"


def format_plan(plan: Plan) -> str:
    """The table, the recommendation and where each figure came from."""
    head = (
        f"{'devices':>7} {'batch':>6} {'global':>7} {'rate':>9} {'steps':>8} {'step ms':>8} "
        f"{'time to target':>22} {'ex/s':>6} {'to target':>9}  past B_simple"
    )
    lines = [
        f"the fastest way to {target_text(plan.metric, plan.target)} on {plan.link}, from "
        f"{plan.run_dir}",
        "",
        head,
        "-" * len(head),
    ]
    for i, r in enumerate(plan.rows):
        time = f"{r.time_s:.3g} s ({r.time_low_s:.3g}-{r.time_high_s:.3g})"
        mark = " <- fastest" if i == plan.best else ""
        lines.append(
            f"{r.devices:>7} {r.per_replica_batch:>6} {r.global_batch:>7} "
            f"{r.learning_rate:>9.2g} {r.steps:>8,.0f} {r.step_s * 1000:>8.2f} {time:>22} "
            f"{r.examples_per_s_speedup:>5.2f}x {r.time_speedup:>8.2f}x  "
            f"{'yes' if r.past_noise_scale else 'no'}{mark}"
        )
    f = plan.fastest
    lines += [
        "",
        f"fastest: {f.devices} device{'s' if f.devices > 1 else ''} at {f.per_replica_batch} "
        f"per replica (global {f.global_batch}): {f.time_s:.3g} s to {plan.target:g} "
        f"({f.time_low_s:.3g}-{f.time_high_s:.3g}), {f.time_speedup:.2f}x one device's time; "
        f"in examples/s {f.examples_per_s_speedup:.2f}x",
        "from:",
        *[f"  {k:<16}{v}" for k, v in plan.sources.items()],
    ]
    if not math.isfinite(plan.noise_scale):
        lines.append("  (the noise scale is unbounded: every batch counts in full)")
    return "\n".join(lines)
