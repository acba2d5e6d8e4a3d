"""Emulated hosts (`tasks.distribute.netlab`): made and deleted by whoever uses them, and
nothing left running on a host once it is deleted."""

from __future__ import annotations

import subprocess

import psutil
import pytest
from helpers import needs, scaled

from tfscale.tasks.distribute import netlab


@pytest.mark.integration  # a namespace host and a process on it
def test_a_deleted_host_takes_what_still_runs_on_it():
    """A process stranded on a host (its parent gone, as a job step a failed test left
    behind) ends with the host: it would outlive it, detached from every name."""
    needs(netlab.available(), "namespace hosts")
    with netlab.namespace_hosts(1) as hosts:
        stray = "sleep 600 > /dev/null 2>&1 & echo $!"  # its pid; its shell ends
        started = hosts.popen(0, ["sh", "-c", stray], stdout=subprocess.PIPE, text=True)
        out, _ = started.communicate(timeout=scaled(30))
        stranded = psutil.Process(int(out))
        assert stranded.is_running() and stranded.ppid() != started.pid
        name = hosts.name(0)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in listed
    try:
        stranded.wait(timeout=scaled(10))
    except psutil.TimeoutExpired:
        pytest.fail(f"process {stranded.pid} still runs on the deleted host {name}")
