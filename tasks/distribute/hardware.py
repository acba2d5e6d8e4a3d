"""What hardware this process can train on: CPU and its instruction sets, GPUs, TPUs, cluster."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tfscale.tasks.core.errors import UsageError

CPU_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")
TPU_HINTS = ("TPU_NAME", "TPU_WORKER_ID", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_ACCELERATOR_TYPE")


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: tuple[int, int] | None
    memory_mb: int | None = None


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster this process is one task of (from TF_CONFIG or Slurm)."""

    source: str
    workers: list[str]
    ps: list[str] = field(default_factory=list)
    chief: list[str] = field(default_factory=list)
    task_type: str = "worker"
    task_index: int = 0

    @property
    def num_workers(self) -> int:
        """Tasks that step: the workers, and the chief too unless it coordinates ps tasks."""
        return len(self.workers) + (0 if self.ps else len(self.chief))

    @property
    def spec(self) -> dict[str, list[str]]:
        """The cluster spec as TensorFlow takes it (jobs with no tasks left out)."""
        jobs = {"chief": self.chief, "worker": self.workers, "ps": self.ps}
        return {job: list(tasks) for job, tasks in jobs.items() if tasks}

    @property
    def is_chief(self) -> bool:
        """The task that writes outputs: the chief, or worker 0 when there is none."""
        if self.chief:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def task_name(self) -> str:
        return f"{self.task_type}:{self.task_index}"

    def address_of(self, job: str, index: int) -> str:
        tasks = self.spec.get(job, [])
        return tasks[index] if 0 <= index < len(tasks) else "address unknown"


@dataclass(frozen=True)
class HardwareReport:
    cpu_model: str
    cpu_cores: int
    cpu_flags: list[str]
    gpus: list[GpuInfo] = field(default_factory=list)
    tpu: str | None = None
    cluster: ClusterInfo | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def fingerprint(self) -> str:
        """A short hash of what affects speed: same hardware, same fingerprint."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def report_from_dict(values: dict) -> HardwareReport:
    """The report `HardwareReport.to_dict` gave (as JSON carries it to a worker process)."""
    cluster = values.get("cluster")
    return HardwareReport(
        **{
            **values,
            "gpus": [
                GpuInfo(g["name"], tuple(g["compute_capability"] or ()) or None, g["memory_mb"])
                for g in values.get("gpus", [])
            ],
            "cluster": ClusterInfo(**cluster) if cluster else None,
        }
    )


def detect_hardware() -> HardwareReport:
    """Reads the CPU, GPUs, TPU and cluster of this process."""
    model, flags = read_cpu()
    return HardwareReport(
        cpu_model=model,
        cpu_cores=os.cpu_count() or 1,
        cpu_flags=flags,
        gpus=detect_gpus(),
        tpu=detect_tpu(),
        cluster=cluster_from_environment(dict(os.environ)),
    )


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """The CPU model name and which of the instruction sets that matter it has."""
    model, flags = platform.processor() or platform.machine(), set()
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    return model, [f for f in CPU_FLAGS_OF_INTEREST if f in flags]


def detect_gpus() -> list[GpuInfo]:
    import tensorflow as tf

    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        gpus.append(
            GpuInfo(details.get("device_name", device.name), details.get("compute_capability"))
        )
    return gpus


def detect_tpu() -> str | None:
    """The TPU's name, asked of the TPU resolver only where the environment hints at one."""
    if not any(os.environ.get(k) for k in TPU_HINTS) and not Path("/dev/accel0").exists():
        return None
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        return resolver.master() or "local"
    except (ValueError, RuntimeError):
        return None


def cluster_from_environment(env: dict[str, str]) -> ClusterInfo | None:
    """The cluster from `TF_CONFIG` (Kubeflow TFJob and others) or Slurm's variables."""
    if env.get("TF_CONFIG"):
        return _from_tf_config(env["TF_CONFIG"])
    if int(env.get("SLURM_NTASKS", "1")) > 1 and env.get("SLURM_JOB_NODELIST"):
        import tensorflow as tf

        SlurmClusterResolver = tf.distribute.cluster_resolver.SlurmClusterResolver

        resolver = SlurmClusterResolver(
            jobs=slurm_jobs(env),
            port_base=int(env.get("TFSCALE_PORT_BASE", "8888")),
            gpus_per_node=max(len(tf.config.list_physical_devices("GPU")), 1),  # 0 breaks it
        )
        spec = resolver.cluster_spec().as_dict()
        return ClusterInfo(
            source="Slurm",
            workers=spec.get("worker", []),
            ps=spec.get("ps", []),
            chief=spec.get("chief", []),
            task_type=resolver.task_type,
            task_index=resolver.task_id,
        )
    return None


def slurm_task_cpus(env: dict[str, str]) -> int | None:
    """The CPUs Slurm gave this task: `SLURM_CPUS_PER_TASK`, else the job's CPUs on this
    node (`SLURM_CPUS_ON_NODE`) shared by its tasks here (`SLURM_NTASKS_PER_NODE`, else
    this node's entry of `SLURM_TASKS_PER_NODE`, as "2(x3),1"). None outside a Slurm task.
    A node that does not bind tasks to CPUs (task/none) shows each task every core, and
    TensorFlow's pools would take them all, the other tasks' too."""
    if env.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(int(env["SLURM_CPUS_PER_TASK"]), 1)
    on_node = env.get("SLURM_CPUS_ON_NODE", "")
    if not on_node.isdigit():
        return None
    tasks = env.get("SLURM_NTASKS_PER_NODE", "")
    if not tasks.isdigit():
        per_node: list[int] = []
        for part in filter(None, env.get("SLURM_TASKS_PER_NODE", "1").split(",")):
            count, _, repeat = part.partition("(x")
            per_node += [int(count)] * int(repeat.rstrip(")") or 1)
        node = int(env.get("SLURM_NODEID", "0") or 0)
        tasks = str(per_node[node] if node < len(per_node) else per_node[-1])
    return max(int(on_node) // max(int(tasks), 1), 1)


SLURM_JOBS_FIX = (
    "set TFSCALE_SLURM_JOBS to the tasks of each job by rank, as chief:1,worker:2,ps:1, "
    "adding up to the job's tasks (SLURM_NTASKS), or unset it: every task a worker"
)


def slurm_jobs(env: dict[str, str]) -> dict[str, int] | None:
    """The jobs a Slurm job's tasks take by rank (`TFSCALE_SLURM_JOBS`, for example
    `chief:1,worker:2,ps:1`); None: all workers. TensorFlow's SlurmClusterResolver hands
    out the ranks to the jobs in the order of their names: chief, ps, worker (rank 0 the
    chief, 1 the ps, 2-3 the workers).

    Raises:
        UsageError: not `job:count` pairs of chief, worker and ps, or counts that do not add
            up to the job's tasks.
    """
    text = env.get("TFSCALE_SLURM_JOBS", "").strip()
    if not text:
        return None
    try:
        jobs = {job.strip(): int(n) for job, n in (part.split(":") for part in text.split(","))}
    except ValueError:
        raise UsageError(
            f"TFSCALE_SLURM_JOBS={text!r} is not job:count pairs", SLURM_JOBS_FIX
        ) from None
    tasks = int(env.get("SLURM_NTASKS", "1"))
    if set(jobs) - {"chief", "worker", "ps"} or sum(jobs.values()) != tasks:
        raise UsageError(
            f"TFSCALE_SLURM_JOBS={text!r} does not give this job's {tasks} tasks to chief, "
            "worker and ps",
            SLURM_JOBS_FIX,
        )
    return jobs


_TF_CONFIG_FIX = (
    'set TF_CONFIG to {"cluster": {"worker": ["host:port", ...]}, "task": {"type": '
    '"worker", "index": i}} with i below the number of that job\'s tasks (as a TFJob '
    "sets it), or unset it to train on this machine alone"
)


def _from_tf_config(text: str) -> ClusterInfo:
    """The cluster `TF_CONFIG` describes, this task's place in it checked: a replica whose
    task is not in its cluster would otherwise train the whole job alone.

    Raises:
        UsageError: `TF_CONFIG` is not JSON, has no tasks, or names a task outside them.
    """
    try:
        config = json.loads(text)
        spec, task = config.get("cluster") or {}, config.get("task") or {}
        task_type, index = task.get("type", "worker"), task.get("index", 0)
        if isinstance(index, bool) or not isinstance(index, (int, str)):
            raise ValueError(f"task index {index!r} is not a whole number")
        index = int(index)
        jobs = {job: _addresses(spec, job) for job in ("chief", "worker", "ps")}
    except (ValueError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"TF_CONFIG is not a valid cluster description ({exc})", _TF_CONFIG_FIX
        ) from exc
    unknown = sorted(set(spec) - {"chief", "worker", "ps", "evaluator"})
    if unknown or task_type not in ("chief", "worker", "ps", "evaluator"):
        named = f"job(s) {', '.join(unknown)}" if unknown else f"task type {task_type!r}"
        raise UsageError(
            f"TF_CONFIG names {named}: TensorFlow knows chief, worker, ps and evaluator",
            _TF_CONFIG_FIX,
        )
    if not any(jobs.values()):
        raise UsageError("TF_CONFIG names no chief, worker or ps tasks", _TF_CONFIG_FIX)
    tasks = jobs.get(task_type)
    if task_type == "evaluator":  # a sidecar beside the cluster's jobs, as TensorFlow has it
        tasks = list(spec.get("evaluator") or ["beside the cluster"])
    if tasks is None or not 0 <= index < len(tasks):
        held = ", ".join(f"{len(t)} {job}" for job, t in jobs.items() if t)
        raise UsageError(
            f"TF_CONFIG's task {task_type}:{index} is not in its cluster ({held})",
            _TF_CONFIG_FIX,
        )
    return ClusterInfo(
        source="TF_CONFIG",
        workers=jobs["worker"],
        ps=jobs["ps"],
        chief=jobs["chief"],
        task_type=task_type,
        task_index=index,
    )


def _addresses(spec: dict, job: str) -> list[str]:
    """A job's task addresses: a list of `host:port` strings (a lone string would be one
    task per character).

    Raises:
        ValueError: the job is not such a list, naming the job and what it is.
    """
    tasks = spec.get(job) or []
    if not isinstance(tasks, list) or not all(
        isinstance(t, str) and re.fullmatch(r"\[?[^\s/]+\]?:\d{1,5}", t) for t in tasks
    ):
        raise ValueError(f'cluster "{job}" is {tasks!r}, not a list of "host:port" strings')
    return list(tasks)


def hardware_line(report: HardwareReport) -> str:
    """One line: cores, accelerators, cluster."""
    parts = [f"{report.cpu_cores} CPU cores"]
    parts.append(f"{len(report.gpus)} GPUs" if report.gpus else "no GPU")
    if report.tpu:
        parts.append(f"TPU {report.tpu}")
    if report.cluster:
        parts.append(f"{report.cluster.source} cluster of {report.cluster.num_workers} workers")
    return ", ".join(parts)


def format_report(report: HardwareReport) -> str:
    lines = [
        f"cpu       {report.cpu_model}, {report.cpu_cores} cores, "
        f"flags: {', '.join(report.cpu_flags) or 'none of interest'}",
        "gpus      "
        + (
            ", ".join(
                f"{g.name} (cc {'.'.join(map(str, g.compute_capability or ()))})"
                for g in report.gpus
            )
            or "none"
        ),
        f"tpu       {report.tpu or 'none'}",
    ]
    c = report.cluster
    lines.append(
        f"cluster   {c.source}: {c.num_workers} workers, {len(c.ps)} ps; this task "
        f"{c.task_type}:{c.task_index}"
        if c
        else "cluster   none (single host)"
    )
    lines.append(f"fingerprint {report.fingerprint}")
    return "\n".join(lines)
