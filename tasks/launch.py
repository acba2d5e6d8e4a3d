"""Local multi-worker training: N worker processes on this host with `TF_CONFIG`.

Worker 0 is the chief and alone writes outputs. The parent waits; if any worker
dies, the rest are stopped at once and the error names the worker and its log. On a host
with GPUs each worker sees its own share of them (`CUDA_VISIBLE_DEVICES`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tasks.cluster import EXIT_PREEMPTED
from tasks.errors import UsageError, UserError
from tasks.network import free_ports

POLL_S = 0.5


class WorkerError(UserError, RuntimeError):
    """A worker process failed or the job ran out of time."""


def tf_config(ports: list[int], index: int) -> str:
    workers = [f"localhost:{p}" for p in ports]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def launch_workers(
    spec: dict[str, Any],
    workers: int,
    run_dir: Path,
    timeout_s: float = 3600,
    pin_cores: bool = False,
) -> None:
    """Runs `tasks.worker` in `workers` processes and waits for all of them.

    Raises:
        WorkerError: a worker exited non-zero (the others are stopped), or the timeout passed.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "worker-spec.json"
    spec_path.write_text(json.dumps(spec))
    ports = free_ports(workers)
    shares = gpu_shares(workers)
    procs, logs = [], []
    for index in range(workers):
        env = dict(os.environ, TF_CONFIG=tf_config(ports, index))
        if shares:
            env["CUDA_VISIBLE_DEVICES"] = shares[index]
        if pin_cores:
            env["TFSCALE_PIN_CORE"] = str(index % (os.cpu_count() or 1))
        log_path = run_dir / f"worker-{index}.log"
        logs.append(log_path)
        with open(log_path, "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tasks.worker", str(spec_path)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    _wait(procs, logs, timeout_s)


def gpu_shares(workers: int) -> list[str]:
    """Each worker's `CUDA_VISIBLE_DEVICES`: the visible GPUs split evenly (none: [])."""
    import tensorflow as tf

    count = len(tf.config.list_physical_devices("GPU"))
    if not count:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(count)]
    per_worker = len(ids) // workers
    if per_worker < 1:
        raise UsageError(
            f"{workers} workers for {len(ids)} GPUs: each worker needs a GPU of its own",
            f"use --workers {len(ids)} or fewer.",
        )
    return [",".join(ids[i * per_worker : (i + 1) * per_worker]) for i in range(workers)]


def _exit_error(index: int, code: int, log: Path) -> WorkerError:
    if code == EXIT_PREEMPTED:
        return WorkerError(
            f"worker {index} was preempted (exit {code}) and saved a checkpoint at its "
            f"current step",
            "run the same command again: it resumes from that step.",
        )
    return WorkerError(
        f"worker {index} exited with code {code}; the other workers were stopped. "
        f"Its log ({log}) ends:\n{_tail(log)}"
    )


def _wait(procs: list[subprocess.Popen], logs: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            for index, proc in enumerate(procs):
                if proc.poll() not in (None, 0):
                    raise _exit_error(index, proc.returncode, logs[index])
            if time.monotonic() > deadline:
                raise WorkerError(f"workers still running after {timeout_s:.0f} s; stopped them.")
            time.sleep(POLL_S)
        failed = [i for i, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise _exit_error(failed[0], procs[failed[0]].returncode, logs[failed[0]])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(line for line in text if "I0000" not in line)[-3000:] or "(empty)"
