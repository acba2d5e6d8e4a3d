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
import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.measure.noise_trajectory import (
    Trajectory,
    interval_text,
    predicted_steps_to,
    split_examples,
    trajectory,
)
from tfscale.tasks.measure.rounds import t_975
from tfscale.tasks.report.forecast import MEASURED, fit_cost_model
from tfscale.tasks.report.target_comparison import seeds_interval
from tfscale.tasks.train.noise_estimates import (
    FACTOR_BOUND,
    NOT_EXPLAINED,
    Gain,
    calibrated,
    factor_at_optimum,
    headroom_from,
    is_adaptive,
    keeps_share,
    planned_gain,
    rule_progress,
    sampled_batch,
    static_gain,
    step_progress,
    two_point_noise,
)
from tfscale.tasks.train.to_target import SEED_SPREAD, Target

BATCHES = (16, 32, 64, 128, 256, 512)  # per replica, searched
# the fewest optimizer steps an epoch a priced global batch leaves: a batch that is a large
# share of the data takes few steps an epoch, each a near-full-data gradient, and its rate
# scaled far past any measured (the digits' 1,437 examples at 8 x 64: 2 steps, 16x the rate)
MIN_STEPS_PER_EPOCH = 8
# how each rule's predicted steps compared with trainings on seeds the predictor never saw
# (`benchmarks/rule_predictions.py`, docs/time-to-accuracy.md): the synthetic task with
# Adam, a table task with SGD and digits' CNN with Adam; the predictor's 5 seeds at the
# base batch and 5 at twice it, 10 other seeds at 0.5, 4 and 8 times it (the 2x row is the
# calibration point, not a test); the judge split in halves disagrees with itself (its
# noise floor) by up to 1.14x on the synthetic task, 1.28x on digits, 3.6x on the table
JUDGED = {
    "linear": "judged on three tasks, 10 unseen seeds a batch at 0.5x, 4x and 8x the base "
    "batch: its 95% interval held every row. With Adam (a synthetic task, digits' CNN) "
    "the points ran 0.86-1.22x the measured, closer than the two-point hyperbola where "
    "they differ at 4x and 8x (0.98x and 0.86x against 1.60x and 1.80x on the synthetic "
    "task, 1.08x and 1.22x against 0.64x and 0.39x on digits; on 10 fresh seeds "
    "0.83-1.13x), 1.08x at 0.5x on the synthetic task (the hyperbola 0.94x), whose "
    "predictor's seeds ran 1.19x the judge's at their configuration; the judge's noise "
    "floor 0.76-1.20. On a table task with SGD 0.93-1.02x, but its floor (0.5-3.6) passes "
    "any predictor within 2x",
    "sqrt": "judged on three tasks, 10 unseen seeds a batch at 0.5x, 4x and 8x the base "
    "batch: its 95% interval held every row. With Adam (a synthetic task, digits' CNN) "
    "the points ran 1.00-1.06x the measured at 4x and 8x, within the judge's noise floor "
    "as the two-point hyperbola's (0.93-1.00x; floor 0.78-1.14), 1.20x at 0.5x on the "
    "synthetic task and 0.78x on digits; on 10 fresh seeds a batch 0.84-1.12x. On a table "
    "task with SGD 0.86-1.26x, but its floor (0.5-3.6) passes any predictor within 2x",
}
ADAPTIVE_STEP = (
    "; Adam's step is priced as Adam's on SGD's quadratic model: the rule's gain times the "
    "root of the batch's step progress (it divides by its second moment's root, the noise "
    "scale read as each coordinate's), an approximation judged on two tasks, and its pair "
    "read by the noise scale first (read the other way, the points at 4x and 8x ran 1.2-1.4x "
    "the measured), the noise scale it needs weighed with the measured by the pair's own "
    "interval (alone, a noisy pair set the curve too steep: 1.36x at 0.5x, 0.61-0.71x at "
    "8x); both chosen on the judge's seeds, judged again on fresh ones"
)


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
    assumed: str = ""  # what one pair of trainings could not tell, and was assumed (`Told`)

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
class Calibration:
    """What the study's pair (the baseline's steps to the target beside the run's) says of
    the step model (`calibrated`): the base rate's share of its optimum (`headroom`; None
    where the rule needs none, or nothing told it) and the noise scale's factor over the
    measured; or, where no (headroom, factor) of the model gives the pair, the B_noise of
    the pair's own two-point hyperbola (`hyperbola`), which prices every batch alone."""

    headroom: float | None = None
    factor: float = 1.0
    hyperbola: float | None = None


@dataclass(frozen=True)
class Pricing:
    """How a plan turns a batch into steps to the target: the run's steps along its noise
    scale, each step's progress by the rate the rule gives the batch (`rule_progress`, on
    the `calibration` the study's pair gives; `step_progress` alone where it has no
    headroom: `adascale`, whose steps need none), that rate capped at the highest one
    measured to reach the target; each batch's noise as drawn without replacement from the
    training split's `examples` (`sampled_batch`). `ends`: the calibrations at the ends of
    the pair's own 95% interval (its seeds'), and the pair's other reading at its ratio and
    those ends (`_other_readings`), over which every row's interval runs."""

    path: Trajectory
    steps_run: float  # the run's steps to the target (its seeds' MLPerf mean where it has)
    run_batch: int  # the run's examples a step (its global batch times its accumulation)
    base_batch: int  # the batch the base rate is for (one replica's, times accumulation)
    accum: int  # micro-batches a step
    base_rate: float
    rule: str
    calibration: Calibration
    cap: float  # the highest rate measured to reach the target, as a gain over the base
    noise: tuple[float, float, float]  # the headline noise scale (low, value, high)
    ends: tuple[Calibration, ...] = ()
    examples: int | None = None  # the training split's
    seed_doubt: float = 1.96 * SEED_SPREAD  # the run's steps' 95% half-width, in logs
    crossing: int = 0  # the run's own steps to the target, along which its path is walked
    warmup_epochs: float = 0.0  # the rate's ramp from the base rate to the rule's
    adaptive: bool = False  # an optimizer of Adam's kind (`Gain`)

    @property
    def headroom(self) -> float | None:
        return self.calibration.headroom

    def asked(self, batch: float, phi: float) -> float:
        """The gain the rule gives `batch` at noise scale `phi`, before the cap."""
        return planned_gain(self.rule, batch / self.base_batch, phi, self.base_batch)

    def gain(self, batch: float, phi: float) -> float:
        return min(self.asked(batch, phi), self.cap)

    def step_gain(self, batch: float, phi: float) -> Gain:
        """`gain` with the optimizer's kind: the step's gain as SGD's model takes it."""
        return Gain(self.gain(batch, phi), self.adaptive)

    def capped(self, batch: float) -> bool:
        return self.asked(batch, self.noise[1]) > self.cap * (1 + 1e-9)

    def priceable(self, batch: float) -> bool:
        """Whether `batch`'s steps are known: the rule calibrated (by the model, or by the
        pair's own hyperbola), or its rate within the cap (an uncalibrated rule's steps at
        a capped rate are not)."""
        calibrated = self.headroom is not None or self.calibration.hyperbola is not None
        return calibrated or not self.capped(batch)

    @functools.cached_property
    def cap_batch(self) -> float:
        """The largest batch whose rule's rate is within the cap, at the headline noise
        scale (infinite where the rule never passes it): past it, the rate is held. Found
        once a pricing (a bisection), not at each step of every walk `made` prices."""
        low = high = float(self.base_batch)
        while not self.capped(high):
            low, high = high, high * 2
            if high > 2.0**50:
                return math.inf
        for _ in range(60):  # the rule's gain grows with the batch: bisection in logs
            middle = math.sqrt(low * high)
            low, high = (low, middle) if self.capped(middle) else (middle, high)
        return low

    def made(self, phi: float, batch: float) -> float:
        """One step's progress at `batch` against one at the base batch and rate."""
        base = sampled_batch(self.base_batch, self.examples)
        at = sampled_batch(batch, self.examples)
        calibration = self.calibration
        if calibration.hyperbola is not None:
            return self._along_hyperbola(calibration.hyperbola, base, at)
        if calibration.headroom is None:
            return step_progress(phi, base, at)
        gain = self.step_gain(batch, phi)  # an adaptive rule's from its phi
        phi *= calibration.factor
        return rule_progress(phi, base, at, gain.at(phi, base, at), calibration.headroom)

    def _along_hyperbola(self, noise: float, base: float, at: float) -> float:
        """A step's progress by the pair's own hyperbola, read as the quadratic model at a
        base rate at its optimum with the hyperbola's B_noise (`noise`): each batch at its
        optimal rate (the hyperbola itself) up to `cap_batch`, the rate held at that
        batch's past it, as every reading's rate is (`rule_progress`: a larger batch's
        step then gains only its lower noise, at most twice the held batch's progress).
        The hyperbola alone scaled a capped rate's steps as 1/B: 0.25x the judge's steps
        at 8x the base batch on digits under linear."""
        top = sampled_batch(self.cap_batch, self.examples)
        if at <= top:
            return step_progress(noise, base, at)
        # the whole split (an infinite batch): its limit, 2 x top less nothing, where all
        # is noise; a finite stand-in keeps rule_progress's arithmetic out of inf x 0
        at = min(at, 1e15 * top)
        return rule_progress(noise, base, at, step_progress(noise, base, top), 1.0)

    def point(self, batch: float, phi: float | None = None) -> float:
        """The steps at `batch` along the run's noise scale (`phi`: held at it instead);
        infinite where the rate makes no progress. The run's steps less its warm-up's
        deficit are the steps at its full rate; scaled to `batch`, they gain its own."""

        def relative(q: float) -> float:
            run = self.made(q if phi is None else phi, self.run_batch)
            return self.made(q if phi is None else phi, batch) / run if run > 0 else 0.0

        full = self.steps_run - self.warmup_deficit(self.run_batch)
        if phi is None:
            own = self.crossing or round(self.steps_run)
            walked = predicted_steps_to(self.path, own, self.run_batch, batch, "raw", relative)
            full *= walked / own
        else:
            full = full / made if (made := relative(phi)) > 0 else math.inf
        return full + self.warmup_deficit(batch) if math.isfinite(full) else full

    def warmup_deficit(self, batch: float) -> float:
        """The steps a warm-up costs at `batch` beyond as many at the full rate: over its
        `warmup_epochs` x split / batch steps (at most the run's examples to the target at
        this batch) the rule's gain ramps linearly from 1 to the batch's
        (`make_warmup_schedule`), each step costing `ramp_cost`; less than 0 where the
        full rate is past its optimum. 0 where the headroom or the split's size is not
        known (a ramp's cost needs both), or the full rate makes no progress (its steps
        are infinite already)."""
        headroom = self.calibration.headroom
        if headroom is None or not self.examples or not self.warmup_epochs:
            return 0.0
        phi = self.noise[1] * self.calibration.factor
        at = (sampled_batch(self.base_batch, self.examples), sampled_batch(batch, self.examples))
        top = self.step_gain(batch, self.noise[1])
        examples = min(self.warmup_epochs * self.examples, self.steps_run * self.run_batch)
        return examples / batch * ramp_cost(phi, at, top, headroom)

    def steps(self, batch: float) -> tuple[float, float, float]:
        """The steps and their 95% interval: three doubts, each a 95% interval of its own
        in logs, taken as independent and added in quadrature on each side (an envelope of
        the three, their sum, said more than 95%): the noise scale's (its headline's
        bounds, held constant), the calibration's (`ends`: the pair's own interval carried
        to the model, and its other reading), and the run's steps' (`seed_doubt`). An
        infinite end stays so; where the point is infinite ("never", as the plan assumed),
        the low end is the lowest steps a reading of the pair that reaches the target gives,
        less the seeds' doubt."""
        steps = self.point(batch)
        ends = [dataclasses.replace(self, calibration=c) for c in self.ends]
        # an end under which the run itself would not have reached the target is not one
        # its measurements allow
        allowed = [end.point(batch) for end in ends if math.isfinite(end.point(self.run_batch))]
        if not math.isfinite(steps):  # never, read as the plan assumed; another reading may
            reached = [v for v in allowed if math.isfinite(v)]
            low = min(reached) * math.exp(-self.seed_doubt) if reached else steps
            return steps, low, steps
        groups = [[self.point(batch, q) for q in (self.noise[0], self.noise[2])], allowed]
        low = [min([steps, *g]) for g in groups]
        high = [max([steps, *g]) for g in groups]
        down = _quadrature([math.log(steps / v) for v in low], self.seed_doubt)
        up = _quadrature([math.log(v / steps) for v in high], self.seed_doubt)
        return steps, steps * math.exp(-down), steps * math.exp(up)


def ramp_cost(phi: float, batches: tuple[float, float], top: Gain, headroom: float) -> float:
    """A warm-up step's mean cost in full steps at the batch `batches[1]` (against the
    base's `batches[0]`): 1 - p(g)/p(top) over the rate's gains g of a linear ramp from 1 to
    `top` (`rule_progress`: p, each gain as SGD's model takes it: `Gain`); 0 where a full
    step makes no progress."""
    full = rule_progress(phi, *batches, top.at(phi, *batches), headroom)
    if full <= 0:
        return 0.0
    size = top.factor(phi, *batches)
    ramp = (1 + (top.rule - 1) * (i + 0.5) / RAMP_POINTS for i in range(RAMP_POINTS))
    made = sum(max(rule_progress(phi, *batches, g * size, headroom), 0.0) for g in ramp)
    return 1 - made / RAMP_POINTS / full


def _quadrature(half_widths: list[float], *more: float) -> float:
    """Independent 95% half-widths (in logs) together: the root of their squares."""
    return math.sqrt(sum(w * w for w in [*half_widths, *more]))


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
    pricing, told = pricing_of(metrics, steps_run, model.per_replica_batch, study)
    link = None if link_name == MEASURED else link_gbit * 1e9 / 8
    costs = _fixed_costs(metrics, model, pricing.run_batch)
    one_step = model.compute_s(pricing.base_batch)
    one_steps = pricing.steps(pricing.base_batch)[0]
    one = (one_steps * one_step + costs.seconds(one_steps * pricing.base_batch), one_step)
    prices = Prices(pricing, model, link, costs)
    rows, left_out = _rows(prices, devices, batches, one)
    if not rows:
        raise UsageError(
            f"every global batch priced leaves fewer than {MIN_STEPS_PER_EPOCH} steps an epoch "
            f"of the run's {costs.data:,} training examples, or needs a rate above the "
            "highest measured to reach the target",
            "plan for fewer devices (--devices), or from a run on more data.",
        )
    best = min(range(len(rows)), key=lambda i: rows[i].time_s)
    sources = _sources(metrics, prices, target, batches, left_out, told.source)
    sources["link"] = link_name if link is None else f"{link_name} ({link_gbit:g} Gbit/s)"
    metric = (metrics.get("to_target") or {}).get("metric", "accuracy")
    return Plan(
        str(metrics.get("run_dir")), target, metric, link_name, pricing.noise[1], rows, best,
        sources, pricing.rule, told.assumed,
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
) -> tuple[Pricing, Told]:
    """The plan's `Pricing`, and what the study told it (`Told`: where its rule's
    calibration came from and what was assumed, in words). The rule is
    the run's config's (at its base batch the run itself followed `none`); an adaptive
    rule's recorded rate is its base rate. A fixed rule no study beside the run calibrates
    is priced as `adascale`, whose steps the noise scale predicts whatever the headroom.
    The steps are the study's MLPerf mean over its seeds where it ran several (their doubt
    a mean's, from their own spread: `_seeds_doubt`), else the run's own crossing (a
    seed's doubt: dividing it by seeds it did not use understated it sqrt(3)-fold at 5)."""
    path, noise = _noise_of(metrics, steps_run)
    run_batch = metrics["global_batch"] * metrics.get("grad_accum_steps", 1)
    followed = metrics.get("lr_scaling") or "linear"
    rule = metrics.get("lr_scaling_rule") or followed
    base_rate = metrics["learning_rate"] / static_gain(followed, run_batch / base_batch)
    cap = max(planned_gain(rule, run_batch / base_batch, noise[1], base_batch), 1.0)
    examples = split_examples(metrics)
    warmup = metrics.get("warmup_epochs", 0)
    adaptive = is_adaptive(metrics.get("optimizer") or "Adam")
    told = _calibration(study, rule, noise[1], (base_batch, run_batch), examples, warmup,
                        adaptive)  # fmt: skip
    if told.calibration.headroom is None and told.calibration.hyperbola is None:
        if rule != "adascale":
            told = dataclasses.replace(told, source=f"{told.source}; so priced as adascale, "
                                       "whose steps need no calibration")  # fmt: skip
            rule = "adascale"  # its rate held at the run's, which reached the target
    mean, doubt = _run_steps(study, steps_run, run_batch)
    pricing = Pricing(
        path, mean, run_batch, base_batch, metrics.get("grad_accum_steps", 1), base_rate, rule,
        told.calibration, cap, noise, told.ends, examples, doubt, steps_run,
        warmup, adaptive,
    )  # fmt: skip
    return pricing, told


def _run_steps(study: dict | None, steps_run: int, run_batch: int) -> tuple[float, float]:
    """The run's steps to the target and their 95% half-width in logs: its seeds' MLPerf
    mean where the study ran several at this target (`examples_to_target_distributed`),
    its doubt the seeds' own (`_seeds_doubt`), else its own crossing with a seed's
    (`SEED_SPREAD`, assumed: one seed cannot show its spread)."""
    study = study or {}
    seeds, mean = study.get("seeds", 1), study.get("examples_to_target_distributed")
    if seeds < 2 or not mean:
        return float(steps_run), 1.96 * SEED_SPREAD
    sides = study.get("examples_to_target_by_seed") or [[], []]
    return mean / run_batch, _seeds_doubt(sides[-1], seeds)


def _seeds_doubt(values: list[float | None], seeds: int) -> float:
    """The 95% half-width, in logs, of a mean over seeds: a Student t-interval of the mean
    of their logs, t(n - 1) s / sqrt(n), where each of 2 or more reached the target (their
    spread measured: a task's seeds may spread far more than `SEED_SPREAD`, a table's 5-6x);
    else `SEED_SPREAD`'s over the seeds MLPerf's mean keeps (it drops the fastest and
    slowest)."""
    logs = [math.log(v) for v in values if v]
    if len(logs) >= 2 and len(logs) == len(values):
        return t_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    kept = seeds - 2 if seeds >= 3 else seeds
    return 1.96 * SEED_SPREAD / math.sqrt(kept)


@dataclass(frozen=True)
class Told:
    """What the study's pair told the plan: the calibration at its measured ratio and at
    its interval's ends, where it came from (`source`) and what was assumed (`assumed`)."""

    calibration: Calibration
    ends: tuple[Calibration, ...]
    source: str
    assumed: str = ""


def _calibration(
    study: dict | None,
    rule: str,
    phi: float,
    batches: tuple[int, int],
    examples: int | None,
    warmup_epochs: float = 0.0,
    adaptive: bool = False,
) -> Told:
    """The calibration the study's two trainings imply (`calibrated`, on the batches' noise
    as drawn from the split: `sampled_batch`): the baseline's steps to the target at the
    base batch (`batches[0]`) against the run's at its own less its warm-up's deficit
    (`_read`), with the rule's gain; at the pair's measured ratio and at its 95%
    interval's ends (`pair_interval`); an `adaptive` optimizer's gain as `Gain` has it, its
    pair read noise scale first weighed with the measured (`_weighed`; the pair's own
    reading then an end of the interval)."""
    base_batch, run_batch = batches
    if rule == "adascale":
        return Told(Calibration(), (), "adascale keeps the rate's share of its optimum: no "
                    "calibration")  # fmt: skip
    study = study or {}
    base_examples = study.get("examples_to_target_baseline")
    run_examples = study.get("examples_to_target_distributed")
    if not base_examples or not run_examples or run_batch == base_batch:
        source = (
            f"{rule} not calibrated: no baseline at batch {base_batch} reached the target "
            "beside the run (plan from a `tfscale run`'s distributed run)"
        )
        said = f"no pair to calibrate {rule} by: priced as adascale, its rate held at the run's"
        return Told(Calibration(), (), source, said)
    low, measured, high = pair_interval(study, base_batch, run_batch)
    gain = Gain(planned_gain(rule, run_batch / base_batch, phi, base_batch), adaptive)
    sampled = (sampled_batch(base_batch, examples), sampled_batch(run_batch, examples))
    steps = run_examples / run_batch
    ramp = (min(warmup_epochs * examples / run_batch, steps) if examples else 0.0, steps)
    point = _read(phi, sampled, gain, measured, ramp=ramp)
    ends = [_read(phi, sampled, gain, m, point.hyperbola is None, ramp) for m in (low, high)]
    others = _other_readings(phi, sampled, gain, (low, measured, high), ramp, point)
    weighed = _weighed(point, ends) if _noise_first(phi, sampled, gain) else point
    pair = (
        f"the baseline's {base_examples / base_batch:,.0f} steps at batch {base_batch} against "
        f"the run's {run_examples / run_batch:,.0f} at {run_batch} ({_seeds_words(study)}, "
        f"{measured:.2f}x, 95% interval {low:.2f}-{high:.2f})"
    )
    said = _assumed(rule, gain, phi, (point, weighed), ends, others)
    alone = (point,) if weighed != point else ()  # the pair's own reading: an end of its own
    return Told(weighed, (*ends, *others, *alone), f"{rule}, calibrated: {pair}: {said}", said)


def _read(
    phi: float,
    batches: tuple[float, float],
    gain: Gain,
    measured: float,
    model: bool = False,
    ramp: tuple[float, float] = (0.0, 1.0),
) -> Calibration:
    """The calibration of one ratio: `calibrated`'s, else the pair's own hyperbola; with
    `model` (an end of the interval of a pair the model explains), the model's own nearest
    reading instead, a base rate at its optimum and the noise scale's factor at its bound:
    the hyperbola prices a batch's steps whatever its rate, so an end read by it made a
    capped rate scale perfectly. With a warm-up (`ramp`: its steps at the run's batch, and
    the run's steps), the run's full-rate steps are its steps less the ramp's deficit,
    which the headroom sets too: the pair the model makes, warm-up included, is solved
    for along the same two branches (the headroom at the measured noise scale, else the
    noise scale at headroom 1), so the plan gives the pair back. An optimizer of Adam's
    kind takes the branches the other way round (`_noise_first`)."""
    noise_first = _noise_first(phi, batches, gain)
    at_optimum = _at_optimum(phi, batches, gain, measured, ramp) if noise_first else None
    if at_optimum is not None:
        return at_optimum
    if not ramp[0]:
        return _read_once(phi, batches, gain, measured, model)
    at_measured = _at_measured_noise(phi, batches, gain, measured, ramp)
    if at_measured is not None:
        return at_measured
    if not noise_first:  # read already, and None, where the noise scale came first
        at_optimum = _at_optimum(phi, batches, gain, measured, ramp)
    return at_optimum or _read_once(phi, batches, gain, measured, model)


def _noise_first(phi: float, batches: tuple[float, float], gain: Gain) -> bool:
    """Whether the pair is read as the noise scale first (a base rate at its optimum, the
    noise scale the pair needs), the headroom at the measured noise scale second: for an
    optimizer of Adam's kind (`Gain.adaptive`) whose rule's gain tells the two apart. The
    raw gradient's noise scale under-reads the one Adam's steps see: on the synthetic task
    its B_simple was 66 where the critical batch fitted to steps measured at five batches
    was 120 (`benchmarks/critical_batch.py`), so a pair that did better than the measured
    noise scale allows at a base rate at its optimum is read as a larger noise scale, not
    as Keras's default rate for Adam far below its optimum. (Read the other way, the plan
    put Adam's steps at 4x and 8x the base batch 1.2-1.4x the measured on two tasks, on
    seeds its predictor never saw; read this way, 0.89-0.95x under `sqrt`, a choice made
    after seeing them: docs/time-to-accuracy.md.) The factor the pair needs is then weighed
    with the measured noise scale by the pair's own interval (`_weighed`). SGD's pair is
    read headroom first (`calibrated`)."""
    return gain.adaptive and not keeps_share(phi, *batches, gain.at(phi, *batches))


# the raw gradient's noise scale against the one an optimizer of Adam's kind's steps see, a
# 95% half-width in logs: within 2x (on the synthetic task its B_simple was 66 where the
# critical batch fitted to steps measured at five batches was 120: benchmarks/critical_batch.py)
NOISE_PRIOR = math.log(2.0) / 1.96


def _weighed(point: Calibration, ends: list[Calibration]) -> Calibration:
    """A pair read noise scale first (`_noise_first`: a base rate at its optimum and the
    noise scale's factor it needs), weighed with the noise scale as measured: the factor's
    log from the pair, its spread what the pair's own 95% interval gives it ((log f_high -
    log f_low) / 3.92 over the ends' readings; unbounded where an end needs no factor at
    headroom 1, or the widest), averaged with 0 (the measured) of `NOISE_PRIOR`'s spread by
    their precisions, and kept within the ends' factors. A noisy pair (5 seeds a side,
    13% apart) reads a noise scale from 0.8x to 7x the measured; alone, its point set the
    curve too steep on both sides of the base batch (docs/time-to-accuracy.md). Chosen
    after the judge was seen; on 5 predictor pairs no choice saw (seeds 52-56) it beat the
    plain reading: 4 of 5 closer than the hyperbola against 3 of 7."""
    if point.headroom != 1.0 or point.factor == 1.0 or point.hyperbola is not None:
        return point
    inside = [
        math.log(c.factor)
        for c in ends
        if c.headroom == 1.0 and 1 / FACTOR_BOUND < c.factor < FACTOR_BOUND
    ]
    value = math.log(point.factor)
    lower = [v for v in inside if v <= value]
    upper = [v for v in inside if v >= value]
    spread = (max(upper) - min(lower)) / (2 * 1.96) if lower and upper else math.inf
    weighed = value * NOISE_PRIOR**2 / (NOISE_PRIOR**2 + spread**2)
    weighed = min(max([weighed, *lower]), *upper, math.inf)  # within the ends' factors
    return Calibration(1.0, math.exp(weighed))


def _pair_made(
    phi: float,
    batches: tuple[float, float],
    gain: Gain,
    ramp: tuple[float, float],
    headroom: float,
    factor: float,
) -> float:
    """The pair's steps ratio the model makes at (`headroom`, `factor`), the run's warm-up
    (`ramp`: its steps, and the run's) costing its deficit."""
    warm, steps = ramp
    share = warm / steps * ramp_cost(phi * factor, batches, gain, headroom) if warm else 0.0
    phi *= factor
    return rule_progress(phi, *batches, gain.at(phi, *batches), headroom) * (1 - share)


def _at_optimum(
    phi: float,
    batches: tuple[float, float],
    gain: Gain,
    measured: float,
    ramp: tuple[float, float] = (0.0, 1.0),
) -> Calibration | None:
    """The pair's reading at a base rate at its optimum: headroom 1 and the noise scale's
    factor that gives `measured` (`factor_at_optimum`, or along a grid with a warm-up);
    None where no factor in [1/64, 64] does."""
    if not ramp[0]:
        factor = factor_at_optimum(phi, *batches, lambda q: gain.at(q, *batches), measured)
        return None if factor is None else Calibration(1.0, factor)
    factors = [FACTOR_BOUND ** (2 * i / (GRID - 1) - 1) for i in range(GRID)]
    factor = _root(lambda f: _pair_made(phi, batches, gain, ramp, 1.0, f) - measured, factors)
    return None if factor is None else Calibration(1.0, factor)


def _other_readings(
    phi: float,
    batches: tuple[float, float],
    gain: Gain,
    ratios: tuple[float, ...],
    ramp: tuple[float, float],
    point: Calibration,
) -> list[Calibration]:
    """One pair, two unknowns: where the plan read the pair as a base rate off its optimum
    at the noise scale measured, the other reading of each of `ratios` (the pair's measured
    ratio and its interval's ends): a base rate at its optimum and a noise scale that
    gives the pair (`_at_optimum`); where it read the noise scale first (`_noise_first`),
    the headroom at the measured noise scale that gives it (`_at_measured_noise`). The
    rows' intervals run over both readings."""
    if point.headroom is None or point.hyperbola is not None:
        return []
    if point.factor == 1.0:
        readings = (_at_optimum(phi, batches, gain, m, ramp) for m in ratios)
    elif _noise_first(phi, batches, gain):
        readings = (_at_measured_noise(phi, batches, gain, m, ramp) for m in ratios)
    else:
        return []
    return [c for c in readings if c is not None]


def _at_measured_noise(
    phi: float,
    batches: tuple[float, float],
    gain: Gain,
    measured: float,
    ramp: tuple[float, float] = (0.0, 1.0),
) -> Calibration | None:
    """The pair's reading at the noise scale as measured: the base rate's share of its
    optimum in [0, 2) that gives `measured` (`headroom_from`, or along a grid with a
    warm-up); None where none does."""
    if not ramp[0]:
        headroom = headroom_from(phi, *batches, gain.at(phi, *batches), measured)
    else:
        grid = [2 * (i + 0.5) / GRID for i in range(GRID)]
        headroom = _root(lambda h: _pair_made(phi, batches, gain, ramp, h, 1.0) - measured, grid)
    return None if headroom is None else Calibration(headroom, 1.0)


GRID = 400  # the points a calibration with a warm-up scans for its root


def _root(residual: Callable[[float], float], grid: list[float]) -> float | None:
    """The first root of `residual` along `grid` (where it changes sign), bisected to
    1e-12; None where it has none there."""
    values = [residual(x) for x in grid]
    for i in range(len(grid) - 1):
        if values[i] == 0:
            return grid[i]
        if (values[i] < 0) != (values[i + 1] < 0):
            low, high = grid[i], grid[i + 1]
            for _ in range(60):
                middle = (low + high) / 2
                same = (residual(middle) < 0) == (values[i] < 0)
                low, high = (middle, high) if same else (low, middle)
            return (low + high) / 2
    return None


def _read_once(
    phi: float, batches: tuple[float, float], gain: Gain, measured: float, model: bool
) -> Calibration:
    """`_read` of a ratio with no warm-up."""
    headroom, factor = calibrated(phi, *batches, lambda q: gain.at(q, *batches), measured)
    if factor != NOT_EXPLAINED:
        return Calibration(headroom, factor)
    if not model:
        return Calibration(hyperbola=two_point_noise(*batches, measured))
    top = phi * FACTOR_BOUND
    highest = rule_progress(top, *batches, gain.at(top, *batches), 1.0)
    return Calibration(1.0, FACTOR_BOUND if measured > highest else 1 / FACTOR_BOUND)


def _assumed(
    rule: str,
    gain: Gain,
    phi: float,
    readings: tuple[Calibration, Calibration],
    ends: list[Calibration],
    others: list[Calibration],
) -> str:
    """What one pair, two unknowns, made the plan assume, in words: `readings`, the pair's
    own and the one the plan took (`_weighed`: the same but where weighed)."""
    point, weighed = readings
    if point.hyperbola is not None:
        return (
            f"one pair, two unknowns, and no base rate or noise scale of the model gives it "
            f"(the larger batch did better than {rule}'s gain of {gain.rule:.2f} allows): priced "
            f"from the pair's own two-point hyperbola, B_noise {_count(point.hyperbola)}, the "
            "rate as the rule sets it"
        )
    if point.headroom is None:
        return f"{rule}'s gain here keeps the rate's share of its optimum"
    span = _span([c.headroom for c in ends if c.headroom is not None and c.factor == 1.0])
    if point.factor == 1.0:
        return (
            f"one pair, two unknowns: assumed the noise scale as measured ({phi:,.0f}), which "
            f"puts the base rate at {point.headroom:.2f} of its optimum{span}; "
            + _other_text(others)
        )
    factors = _span([c.factor for c in ends if c.headroom == 1.0 and c.factor != 1.0])
    said = (
        f"one pair, two unknowns: assumed a base rate at its optimum, which needs the noise "
        f"scale {point.factor:.2f}x the measured{factors}"
    )
    if weighed != point:
        said = (
            f"one pair, two unknowns: assumed a base rate at its optimum and the noise scale "
            f"{weighed.factor:.2f}x the measured: the pair alone needs {point.factor:.2f}x"
            f"{factors}, weighed with the measured, taken as within 2x of the one the steps "
            "see (95%)"
        )
    if not gain.adaptive:
        return said
    headrooms = [c.headroom for c in others if c.headroom is not None]
    shares = f"{min(headrooms):.2f}-{max(headrooms):.2f}" if headrooms else ""
    other = (
        f"the noise scale as measured with the base rate at {shares} of its optimum gives "
        "it too, and the intervals run over both"
        if headrooms
        else "no base rate gives it at the noise scale as measured"
    )
    return f"{said} (Adam's kind: the raw gradient's noise scale under-reads its steps'); {other}"


def _other_text(others: list[Calibration]) -> str:
    """The pair's other reading (`_other_readings`) in words."""
    if not others:
        return "no base rate at its optimum gives the pair at any noise scale"
    factors = [c.factor for c in others]
    return (
        f"a base rate at its optimum with the noise scale {min(factors):.2f}-"
        f"{max(factors):.2f}x the measured gives it too, and the intervals run over both"
    )


def _count(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) else "unbounded (steps fall as 1/B)"


def _span(values: list[float]) -> str:
    """`(0.41-0.62 over the pair's interval)` of two ends; '' where they are not both there."""
    if len(values) < 2:
        return ""
    return f" ({min(values):.2f}-{max(values):.2f} over the pair's interval)"


def pair_interval(study: dict, base_batch: int, run_batch: int) -> tuple[float, float, float]:
    """The pair's steps ratio (the baseline's steps to the target over the run's) and its
    95% interval: with two or more seeds a side, a two-sample t-interval on the logs of
    their examples to target (`examples_to_target_by_seed`, `seeds_interval`); with one, each
    side's steps spread as `SEED_SPREAD` (assumed: one seed cannot show its own spread),
    the ratio's by sqrt(2)."""
    measured = (study["examples_to_target_baseline"] / base_batch) / (
        study["examples_to_target_distributed"] / run_batch
    )
    sides = study.get("examples_to_target_by_seed") or [[], []]
    if min(len(side) for side in sides) < 2:
        doubt = math.exp(1.96 * SEED_SPREAD * math.sqrt(2))
        return measured / doubt, measured, measured * doubt
    low, high = seeds_interval(run_batch / base_batch, (tuple(sides[0]), tuple(sides[1])))
    return low, measured, high


RAMP_POINTS = 64  # the warm-up's gains a deficit averages over (midpoints)


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


class Prices(NamedTuple):
    """What prices a configuration: its steps to the target (`pricing`), its step's time
    from the cost model (`model`) on the `link` (bytes/s; None: the run's own), and the
    run's fixed costs (`costs`: evaluations, epochs)."""

    pricing: Pricing
    model: Any
    link: float | None
    costs: FixedCosts


def _rows(
    prices: Prices, devices: int, batches: tuple[int, ...], one: tuple[float, float]
) -> tuple[list[PlanRow], dict[str, int]]:
    """Each (devices, per-replica batch) priced; and how many were left out, and why: too
    few steps an epoch, or (where the rule's headroom is unknown) a rate above the cap."""
    pricing, costs = prices.pricing, prices.costs
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
            rows.append(_row(prices, (n, b, batch), one))
    return rows, left_out


def _row(prices: Prices, shape: tuple[int, int, int], one: tuple[float, float]) -> PlanRow:
    """One configuration (`shape`: its devices, per-replica batch and global examples a
    step): its step from the cost model, its steps from the pricing, its time with the
    evaluations and epochs the steps take."""
    pricing, model, link, costs = prices
    n, b, batch = shape
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
    prices: Prices,
    target: float,
    batches: tuple[int, ...],
    left_out: dict[str, int],
    rule_source: str,
) -> dict[str, str]:
    """Where each figure came from, in words."""
    pricing, model, _, costs = prices
    low, phi, high = pricing.noise
    accum = pricing.accum
    cap = pricing.base_rate * pricing.cap
    return {
        "step time": f"the cost model fitted to the run's probes (compute at per-replica "
        f"batches {_probed_batches(metrics)}, the all-reduce at 3 sizes; fit errors "
        f"{model.compute_fit_error:.1%} and {model.comm_fit_error:.1%}); other batches "
        "extrapolate its line",
        "steps to target": f"{_steps_words(pricing)} to {target:g} at global batch "
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
        )
        + (ADAPTIVE_STEP if pricing.adaptive else ""),
        "fixed costs": f"an evaluation {costs.evaluation_s * 1000:.0f} ms every "
        f"{costs.every_examples:,} examples, an epoch {costs.epoch_s * 1000:.0f} ms beside its "
        "steps, from the run's own clock",
        "batches": _batches_source(batches, left_out, costs.data, cap)
        + (f"; each step accumulates {accum} micro-batches" if accum > 1 else ""),
    }


def _seeds_words(study: dict) -> str:
    """`5 seeds`, or one seed and the spread its interval assumed, and from where."""
    seeds = study.get("seeds", 1)
    if seeds > 1:
        return f"{seeds} seeds"
    return f"1 seed, a {SEED_SPREAD:.0%} seed spread assumed: the judge's, pooled over its tasks"


def _steps_words(pricing: Pricing) -> str:
    """`the run's 100 steps`, or the seeds' mean beside the run's own crossing."""
    if not pricing.crossing or pricing.crossing == pricing.steps_run:
        return f"the run's {pricing.steps_run:,.0f} steps"
    return (
        f"the run's seeds' MLPerf mean of {pricing.steps_run:,.0f} steps (its own crossing "
        f"{pricing.crossing:,}, along whose noise scale they are priced)"
    )


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
