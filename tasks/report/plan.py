"""`tfscale plan`: the fastest way to a held-out target on up to N devices, from one run's
measurements. Every configuration of devices (powers of 2 up to N, and N) and per-replica
batch is priced as time to target = predicted steps x predicted step time + evaluations
and epochs' fixed costs:

- the step time from the run's cost model (`tasks.report.forecast`: compute per example,
  all-reduce, sync, input) on the named link;
- the steps from the run's own steps to the target, its gradient noise scale and the rate
  its learning-rate rule gives each batch, calibrated from the study's baseline
  (`Pricing`; `tasks.measure.noise_trajectory`), with the interval of the noise scale's
  95% bounds and the run's own seed doubt;
- no rate above the highest measured to reach the target, and no global batch that leaves
  fewer than `MIN_STEPS_PER_EPOCH` steps an epoch.

Each figure says which measurement it came from (`Plan.sources`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tasks.core.errors import UsageError
from tasks.measure.noise_trajectory import (
    Trajectory,
    interval_text,
    predicted_steps_to,
    split_examples,
    trajectory,
)
from tasks.report.forecast import MEASURED, fit_cost_model
from tasks.train.noise_estimates import (
    NOT_EXPLAINED,
    calibrated,
    planned_gain,
    rule_progress,
    static_gain,
    step_progress,
)
from tasks.train.to_target import SEED_SPREAD, Target, target_text

BATCHES = (16, 32, 64, 128, 256, 512)  # per replica, searched
# the fewest optimizer steps an epoch a priced global batch leaves: a batch that is a large
# share of the data takes few steps an epoch, each a near-full-data gradient, and its rate
# scaled far past any measured (the digits' 1,437 examples at 8 x 64: 2 steps, 16x the rate)
MIN_STEPS_PER_EPOCH = 8
# how each rule's predicted steps compared with trainings on seeds the predictor never saw
# (`benchmarks/rule_predictions.py`, the synthetic task, docs/time-to-accuracy.md)
JUDGED = {
    "linear": "judged on seeds it never saw (synthetic task): 1.05x and 1.30x the measured "
    "steps at 0.5x and 2x the base batch; its failure at 4x and 8x foreseen",
    "sqrt": "judged on seeds it never saw (synthetic task): 1.04x-1.25x the measured steps "
    "at 0.5x-8x the base batch, closer than steps falling as 1/B or staying constant",
}


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
    rate_capped: bool = False  # the rule's rate held at the highest measured to reach it


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
    rule: str = "linear"  # the learning-rate rule priced (`Pricing.rule`)

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


@dataclass(frozen=True)
class Pricing:
    """How a plan turns a batch into steps to the target: the run's steps along its noise
    scale, each step's progress by the rate the rule gives the batch (`rule_progress`, on
    the base rate's `headroom`: calibrated from the study's baseline beside the run, with
    the noise scale `noise_factor` times the measured one where a base rate at its optimum
    cannot explain the pair (`calibrated`); None: the rule is `adascale`, whose steps need
    none), that rate capped at the highest one measured to reach the target."""

    path: Trajectory
    steps_run: int
    run_batch: int  # the run's examples a step (its global batch times its accumulation)
    base_batch: int  # the batch the base rate is for (one replica's, times accumulation)
    accum: int  # micro-batches a step
    base_rate: float
    rule: str
    headroom: float | None
    cap: float  # the highest rate measured to reach the target, as a gain over the base
    noise: tuple[float, float, float]  # the headline noise scale (low, value, high)
    noise_factor: float = 1.0
    seed_spread: float = SEED_SPREAD  # of the run's own steps to the target (log, one sd)

    def asked(self, batch: float, phi: float) -> float:
        """The gain the rule gives `batch` at noise scale `phi`, before the cap."""
        return planned_gain(self.rule, batch / self.base_batch, phi, self.base_batch)

    def gain(self, batch: float, phi: float) -> float:
        return min(self.asked(batch, phi), self.cap)

    def capped(self, batch: float) -> bool:
        return self.asked(batch, self.noise[1]) > self.cap * (1 + 1e-9)

    def priceable(self, batch: float) -> bool:
        """Whether `batch`'s steps are known: the rule calibrated, or its rate within the
        cap (an uncalibrated rule's steps at a capped rate are not)."""
        return self.headroom is not None or not self.capped(batch)

    def made(self, phi: float, batch: float) -> float:
        """One step's progress at `batch` against one at the base batch and rate."""
        if self.headroom is None:
            return step_progress(phi, self.base_batch, batch)
        gain = self.gain(batch, phi)  # an adaptive rule's, from the noise scale it measures
        return rule_progress(phi * self.noise_factor, self.base_batch, batch, gain, self.headroom)

    def steps(self, batch: float) -> tuple[float, float, float]:
        """The steps along the run's noise scale, and the interval of the headline's
        bounds held constant, widened to the point where a changing noise scale puts it
        outside, and by the run's own steps' doubt (`seed_spread`: a seed's spread over the
        seeds they are a mean of); infinite where the rate makes no progress."""

        def relative(phi: float) -> float:
            run = self.made(phi, self.run_batch)
            return self.made(phi, batch) / run if run > 0 else 0.0

        steps = predicted_steps_to(
            self.path, self.steps_run, self.run_batch, batch, "raw", relative
        )
        ends = [
            self.steps_run / made if (made := relative(q)) > 0 else math.inf
            for q in (self.noise[0], self.noise[2])
        ]
        doubt = math.exp(1.96 * self.seed_spread)
        return steps, min(*ends, steps) / doubt, max(*ends, steps) * doubt


@dataclass(frozen=True)
class FixedCosts:
    """What a training to the target spends beside its steps: an evaluation's seconds
    (each `every_examples`) and an epoch's fixed cost (`CostModel.epoch_overhead_s`), each
    example of the `data` training examples once an epoch."""

    evaluation_s: float
    every_examples: int
    epoch_s: float
    data: int | None

    def seconds(self, examples: float) -> float:
        evaluations = examples / self.every_examples if self.every_examples else 0.0
        epochs = examples / self.data if self.data else 0.0
        return evaluations * self.evaluation_s + epochs * self.epoch_s


def make_plan(
    metrics: dict,
    devices: int,
    link_name: str,
    link_gbit: float,
    target: float | None = None,
    batches: tuple[int, ...] = BATCHES,
    study: dict | None = None,
) -> Plan:
    """Every (devices, per-replica batch) priced from the run's `metrics` (its
    metrics.json), on a link of `link_gbit` (`link_name`; MEASURED: the run's own); its
    learning-rate rule calibrated from `study` (the run's summary.json: the baseline's
    examples to the target beside its own)."""
    _check_asked(devices, batches)
    target, steps_run = _steps_to(metrics, target)
    model = fit_cost_model(metrics.get("probes") or {}, metrics.get("history"))
    if study is not None and not _same_target(study.get("target_accuracy"), target):
        study = None  # its two trainings were compared at another target
    pricing, rule_source = pricing_of(metrics, steps_run, model.per_replica_batch, study)
    link = None if link_name == MEASURED else link_gbit * 1e9 / 8
    costs = _fixed_costs(metrics, model, pricing.run_batch)
    one_step = model.compute_s(pricing.base_batch)
    one_steps = pricing.steps(pricing.base_batch)[0]
    one = (one_steps * one_step + costs.seconds(one_steps * pricing.base_batch), one_step)
    rows, left_out = _rows(pricing, model, link, costs, devices, batches, one)
    if not rows:
        raise UsageError(
            f"every global batch priced leaves fewer than {MIN_STEPS_PER_EPOCH} steps an epoch "
            f"of the run's {costs.data:,} training examples, or needs a rate above the "
            "highest measured to reach the target",
            "plan for fewer devices (--devices), or from a run on more data.",
        )
    best = min(range(len(rows)), key=lambda i: rows[i].time_s)
    sources = _sources(metrics, model, pricing, costs, target, batches, left_out, rule_source)
    sources["link"] = link_name if link is None else f"{link_name} ({link_gbit:g} Gbit/s)"
    metric = (metrics.get("to_target") or {}).get("metric", "accuracy")
    return Plan(
        str(metrics.get("run_dir")), target, metric, link_name, pricing.noise[1], rows, best,
        sources, pricing.rule,
    )  # fmt: skip


def check_devices(devices: int) -> None:
    """The most devices to plan for is a count: a usage error, checked before the run is
    looked for."""
    if devices < 1:
        raise UsageError(
            f"--devices must be 1 or more, not {devices}",
            "give the most devices the plan may use (--devices 8 prices 1, 2, 4 and 8).",
        )


def _check_asked(devices: int, batches: tuple[int, ...]) -> None:
    check_devices(devices)
    if not batches:
        raise UsageError(
            f"no per-replica batch of {', '.join(map(str, BATCHES))} fits a device of the "
            "memory given",
            "give a larger --device-memory-mb, or cut the model into pipeline stages.",
        )


def _noise_of(metrics: dict, steps_run: int) -> tuple[Trajectory, tuple[float, float, float]]:
    """The run's noise scale along its steps and its headline up to the target; refused
    where it recorded none, or none measurable."""
    path = trajectory(metrics.get("gradient_noise") or [], examples=split_examples(metrics))
    if not path.end_steps:
        raise UsageError(
            f"{metrics.get('run_dir')} recorded no gradient noise scale",
            "plan from a run with train.noise_scale: true (the default) on one_device, "
            "mirrored or multi_worker.",
        )
    noise = path.headline("raw", until=steps_run)
    if not noise[1] > 0:  # NaN: the windows' mean |G|^2 at or below zero
        raise UsageError(
            f"{metrics.get('run_dir')} recorded no measurable gradient noise scale: over its "
            "windows the batch gradient's squared norm |G|^2 came out at or below zero on "
            "average (the gradient is all noise at its batches), so no batch's steps can be "
            "predicted",
            "plan from a run at a larger global batch or with more steps before the target "
            "(a longer run, or a higher --target).",
        )
    return path, noise


def _same_target(theirs: float | None, ours: float) -> bool:
    return theirs is not None and math.isclose(theirs, ours, rel_tol=1e-9)


def pricing_of(
    metrics: dict, steps_run: int, base_batch: int, study: dict | None
) -> tuple[Pricing, str]:
    """The plan's `Pricing`, and where its rule's headroom came from (words). The rule is
    the run's config's (at its base batch the run itself followed `none`); an adaptive
    rule's recorded rate is its base rate. A fixed rule the study cannot calibrate is
    priced as `adascale`, whose steps the noise scale predicts whatever the headroom."""
    path, noise = _noise_of(metrics, steps_run)
    run_batch = metrics["global_batch"] * metrics.get("grad_accum_steps", 1)
    followed = metrics.get("lr_scaling") or "linear"
    rule = metrics.get("lr_scaling_rule") or followed
    base_rate = metrics["learning_rate"] / static_gain(followed, run_batch / base_batch)
    cap = max(planned_gain(rule, run_batch / base_batch, noise[1], base_batch), 1.0)
    (headroom, factor), source = _headroom(study, rule, noise[1], base_batch, run_batch)
    if headroom is None and rule != "adascale":
        source = f"{source}; so priced as adascale, whose steps need no calibration"
        rule = "adascale"  # its rate held at the run's, which reached the target
    accum = metrics.get("grad_accum_steps", 1)
    # the steps are the run's own crossing, one seed's, however many seeds the study ran
    # beside it: their doubt is a seed's (dividing it by the study's seeds understated it
    # sqrt(3)-fold at 5)
    pricing = Pricing(
        path, steps_run, run_batch, base_batch, accum, base_rate, rule, headroom, cap, noise,
        factor, SEED_SPREAD,
    )  # fmt: skip
    return pricing, source


def _headroom(
    study: dict | None, rule: str, phi: float, base_batch: int, run_batch: int
) -> tuple[tuple[float | None, float], str]:
    """The base rate's share of its optimum and the noise scale's factor that the study's
    two trainings imply (`calibrated`): the baseline's steps to the target at the base
    batch against the run's at its own, with the rule's gain; and where that came from."""
    if rule == "adascale":
        return (None, 1.0), "adascale keeps the rate's share of its optimum: no calibration"
    study = study or {}
    base_examples = study.get("examples_to_target_baseline")
    run_examples = study.get("examples_to_target_distributed")
    if not base_examples or not run_examples or run_batch == base_batch:
        return (None, 1.0), (
            f"{rule} not calibrated: no baseline at batch {base_batch} reached the target "
            "beside the run (plan from a `tfscale run`'s distributed run)"
        )
    measured = (base_examples / base_batch) / (run_examples / run_batch)
    gain = planned_gain(rule, run_batch / base_batch, phi, base_batch)
    headroom, factor = calibrated(phi, base_batch, run_batch, lambda _: gain, measured)
    pair = (
        f"the baseline's {base_examples / base_batch:,.0f} steps at batch {base_batch} against "
        f"the run's {run_examples / run_batch:,.0f} at {run_batch} ({study.get('seeds', 1)} "
        f"seed{'s' if study.get('seeds', 1) > 1 else ''}, {measured:.2f}x)"
    )
    if factor == NOT_EXPLAINED:
        return (None, 1.0), (
            f"{rule} not calibrated: no base rate and noise scale of the model explain {pair} "
            f"(the larger batch did better than {rule}'s gain of {gain:.2f} allows)"
        )
    if headroom is None:
        return (None, 1.0), f"{rule}'s gain here keeps the rate's share of its optimum"
    said = (
        f"put the base rate at {headroom:.2f} of its optimum; one pair, two unknowns: "
        "assumed the noise scale as measured (a larger one would explain the pair too)"
        if factor == 1.0
        else "need a noise scale other than the measured: one pair, two unknowns: assumed a "
        f"base rate at its optimum and the noise scale {factor:.2f}x the measured"
    )
    return (headroom, factor), f"{rule}, calibrated: {pair} {said}"


def _fixed_costs(metrics: dict, model: Any, run_batch: int) -> FixedCosts:
    """The run's evaluation seconds (`evaluation_seconds`) and epoch fixed cost."""
    every = int((metrics.get("to_target") or {}).get("every_examples") or 0)
    return FixedCosts(
        evaluation_seconds(metrics, _step_seconds(metrics, run_batch)),
        every,
        model.epoch_overhead_s,
        split_examples(metrics),
    )


def _step_seconds(metrics: dict, run_batch: int) -> float:
    """A training step's seconds on the run's own clock: the median over its epochs after
    the first (which traces) of an epoch's seconds over its steps."""
    history = [h for h in metrics.get("history") or [] if h.get("examples")]
    timed = history[1:] or history
    per_step = sorted(h["seconds"] / (h["examples"] / run_batch) for h in timed)
    return per_step[len(per_step) // 2] if per_step else 0.0


def evaluation_seconds(metrics: dict, step_s: float) -> float:
    """One held-out evaluation's seconds: the median, over the run's evaluations after its
    first epoch (the first traces), of the clock between two evaluations beyond the steps
    between them at `step_s` each; 0 where the run has too few to tell."""
    evaluations = metrics.get("evaluations") or []
    first_epoch = metrics.get("steps_per_epoch") or 0
    gaps = sorted(
        max(now["seconds"] - then["seconds"] - (now["steps"] - then["steps"]) * step_s, 0.0)
        for then, now in zip(evaluations, evaluations[1:], strict=False)
        if then["steps"] > first_epoch and "seconds" in now and "seconds" in then
    )
    return gaps[len(gaps) // 2] if gaps else 0.0


def _rows(
    pricing: Pricing,
    model: Any,
    link: float | None,
    costs: FixedCosts,
    devices: int,
    batches: tuple[int, ...],
    one: tuple[float, float],
) -> tuple[list[PlanRow], dict[str, int]]:
    """Each (devices, per-replica batch) priced; and how many were left out, and why: too
    few steps an epoch, or (where the rule's headroom is unknown) a rate above the cap."""
    counts = sorted({*(2**i for i in range(devices.bit_length()) if 2**i <= devices), devices})
    rows, left_out = [], {"steps an epoch": 0, "rate": 0}
    for n in counts:
        for b in batches:
            batch = n * b * pricing.accum
            if costs.data is not None and batch * MIN_STEPS_PER_EPOCH > costs.data:
                left_out["steps an epoch"] += 1
                continue
            if not pricing.priceable(batch):
                left_out["rate"] += 1
                continue
            rows.append(_row(pricing, model, link, costs, n, b, batch, one))
    return rows, left_out


def _row(
    pricing: Pricing,
    model: Any,
    link: float | None,
    costs: FixedCosts,
    n: int,
    b: int,
    batch: int,
    one: tuple[float, float],
) -> PlanRow:
    """One configuration: its step from the cost model, its steps from the pricing, its
    time with the evaluations and epochs the steps take."""
    priced = dataclasses.replace(model, per_replica_batch=b * pricing.accum)
    p = priced.predict(n, link, "weak")
    steps, low, high = pricing.steps(batch)
    time = [s * p.step_s + costs.seconds(s * batch) for s in (steps, low, high)]
    phi = pricing.noise[1]
    return PlanRow(
        devices=n,
        per_replica_batch=b,
        global_batch=n * b,
        learning_rate=pricing.base_rate * pricing.gain(batch, phi),
        steps=steps,
        steps_low=low,
        steps_high=high,
        step_s=p.step_s,
        time_s=time[0],
        time_low_s=time[1],
        time_high_s=time[2],
        examples_per_s_speedup=p.examples_per_s / (model.per_replica_batch / one[1]),
        time_speedup=one[0] / time[0] if time[0] > 0 else 0.0,
        past_noise_scale=batch > phi,
        rate_capped=pricing.capped(batch),
    )


def _sources(
    metrics: dict,
    model: Any,
    pricing: Pricing,
    costs: FixedCosts,
    target: float,
    batches: tuple[int, ...],
    left_out: dict[str, int],
    rule_source: str,
) -> dict[str, str]:
    """Where each figure came from, in words."""
    low, phi, high = pricing.noise
    accum = pricing.accum
    cap = pricing.base_rate * pricing.cap
    return {
        "step time": f"the cost model fitted to the run's probes (compute at per-replica "
        f"batches {_probed_batches(metrics)}, the all-reduce at 3 sizes; fit errors "
        f"{model.compute_fit_error:.1%} and {model.comm_fit_error:.1%}); other batches "
        "extrapolate its line",
        "steps to target": f"the run's {pricing.steps_run} steps to {target:g} at global batch "
        f"{pricing.run_batch}, scaled by its gradient noise scale {phi:,.0f} (95% interval "
        f"{interval_text(low, high)}, {pricing.path.recorded_steps} steps recorded) and the "
        f"rate each batch gets",
        "learning rate": f"the run's base rate {pricing.base_rate:g} scaled {pricing.rule}, "
        f"never above {cap:g}, the highest rate measured to reach the target (the run's); "
        f"{rule_source}",
        "how well": JUDGED.get(
            pricing.rule,
            f"{pricing.rule}'s predictions have not been judged against trainings they did not "
            "see: its figures are the model's alone",
        ),
        "fixed costs": f"an evaluation {costs.evaluation_s * 1000:.0f} ms every "
        f"{costs.every_examples:,} examples, an epoch {costs.epoch_s * 1000:.0f} ms beside its "
        "steps, from the run's own clock",
        "batches": _batches_source(batches, left_out, costs.data, cap)
        + (f"; each step accumulates {accum} micro-batches" if accum > 1 else ""),
    }


def _batches_source(
    batches: tuple[int, ...], left_out: dict[str, int], data: int | None, cap: float
) -> str:
    text = ", ".join(map(str, batches)) + (
        "" if batches == BATCHES else " (those that fit --device-memory-mb)"
    )
    if left_out["steps an epoch"] and data:
        text += (
            f"; {left_out['steps an epoch']} device counts and batches left out: a global batch "
            f"over {data // MIN_STEPS_PER_EPOCH:,} leaves fewer than {MIN_STEPS_PER_EPOCH} steps "
            f"an epoch of the {data:,} training examples"
        )
    if left_out["rate"]:
        text += (
            f"; {left_out['rate']} left out: their rate would pass {cap:g}, the highest "
            "measured to reach the target, and without a calibrated rule their steps at a "
            "capped rate are unknown"
        )
    return text


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
        f"the fastest way to {target_text(plan.metric, plan.target)} on {plan.link}, the rate "
        f"scaled {plan.rule}, from {plan.run_dir}",
        "",
        head,
        "-" * len(head),
    ]
    for i, r in enumerate(plan.rows):
        time = f"{r.time_s:.3g} s ({r.time_low_s:.3g}-{r.time_high_s:.3g})"
        mark = " <- fastest" if i == plan.best else ""
        lines.append(
            f"{r.devices:>7} {r.per_replica_batch:>6} {r.global_batch:>7} "
            f"{r.learning_rate:>8.2g}{'*' if r.rate_capped else ' '} {r.steps:>8,.0f} "
            f"{r.step_s * 1000:>8.2f} {time:>22} "
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
    if any(r.rate_capped for r in plan.rows):
        lines.insert(
            4 + len(plan.rows), "* the rule's rate held at the highest measured to reach the target"
        )
    return "\n".join(lines)
