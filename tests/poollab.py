"""A Prefect work pool on hosts of our own: a Prefect server on host 0 of a set of network
namespaces (`tasks.distribute.netlab`), a process worker (`--limit 1`) on each other host, and
commands run on host 0 as a submitter there would run them. Everything is deleted at the
end. Only the namespaces' private addresses are ever addressed.

The test process is not on the hosts' switch: it reaches the server through commands run on
a host (`on`), or through a port on its own loopback relayed to the server's host
(`reached`), where a thread of its own connects from inside that host's namespace."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import prefect_home, scaled

from tasks.distribute import netlab

BIN = Path(sys.executable).parent
PORT = 4200  # the server's own host: nothing else listens in a fresh namespace
# run on the server's host, where the test process cannot reach: tfscale's own health wait
HEALTHY = (
    "import sys; from tasks.core.network import wait_healthy\n"
    "sys.exit(wait_healthy(sys.argv[1], float(sys.argv[2]), interval_s=0.5) is not None)\n"
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
            # a worker asks for flow runs every 3 s (Prefect's default: 10 s): a cell waits
            # at most that long to be taken, and the server answers a third of the polls
            # that 1 s made it answer (~0.04 of a core over a test's ~3 minutes)
            PREFECT_WORKER_QUERY_SECONDS="3",
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

    @contextmanager
    def reached(self) -> Iterator[str]:
        """The server's API URL as this process reaches it, until the block ends: a port on
        this process's loopback whose connections a thread in host 0 carries to the server."""
        with relayed(self.hosts.name(0), (self.hosts.address(0), PORT)) as port:
            yield f"http://127.0.0.1:{port}/api"

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


CLONE_NEWNET = 0x40000000  # setns(2): the network namespace alone


def enter_network(namespace: str) -> None:
    """The calling thread (it alone: setns(2) moves one thread) into the network of the
    namespace `ip netns` named: the sockets it makes from then on are that host's."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/run/netns/{namespace}") as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {namespace}: {os.strerror(errno)}")


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from `source` to `sink` until `source` ends; then `sink` is told no more come."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextmanager
def relayed(namespace: str, address: tuple[str, int]) -> Iterator[int]:
    """A port on this process's loopback (the kernel's pick: no other process can take it
    first) whose each connection is carried to `address` as host `namespace` reaches it,
    until the block ends. The thread that connects enters the namespace; the process and
    its other threads stay where they are."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop, ready, entered, opened = threading.Event(), threading.Event(), [], []

    def carry() -> None:
        try:
            enter_network(namespace)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            entered.append(exc)
            return
        finally:
            ready.set()
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            try:
                upstream = socket.create_connection(address, timeout=scaled(30))
            except OSError:
                client.close()  # refused there, as it would be here
                continue
            upstream.settimeout(None)
            opened.extend((client, upstream))
            for pair in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=pair, daemon=True).start()

    thread = threading.Thread(target=carry, daemon=True, name=f"relay to {namespace}")
    thread.start()
    try:
        assert ready.wait(scaled(30)), f"the relay's thread did not enter {namespace}"
        if entered:
            raise entered[0]
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=scaled(10))
        listener.close()
        for end in opened:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()


def wait_for_text(path: Path, text: str, timeout_s: float, count: int = 1) -> None:
    """Returns once `text` is in the file `count` times; fails with its tail."""
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        if path.exists() and path.read_text(errors="replace").count(text) >= count:
            return
        time.sleep(0.2)
    tail = path.read_text(errors="replace")[-3000:] if path.exists() else "(no file)"
    raise AssertionError(f"{text!r} {count}x not in {path} within {timeout_s:.0f} s:\n{tail}")


@contextmanager
def pool_lab(
    workers: int, tmp: Path, pool: str = "tfscale-test", spare: int = 0
) -> Iterator[PoolLab]:
    """A server on host 0, `workers` workers on hosts 1..workers and `spare` hosts after
    them with no worker yet (`start_worker`), all stopped and the hosts deleted on exit."""
    with netlab.namespace_hosts(workers + spare + 1) as hosts:
        lab = PoolLab(hosts, tmp, pool)
        try:
            lab.start_server()
            for i in range(1, workers + 1):
                lab.start_worker(i)
            yield lab
        finally:
            lab.stop()
