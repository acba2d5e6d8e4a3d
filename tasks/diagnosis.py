"""Why a run scales the way it does: throughput probes and the bottleneck class.

On the same model, batch and devices it measures input-only throughput (the input
pipeline alone), compute-only throughput (the training step on one in-memory batch,
repeated) and end-to-end throughput; with N replicas also compute-only at 1 replica.
From those it names the bottleneck and recommends what to change.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field

from tasks.config import TrainConfig
from tasks.manifest import Manifest
from tasks.probes import Transform, probe_rates
from tasks.strategy import StrategyChoice, baseline_choice

OVERHEAD_STEP_S = 0.004  # below this per step, dispatch and sync costs dominate
INPUT_SLACK = 0.85  # end-to-end below this share of compute-only: something else holds it
COMM_EFFICIENCY = 0.6  # compute-only scaling efficiency below this: the all-reduce costs


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
    compute_is_ideal: bool = False  # out-of-process runs: N x the 1-replica rate, not measured
    # weak scaling: compute-only on one device at the whole global batch (what the batch
    # alone is worth, with no more devices)
    compute_1_device_global_batch_examples_per_s: float | None = None

    @property
    def batch_effect(self) -> float | None:
        """How much faster one device computes at the global batch than at the per-replica
        batch: the part of a weak-scaling speedup more devices did not bring."""
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


def classify(
    input_rate: float,
    compute_rate: float,
    e2e_rate: float,
    step_s: float,
    replicas: int,
    compute_1: float | None,
    compute_is_ideal: bool = False,
) -> tuple[str, str]:
    """The bottleneck class, and the numbers that show it, in one sentence.

    With `compute_is_ideal` (runs out of this process), `compute_rate` is N times the
    single-replica compute-only rate: the run's shortfall from it is what crossing
    processes costs (the all-reduce and synchronisation), named as such.
    """
    ratio = e2e_rate / compute_rate
    if ratio < INPUT_SLACK and input_rate < compute_rate:
        return "input-bound", (
            f"end-to-end {e2e_rate:,.0f} ex/s is {ratio:.0%} of compute-only "
            f"{compute_rate:,.0f} ex/s, and the input pipeline alone gives {input_rate:,.0f}"
        )
    if compute_is_ideal and ratio < COMM_EFFICIENCY:
        return "communication-bound", (
            f"end-to-end {e2e_rate:,.0f} ex/s is {ratio:.0%} of the ideal {compute_rate:,.0f} "
            f"({replicas} x the 1-replica compute-only rate, not a measurement): the "
            f"cross-process all-reduce and synchronisation take the rest"
        )
    if step_s < OVERHEAD_STEP_S:
        return "overhead-bound", (
            f"a training step takes {step_s * 1000:.1f} ms, under {OVERHEAD_STEP_S * 1000:.0f} ms"
            f": per-step dispatch and synchronisation dominate the arithmetic"
        )
    if replicas > 1 and compute_1:
        efficiency = compute_rate / (compute_1 * replicas)
        if efficiency < COMM_EFFICIENCY:
            return "communication-bound", (
                f"compute-only throughput grows from {compute_1:,.0f} ex/s on 1 replica to "
                f"{compute_rate:,.0f} on {replicas} (efficiency {efficiency:.2f})"
            )
    return "compute-bound", (
        f"end-to-end {e2e_rate:,.0f} ex/s is {ratio:.0%} of compute-only {compute_rate:,.0f} "
        f"ex/s, with {step_s * 1000:.0f} ms steps"
    )


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
        return [
            f"raise the per-replica batch (now {cfg.batch_size_per_replica}) to "
            f"{cfg.batch_size_per_replica * 4} or more so each step does more work",
            "use fewer replicas: each adds synchronisation to a step this small",
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


def format_diagnosis(d: Diagnosis) -> str:
    one = d.compute_1_replica_examples_per_s
    compute = (
        f"ideal {d.compute_examples_per_s:,.0f} ex/s on {d.replicas} replicas ({d.replicas} x "
        f"the measured {one:,.0f} on 1; not measured in place)"
        if d.compute_is_ideal
        else f"compute-only {d.compute_examples_per_s:,.0f} ex/s on {d.replicas} replicas"
        + (f" ({one:,.0f} on 1)" if one else "")
    )
    lines = [
        f"bottleneck: {d.bottleneck}",
        f"because:    {d.evidence}",
        f"input-only {d.input_examples_per_s:,.0f} ex/s, {compute}"
        + f", end-to-end {d.end_to_end_examples_per_s:,.0f} ex/s, step "
        f"{d.step_seconds * 1000:.1f} ms",
    ]
    if d.batch_effect is not None:
        lines.append(
            f"batch:      one device computes {d.batch_effect:.2f}x faster at the global batch "
            f"({d.compute_1_device_global_batch_examples_per_s:,.0f} ex/s) than at the "
            f"per-replica batch: that part of the speedup needs no more devices"
        )
    return "\n".join(lines + [f"advice:     {a}" for a in d.advice])


def diagnose_run(
    cfg: TrainConfig,
    manifest: Manifest,
    data_dir: str,
    choice: StrategyChoice,
    cpu_flags: list[str],
    end_to_end: float | None = None,
    steps: int = 30,
    input_transform: Transform | None = None,
) -> Diagnosis:
    """Measures the three throughputs and classifies the run.

    Strategies that run out of process (multi_worker, parameter_server) are probed on one
    device here; their end-to-end rate comes from the run (`end_to_end`) and is compared
    with the ideal, N times the single-replica compute-only rate.
    """
    started = time.perf_counter()
    here = choice.spec.runs_here
    probe_choice = choice if here else baseline_choice(choice)
    rates = probe_rates(cfg, manifest, data_dir, probe_choice, steps, input_transform)
    compute_1 = global_batch_1 = None
    if choice.replicas > 1 and cfg.scaling == "weak":  # the global batch on one device
        global_batch = cfg.batch_size_per_replica * choice.replicas
        whole = dataclasses.replace(cfg, batch_size_per_replica=global_batch)
        global_batch_1 = probe_rates(
            whole, manifest, data_dir, baseline_choice(choice), steps, input_transform, True
        )["compute"]
    if probe_choice.replicas > 1:
        compute_1 = probe_rates(
            cfg,
            manifest,
            data_dir,
            baseline_choice(choice),
            steps,
            input_transform,
            compute_only=True,
        )["compute"]
    if not here:
        compute_1 = rates["compute"]
        rates["compute"] *= choice.replicas  # ideal scaling of the single-replica step
        rates["input"] *= choice.replicas  # each worker has its own input pipeline
        rates["e2e"] = end_to_end or rates["e2e"]
    bottleneck, evidence = classify(
        rates["input"],
        rates["compute"],
        rates["e2e"],
        rates["step_s"],
        choice.replicas,
        compute_1,
        compute_is_ideal=not here,
    )
    return Diagnosis(
        bottleneck=bottleneck,
        input_examples_per_s=rates["input"],
        compute_examples_per_s=rates["compute"],
        end_to_end_examples_per_s=rates["e2e"],
        compute_1_replica_examples_per_s=compute_1,
        replicas=choice.replicas,
        step_seconds=rates["step_s"],
        evidence=evidence,
        advice=recommend(bottleneck, cfg, manifest, choice, cpu_flags),
        seconds=time.perf_counter() - started,
        compute_is_ideal=not here,
        compute_1_device_global_batch_examples_per_s=global_batch_1,
    )
