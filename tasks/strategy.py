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
mixed_float16 on GPUs of compute capability 7.0+, float32 otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tasks.config import TrainConfig
from tasks.hardware import HardwareReport

COLLECTIVE_TIMEOUT_S = 300


@dataclass(frozen=True)
class StrategyChoice:
    kind: str
    replicas: int
    workers: int
    precision: str
    reason: str
    devices: str = "cpu"
    communication: str = "auto"

    def to_dict(self) -> dict:
        return asdict(self)


def select_strategy(report: HardwareReport, cfg: TrainConfig) -> StrategyChoice:
    """A pure function of the hardware report and the training config."""
    kind, reason = _pick_kind(report, cfg)
    precision, why = _pick_precision(report, cfg)
    gpus = len(report.gpus)
    devices = "tpu" if kind == "tpu" else "gpu" if gpus else "cpu"
    cluster_workers = report.cluster.num_workers if report.cluster else 0
    workers = cluster_workers or (
        cfg.workers if kind in ("multi_worker", "parameter_server") else 1
    )
    per_worker = max(gpus, 1)
    replicas = {
        "one_device": 1,
        "mirrored": gpus if gpus > 1 else cfg.replicas,
        "multi_worker": workers * per_worker,
        "parameter_server": workers,
        "tpu": cfg.replicas,
    }[kind]
    communication = (
        "nccl"
        if devices == "gpu" and kind in ("mirrored", "multi_worker")
        else ("ring" if kind == "multi_worker" else "auto")
    )
    return StrategyChoice(
        kind, replicas, workers, precision, f"{reason}; {why}", devices, communication
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


def baseline_choice(choice: StrategyChoice) -> StrategyChoice:
    """The single-device run the distributed one is measured against (same precision)."""
    return StrategyChoice(
        "one_device",
        1,
        1,
        choice.precision,
        f"single-device baseline for {choice.kind}",
        choice.devices,
    )


def ensure_logical_cpus(n: int) -> list[str]:
    """Splits the CPU into `n` logical devices (before TF starts), returning their names."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    have = tf.config.get_logical_device_configuration(cpu) or []
    if len(have) < n:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * n
            )
        except RuntimeError:
            if len(tf.config.list_logical_devices("CPU")) < n:
                raise RuntimeError(
                    f"Expected {n} logical CPU devices for {n} replicas, but TensorFlow was "
                    f"already initialised with {len(tf.config.list_logical_devices('CPU'))}; "
                    f"start a fresh process (as 'tfscale train' does)."
                ) from None
    return [d.name for d in tf.config.list_logical_devices("CPU")[:n]]
