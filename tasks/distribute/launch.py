"""Local multi-worker training: N worker processes on this host with `TF_CONFIG`.

Worker 0 is the chief and alone writes outputs. The parent waits; if any worker
dies, the rest are stopped at once and the error names the worker and its log. On a host
with GPUs each worker sees its own share of them (`CUDA_VISIBLE_DEVICES`).

With `link_gbit` each worker runs on an emulated host of its own (a network namespace,
`tasks.distribute.netlab`) and the workers talk over its link, at full speed (0) or shaped to that
many Gbit/s: an interconnect this machine does not have, measured for real. The hosts are
deleted when the workers end, whichever way they end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfscale.tasks.core.errors import UsageError, UserError
from tfscale.tasks.core.network import free_ports
from tfscale.tasks.distribute.cluster import EXIT_PREEMPTED

# the entry point each worker process runs: a module of a higher layer, named here and
# bound late (tests/test_layout.py checks that it exists and reads the name as an import)
WORKER_MODULE = "tfscale.flows.worker"

POLL_S = 0.5


class WorkerError(UserError, RuntimeError):
    """A worker process failed or the job ran out of time."""


EMULATED_PORT = 23456  # each emulated host has its own addresses: any port is free there


def tf_config(addresses: list[str], index: int) -> str:
    """A worker's `TF_CONFIG`: every worker's host:port, and which one it is."""
    return json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    )


def launch_workers(
    spec: dict[str, Any],
    workers: int,
    run_dir: Path,
    timeout_s: float = 3600,
    pin_cores: bool = False,
    link_gbit: float | None = None,
) -> None:
    """Runs `flows.worker` in `workers` processes and waits for all of them; with
    `link_gbit`, each on an emulated host of its own, over links of that rate (0: full
    speed), each pinned to a core of its own as separate machines' workers would be.

    Raises:
        WorkerError: a worker exited non-zero (the others are stopped), or the timeout passed.
        UsageError: emulated hosts asked for where they cannot be made (not root, no `ip`).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "worker-spec.json"
    spec_path.write_text(json.dumps(spec))
    if link_gbit is None:
        addresses = [f"localhost:{p}" for p in free_ports(workers)]
        _run_workers(spec_path, addresses, run_dir, timeout_s, pin_cores, _popen_here)
        return
    from tfscale.tasks.distribute import netlab

    why_not = netlab.available()
    if why_not:
        raise UsageError(
            f"emulated links (train.link_gbit {link_gbit:g}) cannot be made here: {why_not}",
            "run as root on Linux with iproute2, or set train.link_gbit: null (localhost).",
        )
    with netlab.namespace_hosts(workers) as hosts:
        if link_gbit > 0:
            for i in range(workers):
                hosts.shape(i, netlab.rate_text(link_gbit))
        addresses = [f"{hosts.address(i)}:{EMULATED_PORT}" for i in range(workers)]
        _run_workers(spec_path, addresses, run_dir, timeout_s, True, hosts.popen)


def _popen_here(index: int, argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """Starts worker `index` on this host (the emulated hosts' `popen` starts it on its)."""
    return subprocess.Popen(argv, **kwargs)


def _run_workers(
    spec_path: Path,
    addresses: list[str],
    run_dir: Path,
    timeout_s: float,
    pin_cores: bool,
    popen: Callable[..., subprocess.Popen],
) -> None:
    """Starts worker `i` at `addresses[i]` through `popen(i, argv, ...)` and waits."""
    workers = len(addresses)
    shares = gpu_shares(workers)
    procs, logs = [], []
    for index in range(workers):
        env = dict(os.environ, TF_CONFIG=tf_config(addresses, index))
        if shares:
            env["CUDA_VISIBLE_DEVICES"] = shares[index]
        if pin_cores:
            env["TFSCALE_PIN_CORE"] = str(index % (os.cpu_count() or 1))
        log_path = run_dir / f"worker-{index}.log"
        logs.append(log_path)
        # -P: the working directory is not put first on the path (as for the `tfscale`
        # command itself), where a project's module named as a standard one would stand in
        argv = [sys.executable, "-P", "-m", WORKER_MODULE, str(spec_path)]
        with open(log_path, "w") as log:
            procs.append(popen(index, argv, env=env, stdout=log, stderr=subprocess.STDOUT))
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
            _raise_first_cause(procs, logs)
            if time.monotonic() > deadline:
                raise WorkerError(f"workers still running after {timeout_s:.0f} s; stopped them.")
            time.sleep(POLL_S)
        _raise_first_cause(procs, logs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _raise_first_cause(procs: list[subprocess.Popen], logs: list[Path]) -> None:
    """The error of a worker that failed, where one has: a preempted one first (its advice
    is to run again), then one killed by a signal before one that exited with an error (a
    peer lost, its collective fails in well under a poll's 0.5 s: both are seen at once),
    else the first; the others that failed in the same poll are named after it."""
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() not in (None, 0)]
    if not failed:
        return
    failed.sort(key=lambda found: (found[1] != EXIT_PREEMPTED, found[1] >= 0, found[0]))
    (index, code), others = failed[0], failed[1:]
    error = _exit_error(index, code, logs[index])
    if others:
        also = ", ".join(f"worker {i} with code {c}" for i, c in others)
        error = WorkerError(f"{error.message}\n(in the same poll: {also})", error.fix)
    raise error


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(line for line in text if "I0000" not in line)[-3000:] or "(empty)"
