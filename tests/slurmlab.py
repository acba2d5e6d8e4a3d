"""A real Slurm cluster on namespace hosts, for the tests: `slurmctld` on host 0 and one
`slurmd` per other host, Debian's `slurm-wlm` with `munge` (installed when missing).

Each daemon runs in its host's network namespace (`nsenter --net`, not `ip netns exec`,
which mounts a fresh /sys and hides the cgroup mounts slurmd needs) and in a mount
namespace of its own where /etc/hosts names every host, so a job's tasks find each other
by node name; nothing of the machine's own files changes. `slurmctld` must run under this
machine's host name (the namespaces share it). Everything is stopped and deleted on exit.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import INNER_LIMIT_S, scaled

from tfscale.tasks.distribute import netlab

PACKAGES = ("slurm-wlm", "munge")


def install() -> str | None:
    """Installs Slurm and munge from Debian when missing; why not, when it cannot."""
    if shutil.which("slurmctld") and shutil.which("munged"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "Slurm is not installed, and installing it needs root and apt-get"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")

    def apt_get(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["apt-get", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(INNER_LIMIT_S),
        )

    done = apt_get("install", "-y", "-q", *PACKAGES)
    if done.returncode != 0:  # the package lists may be missing on a fresh machine
        apt_get("update", "-q")
        done = apt_get("install", "-y", "-q", *PACKAGES)
    if done.returncode != 0:
        return f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr[-500:]}"
    return None


@contextmanager
def munge() -> Iterator[None]:
    """munged running (started here, and stopped on exit, when it was not)."""
    if (
        subprocess.run(
            ["pgrep", "-x", "munged"], capture_output=True, timeout=scaled(60)
        ).returncode
        == 0
    ):
        yield
        return
    for path in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(path).mkdir(parents=True, exist_ok=True)
        shutil.chown(path, "munge", "munge")
    subprocess.run(
        ["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True, timeout=scaled(60)
    )
    try:
        yield
    finally:
        subprocess.run(["pkill", "-x", "munged"], capture_output=True, timeout=scaled(60))


class SlurmCluster:
    """`nodes` compute nodes (hosts 1..nodes) and a controller (host 0)."""

    def __init__(self, hosts: netlab.Hosts, nodes: int, tmp: Path):
        self.hosts, self.nodes, self.tmp = hosts, nodes, tmp
        self.conf = tmp / "slurm.conf"
        self.daemons: list[subprocess.Popen] = []
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def node(self, i: int) -> str:
        return self.hosts.name(i)

    def write_config(self) -> None:
        names = "".join(
            f"{self.hosts.address(i)} {self.hosts.name(i)}\n" for i in range(self.nodes + 1)
        )
        (self.tmp / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        (self.tmp / "state").mkdir(exist_ok=True)
        nodes = [self.node(i) for i in range(1, self.nodes + 1)]
        lines = [
            "ClusterName=tfscale",
            f"SlurmctldHost={socket.gethostname()}({self.hosts.address(0)})",
            "AuthType=auth/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2",
            # the scheduler looks every 2 s, not every 60 (a requeued job waits for its look)
            "SchedulerParameters=sched_interval=2,bf_interval=2",
            "MailProg=/bin/true",
            f"StateSaveLocation={self.tmp}/state",
            f"SlurmdSpoolDir={self.tmp}/spool-%n",
            f"SlurmctldPidFile={self.tmp}/slurmctld.pid",
            f"SlurmdPidFile={self.tmp}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.tmp}/slurmctld.log",
            f"SlurmdLogFile={self.tmp}/slurmd-%n.log",
            *(
                f"NodeName={self.node(i)} NodeAddr={self.hosts.address(i)} CPUs=1 State=UNKNOWN"
                for i in range(1, self.nodes + 1)
            ),
            f"PartitionName=main Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def on(self, i: int, argv: list[str]) -> list[str]:
        """`argv` on host `i`: its network, and /etc/hosts naming every host."""
        net = f"/run/netns/{self.hosts.name(i)}"
        script = f'mount --bind {self.tmp}/hosts /etc/hosts && exec nsenter --net={net} "$@"'
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *argv]

    def start(self) -> None:
        self.write_config()
        log = open(self.tmp / "daemons.log", "ab")
        conf = ["-f", str(self.conf)]
        self.daemons.append(
            subprocess.Popen(
                self.on(0, ["slurmctld", "-D", *conf]), env=self.env, stdout=log, stderr=log
            )
        )
        for i in range(1, self.nodes + 1):
            argv = ["slurmd", "-D", "-N", self.node(i), *conf]
            self.daemons.append(
                subprocess.Popen(self.on(i, argv), env=self.env, stdout=log, stderr=log)
            )
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
            if len(states) == self.nodes and set(states) == {"idle"}:
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"the Slurm nodes did not come up: {(self.tmp / 'daemons.log').read_text()[-2000:]}"
        )

    def run(
        self,
        *argv: str,
        check: bool = True,
        env: dict | None = None,
        timeout: float = scaled(INNER_LIMIT_S),
    ):
        """A Slurm command (sbatch, scancel, scontrol, ...) from the controller's host."""
        done = subprocess.run(
            self.on(0, list(argv)),
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout}{done.stderr}"
        return done

    def job(self, job: str) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, Restarts, ExitCode, ...)."""
        out = self.run("scontrol", "show", "job", job).stdout
        return dict(w.split("=", 1) for w in out.split() if "=" in w)

    def wait(self, job: str, states: set[str], timeout_s: float = 240, restarts: int = 0) -> str:
        """The job's state once it is one of `states` in its run number `restarts` (a
        requeued job shows its last run's FAILED until the controller has requeued it)."""
        deadline = time.monotonic() + scaled(timeout_s)
        state = "?"
        while time.monotonic() < deadline:
            info = self.job(job)
            state = info["JobState"]
            if state in states and int(info.get("Restarts", "0")) >= restarts:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job} not {states} within {timeout_s:.0f} s: {state}")

    def stop(self) -> None:
        for proc in self.daemons:
            proc.terminate()
        for proc in self.daemons:
            try:
                proc.wait(timeout=scaled(20))
            except subprocess.TimeoutExpired:
                proc.kill()
        # a job step still running (slurmstepd, its task) ends with its node's host
        # (`netlab.Hosts.delete`)


@contextmanager
def slurm_cluster(nodes: int, tmp: Path) -> Iterator[SlurmCluster]:
    """A controller and `nodes` compute nodes of one CPU each, each on a host of its own."""
    with munge(), netlab.namespace_hosts(nodes + 1) as hosts:
        cluster = SlurmCluster(hosts, nodes, tmp)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
