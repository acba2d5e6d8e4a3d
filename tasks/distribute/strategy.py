"""Choosing the tf.distribute strategy and precision from the hardware, and building it.

The policy, in order (every choice can be overridden with --strategy / --precision):

| hardware                               | strategy                         |
| -------------------------------------- | -------------------------------- |
| a TPU                                  | tpu                              |
| a cluster with ps tasks                | parameter_server                 |
| a cluster (or --workers) with >1 worker| multi_worker (NCCL on GPUs, RING)|
| more than one local GPU                | mirrored (NCCL, hierarchical copy fallback) |
| CPU only and --replicas N > 1          | mirrored over N logical CPUs     |
| one GPU, or CPU only                   | one_device                       |

Precision: mixed_bfloat16 on TPUs and on CPUs with AMX or avx512_bf16,
mixed_float16 on GPUs of compute capability 7.0+, float32 otherwise. XLA: off.

This is a proposal from the hardware alone: where the config says `auto` and the run trains
in this process, `tasks.measure.autotune` times the candidates and keeps the fastest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.distribute.hardware import HardwareReport
from tfscale.tasks.settings.config import TrainConfig
from tfscale.tasks.settings.kinds import BASELINE, StrategyKind, kind_of, shape_text


@dataclass(frozen=True)
class StrategyChoice:
    kind: str
    replicas: int
    workers: int
    precision: str
    reason: str
    devices: str = "cpu"
    communication: str = "auto"
    jit_compile: bool = False  # XLA compiles each replica's step
    # pipeline (`tasks/train/stage_plan.py`): stages (devices), micro-batches per step, where to cut
    stages: int = 1
    micro_batches: int = 1
    cut_after: tuple[int, ...] = ()
    device_memory_mb: float = 0.0  # a device's memory budget (0: not checked)
    # what `auto` measured to settle it (`tasks.measure.autotune.settle`): each candidate's
    # label and examples/s (median, lowest, highest round), the chosen one first; the
    # verdict (`the fastest of 2`); and the hardware's proposal's reason
    measured: tuple[tuple[str, float, float, float], ...] = ()
    measured_verdict: str = ""
    proposed: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def spec(self) -> StrategyKind:
        """Everything that differs between strategies (`tasks/settings/kinds.py`)."""
        return kind_of(self.kind)

    @property
    def shape(self) -> str:
        """`2 replicas`, or `2 stages x 4 micro-batches`."""
        splits = self.spec.splits
        return shape_text(self.replicas, self.stages if splits else 1, self.micro_batches, splits)

    @property
    def logical_cpus(self) -> int:
        """Logical CPU devices this process needs before TensorFlow starts (0: none)."""
        here = self.devices == "cpu" and self.spec.runs_here
        return max(self.replicas, self.stages) if here else 0


def select_strategy(report: HardwareReport, cfg: TrainConfig) -> StrategyChoice:
    """A pure function of the hardware report and the training config."""
    kind, reason = _pick_kind(report, cfg)
    precision, why = _pick_precision(report, cfg)
    spec = kind_of(kind)
    jit_compile, why_jit = _pick_jit(cfg, spec)
    gpus = len(report.gpus)
    devices = spec.devices or ("gpu" if gpus else "cpu")
    cluster_workers = report.cluster.num_workers if report.cluster else 0
    workers = cluster_workers or (cfg.workers if spec.takes_workers else 1)
    replicas = spec.count_replicas(cfg.replicas, gpus, workers)
    communication = spec.communication(devices)
    if spec.splits:
        _check_stages(report, cfg, spec.staged)
    _check_loop(cfg, spec)
    # a pipeline's stages, or the devices `auto` may cut a model over if it does not fit one
    stages = cfg.stages if spec.splits or (cfg.strategy == "auto" and cfg.device_memory_mb) else 1
    if spec.staged:
        reason = f"{reason}, {stages} stages of {cfg.micro_batches} micro-batches"
    return StrategyChoice(
        kind,
        replicas,
        workers,
        precision,
        f"{reason}; {why}; {why_jit}",
        devices,
        communication,
        jit_compile,
        stages,
        cfg.micro_batches if spec.staged else 1,
        tuple(cfg.cut_after) if spec.staged else (),
        cfg.device_memory_mb or device_memory_mb(report),
    )


def device_memory_mb(report: HardwareReport) -> float:
    """The smallest GPU's memory (0 without GPUs: on CPUs only `train.device_memory_mb`)."""
    return float(min((g.memory_mb or 0 for g in report.gpus), default=0))


def _check_stages(report: HardwareReport, cfg: TrainConfig, micro_batches: bool) -> None:
    """A model split over devices needs a device per part (`train.stages`), and a pipeline
    micro-batches that divide its batch.

    Raises:
        UsageError: more stages than devices (GPUs, else CPU cores), or a batch the
            micro-batches do not divide.
    """
    devices = len(report.gpus) or report.cpu_cores
    what = "GPUs" if report.gpus else "CPU cores"
    if cfg.stages > devices:
        raise UsageError(
            f"train.stages ({cfg.stages}) is more than this machine's {devices} {what}: "
            "each stage (or part of a split layer) needs a device of its own",
            f"set train.stages to {devices} or fewer.",
        )
    if micro_batches and cfg.per_replica_batch % cfg.micro_batches:
        raise UsageError(
            f"train.micro_batches ({cfg.micro_batches}) does not divide the batch of "
            f"{cfg.per_replica_batch} (train.batch_size_per_replica)",
            "pick micro-batches that divide the batch (for 32: 1, 2, 4, 8, 16 or 32).",
        )


def _pick_kind(report: HardwareReport, cfg: TrainConfig) -> tuple[str, str]:
    if cfg.strategy != "auto":
        return cfg.strategy, f"{cfg.strategy} as requested (--strategy)"
    cluster = report.cluster
    if report.tpu:
        return "tpu", f"a TPU ({report.tpu}) is attached"
    if cluster and cluster.ps:
        return "parameter_server", f"the {cluster.source} cluster has {len(cluster.ps)} ps tasks"
    if cluster and cluster.num_workers > 1:
        return "multi_worker", f"the {cluster.source} cluster has {cluster.num_workers} workers"
    if cfg.workers > 1:
        return "multi_worker", f"{cfg.workers} local worker processes requested (--workers)"
    if len(report.gpus) > 1:
        return "mirrored", f"{len(report.gpus)} local GPUs"
    if not report.gpus and cfg.replicas > 1:
        return "mirrored", f"CPU only, {cfg.replicas} replicas over logical CPU devices"
    if report.gpus:
        return "one_device", "one GPU"
    return "one_device", "CPU only, one replica"


def _check_loop(cfg: TrainConfig, spec: StrategyKind) -> None:
    """Keras's `fit` (`train.loop: fit`) where it can train the run.

    Raises:
        UsageError: a strategy `fit` does not train under, or gradient accumulation (which
            Keras's optimizer fails at under Mirrored: keras-team/keras#20582).
    """
    if cfg.loop != "fit":
        return
    if not spec.keras_fit:
        raise UsageError(
            f"train.loop fit: Keras's model.fit does not train under {spec.name} (Keras 3 on "
            "TensorFlow: keras-team/keras#20585 for multi_worker, #18624 for "
            "parameter_server; pipeline stages are tfscale's own)",
            "use --loop tfscale (the default), or --strategy mirrored or one_device",
        )
    if cfg.grad_accum_steps > 1:
        raise UsageError(
            "train.loop fit: Keras's fit does not accumulate micro-batches under a strategy "
            "(its optimizer's gradient_accumulation_steps fails: keras-team/keras#20582)",
            "set --grad-accum-steps 1, or use --loop tfscale",
        )


def _pick_precision(report: HardwareReport, cfg: TrainConfig) -> tuple[str, str]:
    if cfg.precision != "auto":
        return cfg.precision, f"{cfg.precision} as requested (--precision)"
    if report.tpu:
        return "mixed_bfloat16", "mixed_bfloat16 because TPUs compute in bfloat16"
    if report.gpus:
        caps = [g.compute_capability or (0, 0) for g in report.gpus]
        if all(tuple(c) >= (7, 0) for c in caps):
            return "mixed_float16", "mixed_float16 because the GPUs have tensor cores (cc >= 7.0)"
        return "float32", "float32 because a GPU below compute capability 7.0 gains nothing"
    bf16 = [f for f in ("amx_bf16", "avx512_bf16") if f in report.cpu_flags]
    if bf16:
        return "mixed_bfloat16", f"mixed_bfloat16 because the CPU has {' and '.join(bf16)}"
    return "float32", "float32 because mixed precision is slower on a CPU without AMX/avx512_bf16"


def _pick_jit(cfg: TrainConfig, spec: StrategyKind) -> tuple[bool, str]:
    """XLA as requested, else off until `tasks.measure.autotune` measures it faster, on one device
    only (Keras's own `auto` keeps it off on CPUs and under any tf.distribute strategy).

    Raises:
        UsageError: XLA asked for under a strategy of several replicas.
    """
    if cfg.jit_compile == "auto":
        return False, "XLA off unless measured faster (on one device)"
    if cfg.jit_compile and spec is not BASELINE:
        raise UsageError(
            f"train.jit_compile: true is not supported with {spec.name}: XLA compiles a "
            "step for one device, and its replicas' variables live on several (XLA's known "
            "issue 'tf.Variable on a different device')",
            "set train.jit_compile: auto (or false), or train with --strategy one_device.",
        )
    return cfg.jit_compile, f"XLA {'on' if cfg.jit_compile else 'off'} as requested"


def baseline_choice(choice: StrategyChoice) -> StrategyChoice:
    """The single-device run the distributed one is measured against (same precision and
    XLA)."""
    return StrategyChoice(
        BASELINE.name,
        1,
        1,
        choice.precision,
        f"single-device baseline for {choice.kind}",
        choice.devices,
        jit_compile=choice.jit_compile,
    )


def build_strategy(choice: StrategyChoice, resolver: Any = None, timeout_s: float = 60.0) -> Any:
    """The tf.distribute strategy `choice` names, over the devices `tasks.core.process` set up.

    Args:
        choice: what `select_strategy` decided.
        resolver: a cluster resolver for `parameter_server` or `tpu` (default: from the
            environment: `TF_CONFIG`, or the TPU resolver).
        timeout_s: how long a cross-process collective waits on a lost peer.
    """
    return choice.spec.build(choice, resolver, timeout_s)
