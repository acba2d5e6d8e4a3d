"""Why a run scales the way it does: throughput probes and the bottleneck class.

On the same model, batch and devices it measures input-only throughput (the input
pipeline alone), compute-only throughput (the training step on one in-memory batch,
repeated) and end-to-end throughput; with N replicas also compute-only at 1 replica.
From those it names the bottleneck and recommends what to change.

A run across processes (MultiWorkerMirrored workers, a ParameterServer coordinator) is
probed where it trains (`tasks.measure.in_place`): there a step splits into the local step, the
communication alone and the rest (synchronisation and dispatch), each measured.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from tfscale.tasks.data.manifest import Manifest
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.distribute.strategy import StrategyChoice
from tfscale.tasks.measure.in_place import InPlaceProbes
from tfscale.tasks.measure.pipeline_probes import StageProbes, classify_stages, measure_stages
from tfscale.tasks.measure.probes import RoundRates, Transform, measure_rounds
from tfscale.tasks.measure.rounds import RoundsEnded, Spread
from tfscale.tasks.settings.config import TrainConfig
from tfscale.tasks.train.training import batch_sizes

OVERHEAD_STEP_S = 0.004  # below this per step, dispatch and sync costs dominate
INPUT_SLACK = 0.85  # end-to-end below this share of compute-only: something else holds it
COMM_EFFICIENCY = 0.6  # compute-only scaling efficiency below this: the all-reduce costs
STEP_SHARE = 0.3  # communication, or sync and dispatch, above this share of a step: bound by it


@dataclass(frozen=True)
class Diagnosis:
    bottleneck: str
    input_examples_per_s: float
    compute_examples_per_s: float
    end_to_end_examples_per_s: float
    compute_1_replica_examples_per_s: float | None
    replicas: int
    step_seconds: float
    evidence: str
    advice: list[str] = field(default_factory=list)
    seconds: float = 0.0  # time the probes took
    # weak scaling: compute-only on one device at the whole global batch (what the batch
    # alone is worth, with no more devices)
    compute_1_device_global_batch_examples_per_s: float | None = None
    # measured inside a multi-process run (`tasks.measure.in_place`); None in one process
    measured_in: str = "this process"
    local_step_seconds: float | None = None  # the step with no communication
    comm_seconds: float | None = None  # the communication alone (all-reduce, push and pull)
    comm_share: float | None = None  # of a step
    sync_share: float | None = None  # of a step: neither the local step nor the communication
    gradient_bytes: int | None = None
    input_examples_per_s_by_worker: list[float] = field(default_factory=list)
    # what the forecast's cost model is fitted to (`tasks.report.forecast.fit_cost_model`), for a
    # run of several replicas in this process: the shape of `InPlaceProbes.to_dict()`
    cost_probes: dict = field(default_factory=dict)
    # a run in this process: every configuration's examples/s per alternating round
    # (`tasks.measure.probes.RoundRates.to_dict()`), which every figure above is the median of
    rounds: dict = field(default_factory=dict)
    # a pipeline: its step taken apart (`tasks.measure.pipeline_probes.StageProbes.to_dict()`)
    stage_probes: dict = field(default_factory=dict)
    # its figures for the runs table: the measured bubble and GPipe's at the run's
    # micro-batches, and the seconds a step spends moving activations between stages
    pipeline_bubble: float | None = None
    pipeline_schedule_bubble: float | None = None
    pipeline_transfer_seconds: float | None = None

    @property
    def round_rates(self) -> RoundRates | None:
        return RoundRates(**self.rounds) if self.rounds else None

    @property
    def batch_effect(self) -> float | None:
        """How much faster one device trains at the global batch than at the per-replica
        batch: the part of a weak-scaling speedup more devices did not bring (from the
        rounds, end to end, when the run was measured in rounds)."""
        r = self.round_rates
        if r is not None:
            return r.from_batch.median if r.from_batch else None
        one, whole = (
            self.compute_1_replica_examples_per_s,
            self.compute_1_device_global_batch_examples_per_s,
        )
        return whole / one if one and whole else None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def compute_scaling_efficiency(self) -> float | None:
        one = self.compute_1_replica_examples_per_s
        return self.compute_examples_per_s / (one * self.replicas) if one else None


def classify(rounds: RoundRates) -> tuple[str, str]:
    """The bottleneck class of a run in this process, and the measured numbers that show it,
    from its alternating rounds. A class is named only when every round agrees; where the
    rounds fall on both sides of a threshold the class is `undetermined`, saying which."""
    n = len(rounds.rates["compute"])
    share, inputs, compute = rounds.input_share, rounds.spread("input"), rounds.spread("compute")
    step = Spread.of([rounds.step_examples / c for c in rounds.rates["compute"]])
    efficiency = rounds.compute_efficiency
    starved = inputs.median < compute.median
    if share.below(INPUT_SLACK) and starved:
        return "input-bound", (
            f"end-to-end is {share.text('', 2)} of compute-only over {n} rounds, and the input "
            f"pipeline alone gives {inputs.text(' ex/s', 0)} against {compute.text(' ex/s', 0)}"
        )
    if step.below(OVERHEAD_STEP_S):
        return "overhead-bound", (
            f"a training step takes {_ms(step)}, under {OVERHEAD_STEP_S * 1000:.0f} ms in every "
            f"round: per-step dispatch and synchronisation dominate the arithmetic"
        )
    if efficiency is not None and efficiency.below(COMM_EFFICIENCY):
        one = rounds.spread(rounds.baseline + "_compute")
        moves = "grows" if compute.median > one.median else "falls"
        return "communication-bound", (
            f"compute-only throughput {moves} from {one.text(' ex/s', 0)} on 1 replica to "
            f"{compute.text(' ex/s', 0)} on {rounds.replicas} (efficiency {efficiency.text('', 2)})"
        )
    unsure = []
    if share.holds(INPUT_SLACK) and starved:
        unsure.append(f"end-to-end over compute-only {share.text('', 2)} spans {INPUT_SLACK}")
    if step.holds(OVERHEAD_STEP_S):
        unsure.append(f"the step {_ms(step)} spans {OVERHEAD_STEP_S * 1000:.0f} ms")
    if efficiency is not None and efficiency.holds(COMM_EFFICIENCY):
        unsure.append(f"compute-only efficiency {efficiency.text('', 2)} spans {COMM_EFFICIENCY}")
    if unsure:
        return "undetermined", f"the {n} rounds disagree: " + "; ".join(unsure)
    return "compute-bound", (
        f"end-to-end is {share.text('', 2)} of compute-only {compute.text(' ex/s', 0)} over "
        f"{n} rounds, with {_ms(step)} steps"
    )


def _ms(step: Spread) -> str:
    """A step's spread in milliseconds."""
    return Spread(step.median * 1000, step.low * 1000, step.high * 1000).text(" ms", 1)


def recommend(
    bottleneck: str,
    cfg: TrainConfig,
    manifest: Manifest,
    choice: StrategyChoice,
    cpu_flags: list[str],
) -> list[str]:
    """Concrete changes, from the class and the configuration that produced it."""
    shards = len(manifest.files("train"))
    if bottleneck == "input-bound":
        advice = []
        if not cfg.cache:
            advice.append("cache the dataset (train.cache: true): it is read every epoch")
        if shards < 8:
            advice.append(
                f"write more shards ({shards} now; 'tfscale prepare --num-shards "
                f"{max(8, 2 * shards)}') so reads run in parallel"
            )
        advice.append("move expensive preprocessing into 'tfscale prepare' so it runs once")
        return advice
    if bottleneck == "overhead-bound":
        more_calls = (
            [f"run more steps per graph call (train.steps_per_call, now {cfg.steps_per_call})"]
            if cfg.steps_per_call < 50 and not choice.spec.one_worker_per_step
            else []
        )
        return [
            f"raise the per-replica batch (now {cfg.per_replica_batch}) to "
            f"{cfg.per_replica_batch * 4} or more so each step does more work",
            "use fewer replicas: each adds synchronisation to a step this small",
        ] + more_calls
    if bottleneck == "undetermined":
        return [
            "measure again on a quieter machine: the rounds disagree about the class (each "
            "figure above gives its range over the rounds)"
        ]
    if bottleneck == "communication-bound":
        return [
            f"use fewer replicas than {choice.replicas}, or a larger per-replica batch to "
            "amortise each all-reduce",
            "accumulate gradients (train.grad_accum_steps) to all-reduce less often",
        ]
    advice = []
    bf16 = any(f in cpu_flags for f in ("amx_bf16", "avx512_bf16"))
    if choice.precision == "float32" and (bf16 or choice.devices != "cpu"):
        advice.append("enable mixed precision (--precision auto): this hardware gains from it")
    advice.append("compute-bound is the healthy state: more devices add throughput")
    return advice


def classify_in_place(probes: InPlaceProbes) -> tuple[str, str]:
    """The bottleneck class of a multi-process run from its in-place probes, and the
    measured numbers that show it, in one sentence.

    A step is the local step (no communication), the communication alone, and the rest:
    waiting for the slowest replica and dispatching the collectives. When the last two
    take `STEP_SHARE` of a step or more, the larger of them names the class. Input comes first:
    when end-to-end falls short of the step and one worker's input pipeline is slower than
    its share of a step needs, that worker holds everyone back.
    """
    ms = 1000.0
    ratio = probes.step_s / probes.end_to_end_s
    need = probes.worker_examples / probes.step_s  # examples/s one worker's share of a step needs
    slowest = min(
        range(len(probes.input_examples_per_s)), key=probes.input_examples_per_s.__getitem__
    )
    slowest_rate = probes.input_examples_per_s[slowest]
    if ratio < INPUT_SLACK and slowest_rate < need:
        return "input-bound", (
            f"worker {slowest}'s input pipeline alone gives {slowest_rate:,.0f} ex/s, below "
            f"the {need:,.0f} its share of a step needs: end-to-end steps take "
            f"{probes.end_to_end_s * ms:.1f} ms against {probes.step_s * ms:.1f} ms on an "
            "in-memory batch"
        )
    comm_share = min(probes.comm_s / probes.step_s, 1.0)
    sync_s = max(probes.step_s - probes.local_step_s - probes.comm_s, 0.0)
    sync_share = sync_s / probes.step_s
    split = (
        f"of each {probes.step_s * ms:.1f} ms step the local step takes "
        f"{probes.local_step_s * ms:.1f} ms, the {probes.comm} of "
        f"{probes.gradient_bytes / 1024:,.0f} KiB alone {probes.comm_s * ms:.1f} ms "
        f"({comm_share:.0%}) and synchronisation and dispatch the other {sync_s * ms:.1f} ms "
        f"({sync_share:.0%})"
    )
    if comm_share + sync_share >= STEP_SHARE:  # the local step is under 70% of a step
        if comm_share < sync_share:
            return "overhead-bound", split
        if probes.comm == "all-reduce" and probes.workers > 1:  # a ring sends 2(N-1)/N of the bytes
            sent = probes.gradient_bytes * 2 * (probes.workers - 1) / probes.workers
            split += (
                f"; each worker sends {sent / 1024:,.0f} KiB per all-reduce, about "
                f"{sent * 8 / probes.comm_s / 1e6:,.0f} Mbit/s"
            )
        return "communication-bound", split
    if probes.step_s < OVERHEAD_STEP_S:
        return "overhead-bound", split
    return "compute-bound", split


def diagnose_in_place(
    probes: InPlaceProbes,
    cfg: TrainConfig,
    manifest: Manifest,
    choice: StrategyChoice,
    cpu_flags: list[str],
) -> Diagnosis:
    """The diagnosis of a multi-process run from the probes its processes measured."""
    p = probes
    bottleneck, evidence = classify_in_place(p)
    step_rate = p.step_examples / p.step_s
    if choice.spec.one_worker_per_step:  # a step's time ran side by side on each worker
        step_rate *= p.workers
    local_rate = p.replica_examples / p.local_step_s
    global_rate = (
        p.step_examples / p.local_global_batch_step_s if p.local_global_batch_step_s else None
    )
    return Diagnosis(
        bottleneck=bottleneck,
        input_examples_per_s=sum(p.input_examples_per_s),
        compute_examples_per_s=step_rate,
        end_to_end_examples_per_s=step_rate * p.step_s / p.end_to_end_s,
        compute_1_replica_examples_per_s=local_rate,
        replicas=p.replicas,
        step_seconds=p.step_s,
        evidence=evidence,
        advice=recommend(bottleneck, cfg, manifest, choice, cpu_flags),
        seconds=p.seconds,
        compute_1_device_global_batch_examples_per_s=global_rate,
        measured_in=p.where,
        local_step_seconds=p.local_step_s,
        comm_seconds=p.comm_s,
        comm_share=min(p.comm_s / p.step_s, 1.0),
        sync_share=max(p.step_s - p.local_step_s - p.comm_s, 0.0) / p.step_s,
        gradient_bytes=p.gradient_bytes,
        input_examples_per_s_by_worker=list(p.input_examples_per_s),
    )


def format_diagnosis(diagnosis: Diagnosis) -> str:
    one = diagnosis.compute_1_replica_examples_per_s
    lines = [
        f"bottleneck: {diagnosis.bottleneck}",
        f"because:    {diagnosis.evidence}",
        f"input-only {diagnosis.input_examples_per_s:,.0f} ex/s, compute-only "
        f"{diagnosis.compute_examples_per_s:,.0f} ex/s on "
        + (
            f"{diagnosis.stage_probes['stages']} stages"
            if diagnosis.stage_probes
            else f"{diagnosis.replicas} replicas"
        )
        + (f" ({one:,.0f} on 1)" if one else "")
        + f", end-to-end {diagnosis.end_to_end_examples_per_s:,.0f} ex/s, step "
        f"{diagnosis.step_seconds * 1000:.1f} ms",
    ]
    if diagnosis.local_step_seconds is not None:
        workers = ", ".join(f"{rate:,.0f}" for rate in diagnosis.input_examples_per_s_by_worker)
        lines.insert(
            2,
            f"measured:   in {diagnosis.measured_in}, with their own communication; input-only per "
            f"worker {workers} ex/s",
        )
    r = diagnosis.round_rates
    if r is not None:
        rounds = len(r.rates["compute"])
        ended = f", {RoundsEnded(**r.settled).text()}" if r.settled else ""
        lines.insert(
            2, f"measured:   in this process, {rounds} alternating rounds (median, range){ended}"
        )
        if r.interfered:
            lines.insert(3, f"note:       {r.interfered}")
        if r.from_batch is not None:
            one = r.spread("one_device_global_batch")
            lines.append(
                f"batch:      one device trains {r.from_batch.text()} as fast at the global batch "
                f"({one.text(' ex/s', 0)}) as at the per-replica batch: that part of the "
                "speedup needs no more devices"
            )
    elif diagnosis.batch_effect is not None:
        lines.append(
            f"batch:      one device computes {diagnosis.batch_effect:.2f}x as fast at the global "
            f"batch ({diagnosis.compute_1_device_global_batch_examples_per_s:,.0f} ex/s) as at the "
            f"per-replica batch: that part of the speedup needs no more devices"
        )
    if diagnosis.stage_probes:
        lines += _stage_lines(StageProbes(**diagnosis.stage_probes))
    return "\n".join(lines + [f"advice:     {a}" for a in diagnosis.advice])


def _stage_lines(probes: StageProbes) -> list[str]:
    """A pipeline's step taken apart: its stages alone, the bubble, the transfers."""
    alone = probes.stage_seconds[str(probes.micro_batches)]
    stage_ms = ", ".join(f"{seconds * 1000:.1f}" for seconds in alone)
    return [
        f"stages:     {probes.stages} ({'; '.join(probes.names)}); alone {stage_ms} ms",
        f"bubble:     measured (GPipe's schedule) at {probes.bubble_table()}",
        f"transfer:   {probes.transfer_seconds * 1000:.2f} ms a step between stages",
    ]


def diagnose_run(run: Run, steps: int = 30, input_transform: Transform | None = None) -> Diagnosis:
    """Measures a run in this process in alternating rounds (`tasks.measure.probes`) and classifies
    it; every figure is the median over the rounds, which the diagnosis keeps (`rounds`);
    the advice for the hardware its report describes (its CPU's flags).
    A run across processes is probed in place: `diagnose_in_place`."""
    started = time.perf_counter()
    cfg, choice = run.train, run.choice
    r = measure_rounds(
        run, steps, input_transform, rounds=cfg.measure_rounds, aim=cfg.measure_precision
    )
    bottleneck, evidence = classify(r)
    advice = recommend(bottleneck, cfg, run.manifest, choice, run.report.cpu_flags)
    stage_probes = {}
    if choice.spec.staged:  # the step taken apart: stages, transfers, the bubble
        probes = measure_stages(run)
        stage_probes = probes.to_dict()
        if bottleneck != "input-bound":
            bottleneck, evidence, advice = classify_stages(probes)
    return _diagnosis_of(r, cfg, choice, (bottleneck, evidence, advice), stage_probes, started)


def _diagnosis_of(
    r: RoundRates,
    cfg: TrainConfig,
    choice: StrategyChoice,
    verdict: tuple[str, str, list[str]],
    stage_probes: dict,
    started: float,
) -> Diagnosis:
    """The `Diagnosis` of the rounds `r` measured and the verdict (bottleneck, its
    evidence, the advice) drawn from them."""
    bottleneck, evidence, advice = verdict
    median = r.medians
    several = choice.replicas > 1
    return Diagnosis(
        bottleneck=bottleneck,
        input_examples_per_s=median["input"],
        compute_examples_per_s=median["compute"],
        end_to_end_examples_per_s=median["end_to_end"],
        compute_1_replica_examples_per_s=median[r.baseline + "_compute"] if several else None,
        replicas=choice.replicas,
        step_seconds=r.step_examples / median["compute"],
        evidence=evidence,
        advice=advice,
        seconds=time.perf_counter() - started,
        compute_1_device_global_batch_examples_per_s=(
            median["one_device_global_batch_compute"] if several and cfg.scaling == "weak" else None
        ),
        cost_probes=_cost_probes(choice, r, batch_sizes(cfg, choice.replicas)) if several else {},
        rounds=r.to_dict(),
        stage_probes=stage_probes,
        **_pipeline_figures(choice, stage_probes),
    )


def _pipeline_figures(choice: StrategyChoice, probes: dict) -> dict:
    if not probes:
        return {}
    p, m = StageProbes(**probes), choice.micro_batches
    return {
        "pipeline_bubble": p.measured_bubble(m),
        "pipeline_schedule_bubble": p.schedule_bubble(m),
        "pipeline_transfer_seconds": p.transfer_seconds,
    }


def _cost_probes(choice: StrategyChoice, r: RoundRates, batches: tuple[int, int]) -> dict:
    """The rounds' medians in the form the forecast fits (`InPlaceProbes.to_dict()`): one
    device's compute-only step at the per-replica and the global batch (`batches`), the
    replicas' all-reduce at a few message sizes, the run's step and its input's rate."""
    per_replica, global_batch = batches
    median = r.medians
    local_s = per_replica / median["one_device_replica_batch_compute"]
    return {
        "where": f"{choice.replicas} replicas in this process",
        "comm": "all-reduce",
        "replicas": choice.replicas,
        "workers": 1,
        "step_examples": r.step_examples,
        "replica_examples": per_replica,
        "gradient_bytes": r.gradient_bytes,
        "step_s": r.step_examples / median["compute"],
        "local_step_s": local_s,
        "end_to_end_s": r.step_examples / median["end_to_end"],
        "input_examples_per_s": [median["input"]],
        "local_step_s_by_batch": [
            [float(per_replica), local_s],
            [float(global_batch), global_batch / median["one_device_global_batch_compute"]],
        ],
        "comm_s_by_bytes": r.comm_s_by_bytes,
    }
