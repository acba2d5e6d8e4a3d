"""A server a command owns dies with the command, however the command ends, and is stopped
whole (`tasks/core/servers.py`): real processes, no TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from helpers import scaled

from tfscale.tasks.core.servers import LAUNCHER, start_owned, stop_owned

pytestmark = pytest.mark.integration

# a "server" that starts a worker of its own and sleeps; prints both pids
SERVER = (
    "import subprocess, sys, time\n"
    "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(f'{__import__(\"os\").getpid()} {worker.pid}', flush=True)\n"
    "time.sleep(600)\n"
)
# a command that owns such a server, prints the server's and worker's pids, and waits
OWNER = (
    "import sys, time\n"
    "from tfscale.tasks.core.servers import start_owned\n"
    "import subprocess\n"
    "server = start_owned([sys.executable, '-P', '-c', sys.argv[1]], out=subprocess.PIPE)\n"
    "print(server.stdout.readline().decode().strip(), flush=True)\n"
    "time.sleep(600)\n"
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int]) -> list[int]:
    """The pids still alive after waiting for them to end (a hang detector's wait)."""
    deadline = time.monotonic() + scaled(30)
    while time.monotonic() < deadline and not all(map(gone, pids)):
        time.sleep(0.05)
    return [pid for pid in pids if not gone(pid)]


def test_a_server_dies_with_the_command_that_owns_it_even_when_the_command_is_killed(tmp_path):
    """Also in a project with a module named as the launcher's (`signal.py`): the launcher
    imports the standard library's, never the working directory's."""
    (tmp_path / "signal.py").write_text("raise ImportError('the project's own signal.py')\n")
    owner = subprocess.Popen(
        [sys.executable, "-P", "-c", OWNER, SERVER], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        server, worker = map(int, owner.stdout.readline().split())
        assert psutil.Process(server).ppid() == owner.pid
        assert os.getsid(server) == server != os.getsid(owner.pid)  # a session of its own
        owner.kill()  # SIGKILL: no handler, no finally runs
        owner.wait(timeout=scaled(30))
        assert wait_gone([server]) == []  # the kernel's SIGTERM
    finally:
        owner.kill()
    psutil.Process(worker).kill()  # the server's own worker is its business, not the kernel's


def test_stopping_an_owned_server_stops_every_process_it_started():
    server = start_owned([sys.executable, "-c", SERVER], out=subprocess.PIPE)
    pids = list(map(int, server.stdout.readline().split()))
    assert pids[0] == server.pid  # the launcher ran the command in its own place
    stop_owned(server, timeout_s=scaled(10))
    assert server.poll() is not None and wait_gone(pids) == []


def test_the_launcher_runs_nothing_when_its_parent_is_already_gone():
    """The parent it was told of is not its parent: the death signal would never come."""
    proc = subprocess.run(
        [sys.executable, "-S", "-c", LAUNCHER, "1", sys.executable, "-c", "print('ran')"],
        capture_output=True,
        text=True,
        timeout=scaled(30),
    )
    assert proc.returncode == 1 and "ran" not in proc.stdout
