"""A Prefect work pool on hosts of our own: a Prefect server on host 0 of a set of network
namespaces (`tasks.distribute.netlab`), a process worker (`--limit 1`) on each other host, and
commands run on host 0 as a submitter there would run them. Everything is deleted at the
end. Only the namespaces' private addresses are ever addressed.

The test process is not on the hosts' switch: it reaches the server only through commands
run on a host (`on`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import prefect_home, scaled

from tfscale.tasks.distribute import netlab

BIN = Path(sys.executable).parent
PORT = 4200  # the server's own host: nothing else listens in a fresh namespace
# run on the server's host, where the test process cannot reach: tfscale's own health wait
HEALTHY = (
    "import sys; from tasks.core.network import wait_healthy\n"
    "sys.exit(wait_healthy(sys.argv[1], float(sys.argv[2]), interval_s=0.5) is not None)\n"
)
# run on the server's host: returns once every worker named is live in the pool (its
# heartbeat has reached the server), as the sweep judges it (`flows.pool.workers_now`)
LIVE = (
    "import sys, time\n"
    "from prefect.client.orchestration import get_client\n"
    "from tfscale.flows.pool import workers_now\n"
    "pool, deadline, names = sys.argv[1], time.monotonic() + float(sys.argv[2]), sys.argv[3:]\n"
    "live = {}\n"
    "with get_client(sync_client=True) as client:\n"
    "    while time.monotonic() < deadline:\n"
    "        live = workers_now(client, pool)  # none until the workers make the pool\n"
    "        if all(live.get(name) for name in names):\n"
    "            sys.exit(0)\n"
    "        time.sleep(0.5)\n"
    "sys.exit(f'workers {names} not live in pool {pool} within {sys.argv[2]} s: {live}')\n"
)
# the sweep the pool's benchmark runs: digits MLP, 1 and 2 replicas x batch 32, 64 (four
# cells, two for each of two workers; the test runs the two of batch 32)
GRID = {
    "sweep.strategy": "mirrored",
    "sweep.replicas": [1, 2],
    "sweep.dataset_sizes": [0],  # the configured dataset: digits
    "sweep.batch_sizes": [32, 64],
    "sweep.precision": ["float32"],
    "sweep.epochs": 3,
}


class PoolLab:
    """The hosts, the server's URL, the environment that reaches it, and the workers."""

    def __init__(self, hosts: netlab.Hosts, tmp: Path, pool: str):
        self.hosts, self.tmp, self.pool = hosts, tmp, pool
        self.url = f"http://{hosts.address(0)}:{PORT}/api"
        self.env = dict(
            os.environ,
            HOME=str(tmp / "home"),  # nothing written to the real home
            PREFECT_HOME=str(prefect_home(tmp / "prefect-home")),
            PREFECT_API_URL=self.url,
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_UI_ENABLED="false",
            PREFECT_WORKER_QUERY_SECONDS="1",
            # a worker is lost after 3 missed beats (flows/pool.py): at 2 s, a live worker
            # on a loaded machine was declared lost mid-cell (its beats reach the server's
            # SQLite late while 2 cells import TensorFlow), so the beat scales with the pace
            PREFECT_WORKER_HEARTBEAT_SECONDS=str(round(scaled(4))),
        )
        self.server: subprocess.Popen | None = None
        self.workers: dict[int, subprocess.Popen] = {}

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def start_server(self) -> None:
        argv = [str(BIN / "prefect"), "server", "start", "--host", self.hosts.address(0)]
        out = open(self.log("server"), "wb")
        self.server = self.hosts.popen(
            0, [*argv, "--port", str(PORT)], env=self.env, stdout=out, stderr=subprocess.STDOUT
        )
        check = self.on(0, [sys.executable, "-c", HEALTHY, f"{self.url}/health", "120"])
        assert check.returncode == 0, self.log("server").read_text()[-3000:]

    def start_worker(self, i: int) -> None:
        """A process worker of the pool on host `i`, taking one flow run at a time."""
        argv = [str(BIN / "prefect"), "worker", "start", "--pool", self.pool, "--type", "process"]
        out = open(self.log(f"worker-{i}"), "wb")
        self.workers[i] = self.hosts.popen(
            i,
            [*argv, "--limit", "1", "--name", f"w{i}"],
            env=self.env,
            cwd=self.tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def wait_live(self, *hosts: int) -> None:
        """Returns once the workers on `hosts` are live in the pool (a sweep started before
        their first heartbeat reaches the server finds no live worker and stops)."""
        names = [f"w{i}" for i in hosts]
        check = self.on(0, [sys.executable, "-c", LIVE, self.pool, str(scaled(120)), *names])
        logs = "".join(self.log(f"worker-{i}").read_text()[-1500:] for i in hosts)
        assert check.returncode == 0, check.stderr[-2000:] + logs

    def on(self, i: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """`argv` run to its end on host `i`, its output captured."""
        kwargs.setdefault("timeout", 300)
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts.name(i), *argv],
            env=kwargs.pop("env", self.env),
            capture_output=True,
            text=True,
            **kwargs,
        )

    def kill_host(self, i: int) -> None:
        """Every process on host `i` killed at once, as when the host dies."""
        pids = subprocess.run(
            ["ip", "netns", "pids", self.hosts.name(i)],
            capture_output=True,
            text=True,
            timeout=scaled(60),
        ).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Every process on the hosts killed, as `kill_host` kills them: the workers and
        their flow runs, the server, and whatever else runs on its host (a sweep that a
        failed test left running would go on writing into the next run's directories)."""
        for i in [*self.workers, 0]:
            self.kill_host(i)
        for proc in [*self.workers.values(), *([self.server] if self.server else [])]:
            proc.terminate()
            try:
                proc.wait(timeout=scaled(30))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=scaled(10))


def first_with_text(paths: dict[int, Path], text: str, timeout_s: float) -> int:
    """The key of the first of `paths` whose file holds `text` (a worker's log, when it
    takes a cell); fails with their tails."""
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        for key, path in paths.items():
            if path.exists() and text in path.read_text(errors="replace"):
                return key
        time.sleep(0.2)
    tails = {
        str(path): path.read_text(errors="replace")[-1500:] if path.exists() else "(no file)"
        for path in paths.values()
    }
    raise AssertionError(f"{text!r} not in any of {tails} within {timeout_s:.0f} s")


@contextmanager
def pool_lab(
    workers: int, tmp: Path, pool: str = "tfscale-test", spare: int = 0
) -> Iterator[PoolLab]:
    """A server on host 0, `workers` workers on hosts 1..workers, live once it yields, and
    `spare` hosts after them with no worker yet (`start_worker`), all stopped and the hosts
    deleted on exit."""
    with netlab.namespace_hosts(workers + spare + 1) as hosts:
        lab = PoolLab(hosts, tmp, pool)
        try:
            lab.start_server()
            for i in range(1, workers + 1):
                lab.start_worker(i)
            if workers:
                lab.wait_live(*range(1, workers + 1))
            yield lab
        finally:
            lab.stop()
