"""`auto`, settled by measuring: what the config left to tfscale (the strategy, the
precision, XLA) is chosen by timing the candidates this hardware allows for a few steps on
the real model and data, in alternating rounds (`tasks.measure.rounds`), and keeping the fastest.

`select_strategy` (`tasks.distribute.strategy`) proposes from the hardware alone; `settle` then
measures where the proposal leaves a choice open and the run trains in this process:

- strategy `auto` on several local replicas (`for_study=False`, as `tfscale train`):
  one device against the replicas. The pipeline keeps the replicas, since its question is
  how they compare with one device; its summary recommends what to use.
- precision `auto`: float32 against the mixed policy the hardware was proposed (none on a
  CPU without AMX or avx512_bf16: nothing to measure).
- `jit_compile: auto`: XLA off against on, for one device (XLA compiles a step for one
  device; replicas' variables live on several).
- `batch_size_per_replica: auto`: `config.DEFAULT_BATCH`, twice and four times it, each
  while an epoch of the training split keeps `MIN_UPDATES` optimizer updates at that
  global batch. A larger batch buys examples/s with fewer updates an epoch, which can cost
  accuracy per epoch more than it gains in speed (the CNN on 8,192 synthetic examples, 2
  replicas in float32: 64 per replica 5,059 ex/s and 90% train accuracy in 2.2 s against
  4,688 and 2.3 s at 32; 128 per replica, 32 updates an epoch, 4,669 ex/s and 4.0 s):
  it is kept only when faster by `BATCH_GAIN` in every round. A model checked against a
  device's memory (`train.device_memory_mb`) or split over devices keeps DEFAULT_BATCH,
  the batch its fit was checked at.

The decision is kept in `<runs_dir>/autotune/<key>.json`, keyed by the hardware
fingerprint, the model, the batch, the input shape, the candidates and the code version,
so a second run on the same machine does not pay for it again.

Ownership: `candidates` and `fastest` are pure; `settle` calls the `measure` it is given
(`tasks.measure.probes.time_candidates` times) and reads and writes the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tfscale.tasks.core.files import write_json_atomic
from tfscale.tasks.core.progress import status
from tfscale.tasks.core.provenance import code_version
from tfscale.tasks.core.user_code import model_fingerprint
from tfscale.tasks.data.manifest import Manifest
from tfscale.tasks.distribute.hardware import HardwareReport
from tfscale.tasks.distribute.strategy import StrategyChoice
from tfscale.tasks.measure.rounds import Spread
from tfscale.tasks.settings.config import DEFAULT_BATCH, TrainConfig
from tfscale.tasks.settings.kinds import BASELINE

log = logging.getLogger(__name__)
# timed rounds (after a warm-up round) of up to this many steps each: of two candidates of
# equal speed, one is faster in every one of 5 rounds by chance once in 32 (`fastest`)
ROUNDS, STEPS = 5, 20
# `batch_size_per_replica: auto`: DEFAULT_BATCH times these, each while an epoch keeps
# MIN_UPDATES updates; a larger batch is kept over a smaller only when faster by BATCH_GAIN
# in every round (module docstring)
BATCH_FACTORS, MIN_UPDATES, BATCH_GAIN = (1, 2, 4), 50, 1.05
TIMED_IN = f"{ROUNDS} rounds of up to {STEPS} steps"  # how each candidate is timed, in words


@dataclass(frozen=True)
class Candidate:
    """One configuration `auto` may choose."""

    kind: str
    replicas: int
    precision: str
    jit_compile: bool
    batch: int = 0  # per replica, when `auto` measures batches (0: the config's own)

    @property
    def label(self) -> str:
        """`one device, float32, XLA off`; `2 replicas, mixed_bfloat16, XLA on, batch 64`
        (the per-replica batch named when it is one of the choices)."""
        devices = (
            "one device"
            if self.kind == BASELINE.name
            else f"{self.replicas} replicas"
            if self.replicas > 1
            else self.kind
        )
        batch = f", batch {self.batch}" if self.batch else ""
        return f"{devices}, {self.precision}, XLA {'on' if self.jit_compile else 'off'}{batch}"

    def applied_to(self, choice: StrategyChoice) -> StrategyChoice:
        return dataclasses.replace(
            choice,
            kind=self.kind,
            replicas=self.replicas,
            precision=self.precision,
            jit_compile=self.jit_compile,
        )

    def applied_to_config(self, cfg: TrainConfig) -> TrainConfig:
        """`cfg` at this candidate's batch (the config's own when it names none)."""
        return dataclasses.replace(cfg, batch_size_per_replica=self.batch or cfg.per_replica_batch)


@dataclass(frozen=True)
class Timed:
    """A candidate's examples/s, one value per timed round."""

    candidate: Candidate
    examples_per_s: tuple[float, ...]

    @property
    def rate(self) -> Spread:
        return Spread.of(list(self.examples_per_s))


def candidates(
    choice: StrategyChoice,
    cfg: TrainConfig,
    report: HardwareReport,
    *,
    for_study: bool,
    examples: int = 0,
) -> list[Candidate]:
    """The configurations `auto` chooses among (one: nothing to measure), for a training
    split of `examples`. Only runs in this process are measured; a cluster, local worker
    processes or a TPU keep the proposal (and an `auto` batch, DEFAULT_BATCH)."""
    proposed = Candidate(choice.kind, choice.replicas, choice.precision, choice.jit_compile)
    if not choice.spec.runs_here or report.cluster is not None or report.tpu:
        return [proposed]
    shapes = [(choice.kind, choice.replicas)]
    if cfg.strategy == "auto" and not for_study and choice.replicas > 1:
        shapes.insert(0, (BASELINE.name, 1))
    precisions = [choice.precision]
    if cfg.precision == "auto" and choice.precision != "float32":
        precisions.insert(0, "float32")

    # XLA compiles one device's step (`tasks.distribute.strategy`)
    def jits(kind: str) -> list[bool]:
        return (
            [False, True]
            if cfg.jit_compile == "auto" and kind == BASELINE.name
            else [choice.jit_compile]
        )

    # a memory budget or a split model: the batch its fit was checked at (train/stage_plan.py)
    fixed = bool(choice.device_memory_mb) or bool(choice.spec.splits)
    per_shape = {shape: batches(cfg, shape[1], examples, fixed=fixed) for shape in shapes}
    named = any(len(b) > 1 for b in per_shape.values())  # the batch is one of the choices
    return [
        Candidate(kind, replicas, precision, jit, batch if named else 0)
        for kind, replicas in shapes
        for precision in precisions
        for jit in jits(kind)
        for batch in per_shape[kind, replicas]
    ]


def batches(cfg: TrainConfig, replicas: int, examples: int, *, fixed: bool = False) -> list[int]:
    """The per-replica batches `auto` measures on `replicas` replicas over a training split
    of `examples`: the config's own when it names one; else DEFAULT_BATCH and its
    multiples (`BATCH_FACTORS`) while an epoch keeps `MIN_UPDATES` updates (DEFAULT_BATCH
    always, and alone when the batch is `fixed`: a device's memory was checked at it).
    Under strong scaling the batch is global and divided among the replicas."""
    if cfg.batch_size_per_replica != "auto":
        return [cfg.batch_size_per_replica]
    if fixed:
        return [DEFAULT_BATCH]
    per_update = (replicas if cfg.scaling == "weak" else 1) * cfg.grad_accum_steps
    sizes = [DEFAULT_BATCH * f for f in BATCH_FACTORS]
    return [b for b in sizes if b == DEFAULT_BATCH or examples // (b * per_update) >= MIN_UPDATES]


def fastest(timed: list[Timed]) -> Timed:
    """The candidate `auto` keeps: the first (the simplest: one device before replicas,
    float32 before mixed, XLA off before on) unless a later one was faster than the one kept
    so far in every round. The highest median alone flipped the default run's precision
    between runs on a 2-core VM (mixed_bfloat16 in four of five, float32 in one, each with a
    speedup of its own): a choice is changed only on a difference every round shows. Of two
    candidates of equal speed, the later wins every one of `ROUNDS` rounds by chance once in
    2**ROUNDS runs (in 3 rounds, one run in 8 still flipped the default's precision). A
    larger batch than the one kept must be faster by `BATCH_GAIN` in every round."""
    kept = timed[0]
    for other in timed[1:]:
        gain = BATCH_GAIN if other.candidate.batch > kept.candidate.batch else 1.0
        pairs = zip(other.examples_per_s, kept.examples_per_s, strict=True)
        if all(a > b * gain for a, b in pairs):
            kept = other
    return kept


def _verdict(kept: Timed, timed: list[Timed]) -> str:
    """`the fastest of 3`, or why a candidate of a higher median was not chosen."""
    if kept.rate.median >= max(t.rate.median for t in timed):
        return f"the fastest of {len(timed)}"
    larger = any(t.candidate.batch > kept.candidate.batch for t in timed)
    by = f" (a larger batch: by {BATCH_GAIN - 1:.0%})" if larger else ""
    return f"kept of {len(timed)}: none was faster than it in every round{by}"


def reason(timed: list[Timed]) -> str:
    """`measured (5 rounds of up to 20 steps), the fastest of 2: 2 replicas, float32, XLA
    off: 1,136 ex/s (1,100-1,150); 2 replicas, float32, XLA on: 864 ex/s (...)`, the chosen
    one first (the same words whether measured now or read from the cache: a run's
    directory and cached results do not depend on which)."""
    best = fastest(timed)
    ordered = [best, *(t for t in timed if t is not best)]
    figures = "; ".join(f"{t.candidate.label}: {t.rate.text(' ex/s', 0)}" for t in ordered)
    return f"measured ({TIMED_IN}), {_verdict(best, timed)}: {figures}"


Measure = Callable[[list[Candidate]], list[Timed]]


@dataclass(frozen=True)
class Settled:
    """The choice `auto` settled on, the training config at the batch it settled on (never
    `auto`), and what it measured (nothing when one candidate)."""

    choice: StrategyChoice
    train: TrainConfig
    timed: tuple[Timed, ...] = ()
    cached: bool = False


def settle(
    choice: StrategyChoice,
    cfg: TrainConfig,
    report: HardwareReport,
    manifest: Manifest,
    measure: Measure,
    *,
    for_study: bool = False,
) -> Settled:
    """`choice` and `cfg` with what `auto` left open chosen by `measure`
    (`probes.time_candidates`, or a stand-in given speeds), from the cache when this
    hardware, model and batch were measured by this code before."""
    options = candidates(
        choice, cfg, report, for_study=for_study, examples=manifest.splits["train"]
    )
    if len(options) == 1:
        return Settled(options[0].applied_to(choice), options[0].applied_to_config(cfg))
    path = _cache_path(cfg, report, manifest, options)
    timed, cached = _read(path, options) or _read_within(path.parent, options), True
    if timed is None:
        labels = "; ".join(option.label for option in options)
        status(
            "measuring",
            f"auto's {len(options)} candidates, {TIMED_IN}: {labels}",
        )
        timed, cached = measure(options), False
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, [dataclasses.asdict(t) for t in timed])
    best = fastest(timed)
    chosen = best.candidate.applied_to(choice)
    why = f"{reason(timed)} (proposed from the hardware: {choice.reason})"
    ordered = [best, *(t for t in timed if t is not best)]
    settled = dataclasses.replace(
        chosen,
        reason=why,
        measured=tuple((t.candidate.label, *dataclasses.astuple(t.rate)) for t in ordered),
        measured_verdict=_verdict(best, timed),
        proposed=choice.reason,
    )
    return Settled(settled, best.candidate.applied_to_config(cfg), tuple(timed), cached)


def _cache_path(
    cfg: TrainConfig, report: HardwareReport, manifest: Manifest, options: list[Candidate]
) -> Path:
    """`runs/autotune/<what is measured>/<among which candidates>.json`: one directory per
    hardware, model, batch, data shape and code, a file per set of candidates timed."""
    setting = json.dumps(
        [
            report.fingerprint,
            model_fingerprint(cfg.model),  # a user's model file: its contents
            cfg.batch_size_per_replica,
            cfg.scaling,
            cfg.grad_accum_steps,
            manifest.feature,
            code_version(),
        ]
    )
    among = json.dumps([dataclasses.astuple(c) for c in options])
    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()[:12]  # noqa: E731
    return Path(cfg.runs_dir) / "autotune" / digest(setting) / f"{digest(among)}.json"


def _read(path: Path, options: list[Candidate] | None) -> list[Timed] | None:
    """The cached measurements of exactly `options` (None: whatever they are), or None
    (absent or unreadable: an unreadable cache is measured again, never trusted)."""
    try:
        rows = json.loads(path.read_text())
        timed = [Timed(Candidate(**r["candidate"]), tuple(r["examples_per_s"])) for r in rows]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        if path.exists():
            log.warning("ignoring the unreadable autotune cache %s (%s)", path, exc)
        return None
    return timed if options is None or [t.candidate for t in timed] == options else None


def _read_within(directory: Path, options: list[Candidate]) -> list[Timed] | None:
    """`options`' own rounds from a measurement of more candidates in the same setting
    (`tfscale train` times one device and the replicas; a study after it, the replicas
    alone): rounds of one alternating session, so they compare among themselves as
    they did among all. None when no measurement there holds them all."""
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        timed = _read(path, None)
        by_candidate = {t.candidate: t for t in timed or []}
        if timed and all(option in by_candidate for option in options):
            return [by_candidate[option] for option in options]
    return None


def settled_line(settled: Settled) -> str:
    """`2 replicas, float32, XLA off: 1,136 ex/s, the fastest of 2 (XLA on 864)`."""
    timed = list(settled.timed)
    best = fastest(timed)
    others = ", ".join(f"{t.candidate.label} {t.rate.median:,.0f}" for t in timed if t is not best)
    again = "; measured before" if settled.cached else ""
    return (
        f"{best.candidate.label}: {best.rate.median:,.0f} ex/s, {_verdict(best, timed)} "
        f"({others}{again})"
    )
