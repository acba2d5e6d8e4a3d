"""Servers a command owns (Prefect's temporary API, the MLflow UI): started in a session
of their own, ended with the command however it ends, stopped whole.

- `start_owned` starts the server as the leader of a new session, so that its group (the
  server and every process it starts) is stopped as one, and a Ctrl-C in the terminal
  reaches the command, which stops it. The kernel sends it SIGTERM when the thread that
  started it is gone, however it went (SIGKILL too): Linux's PR_SET_PDEATHSIG, set by a
  small launcher (`LAUNCHER`) that then runs the server's own command in its place. No
  Python code of this process runs in the child between fork and exec (a `preexec_fn`
  would, after TensorFlow's and Prefect's threads exist, which Python warns may deadlock).
- `stop_owned` stops the group: SIGTERM, SIGKILL after a grace period, then SIGKILL to
  whatever its leader left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import IO

# argv: this process's pid, then the server's command. PR_SET_PDEATHSIG is 1; where prctl
# is missing (not Linux) the server is simply run. A parent gone before the call (the
# signal would then never come) ends the launcher at once.
LAUNCHER = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def owned_command(command: list[str]) -> list[str]:
    """`command` behind the launcher that makes it die with this process (`LAUNCHER`).
    `-I`: the launcher imports the standard library's `ctypes`, `os`, `signal` and `sys`,
    never a module of the working directory's of those names, and no site packages; the
    server's own command then gets the environment as it is."""
    return [sys.executable, "-I", "-c", LAUNCHER, str(os.getpid()), *command]


def start_owned(
    command: list[str], env: dict[str, str] | None = None, out: IO | int | None = None
) -> subprocess.Popen:
    """Starts `command` (its first item a path to an executable) as a server this process
    owns: its own session, ended with this process; its output to `out` (a file: both
    streams; None: this process's own). Called from the thread that lives as long as the
    server should (the main thread): the kernel's signal follows the thread that started
    the process."""
    err = subprocess.STDOUT if out is not None else None
    return subprocess.Popen(
        owned_command(command), env=env, stdout=out, stderr=err, start_new_session=True
    )


def stop_owned(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Stops `process` and every process it started (its session's group): SIGTERM, then
    SIGKILL after `timeout_s`; what the group's leader left behind (its workers) goes too."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_group(process, sig)
        try:
            process.wait(timeout=timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    _signal_group(process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
