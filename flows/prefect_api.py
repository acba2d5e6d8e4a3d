"""A temporary Prefect API server that boots while TensorFlow imports, and the check of a
configured one (`check_prefect_server`: what serve and a pool sweep need).

With no PREFECT_API_URL, a flow's first API call starts Prefect's temporary server and
waits for it: 6-9 s on 2 cores, spent after TensorFlow's own 8 s import. `tfscale run`
and `tfscale sweep` start the same server (Prefect's app under uvicorn, UI off) in its own
process first, import TensorFlow meanwhile, and then point the flow at it:

    with temporary_api() as api:
        from flows.study import scaling_study  # the heavy imports, while the server boots
        api.wait()
        scaling_study(config)

Prefect itself is imported inside the functions that talk to it: the server's process
starts before this one pays Prefect's own import (1-2 s).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from flows.errors import ServerUnavailable
from tasks.core.network import free_ports, wait_healthy


class TemporaryAPI:
    """The server process and its URL; `wait()` blocks until it answers."""

    def __init__(self, process: subprocess.Popen | None, url: str | None, log: Path | None):
        self.process, self.url, self.log = process, url, log

    def wait(self, timeout_s: float = 120.0) -> None:
        """Returns once `<url>/health` answers.

        Raises:
            ServerUnavailable: the server exited or did not answer in time, with its log.
        """
        if self.process is None:
            return

        alive = lambda: self.process.poll() is None  # noqa: E731
        problem = wait_healthy(f"{self.url}/health", timeout_s, interval_s=0.1, alive=alive)
        if problem is None:
            return
        code = self.process.poll()
        state = f"exited with code {code}" if code is not None else problem
        tail = self.log.read_text()[-2000:] if self.log and self.log.exists() else ""
        raise ServerUnavailable(
            f"Prefect's temporary API server at {self.url} did not start ({state}).\n{tail}",
            "start one with 'prefect server start' and set PREFECT_API_URL to it "
            "(http://127.0.0.1:4200/api), then run again.",
        )


def _start_server(port: int, log) -> subprocess.Popen:
    """Prefect's own temporary-server command (prefect.server.api.server)."""

    prefect_dir = Path(importlib.util.find_spec("prefect").origin).parent
    env = dict(
        os.environ,
        PREFECT_UI_ENABLED="0",
        PREFECT__SERVER_EPHEMERAL="1",
        PREFECT__SERVER_FINAL="1",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        str(prefect_dir.parent),
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "error",
        "--lifespan",
        "on",
    ]
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def _drain_workers() -> None:
    """Sends the logs and events still queued while the server is up (as Prefect's own
    test harness does); otherwise they retry against a stopped server at exit for a minute."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)


COMPLETED_LINES = ("Finished in state Completed", "Finished in state Cached(type=COMPLETED)")


class _CompletedLines(logging.Filter):
    """Drops Prefect's `Finished in state Completed()` (or `Cached(type=COMPLETED)`, a
    reused result) after every task and flow run: in a run's log they come between the
    stage and epoch lines, a line each, and say nothing the run's page and the stage lines
    (`(reused)`) do not. A failed or cancelled state is logged as ever."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(COMPLETED_LINES)


def quiet_run_logs() -> None:
    """A run's log without the completed-state lines (`_CompletedLines`), once a process."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _CompletedLines) for f in logger.filters):
            logger.addFilter(_CompletedLines())


def named_by(name: Callable[[dict], str]) -> Callable[[], str]:
    """A flow's `flow_run_name`: `name` of the run's parameters, read as it starts."""

    def run_name() -> str:
        from prefect.runtime import flow_run

        return name(flow_run.parameters)

    return run_name


def api_url() -> str:
    """The Prefect API flows report to (PREFECT_API_URL, or the temporary one)."""
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value() or "")


@contextmanager
def temporary_api() -> Iterator[TemporaryAPI]:
    """Starts the server unless PREFECT_API_URL names one; stops it when the block ends."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        yield TemporaryAPI(None, None, None)
        return
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/api"
    with tempfile.NamedTemporaryFile("w+b", prefix="tfscale-prefect-", suffix=".log") as log:
        process = _start_server(port, log)
        try:
            with temporary_settings(updates={PREFECT_API_URL: url}):
                yield TemporaryAPI(process, url, Path(log.name))
        finally:
            _drain_workers()
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


SERVE_UNSET = (
    "tfscale serve needs a running Prefect server: schedules never fire on the temporary "
    "server Prefect starts when PREFECT_API_URL is unset"
)
SERVER_FIX = (
    "start one with 'prefect server start' (SQLite by default) and run "
    "'export PREFECT_API_URL=http://127.0.0.1:4200/api'"
)


def check_prefect_server(unset: str = SERVE_UNSET, fix: str = SERVER_FIX) -> str:
    """The configured server's API URL, once it answers its health check (through
    Prefect's own client, which retries a busy server's 429 and 503 answers).

    Raises:
        ServerUnavailable: PREFECT_API_URL is unset (`unset` says what needs it) or the
            server does not answer; both with `fix`.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise ServerUnavailable(unset, f"{fix}.")
    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        raise ServerUnavailable(f"Prefect server {url} is unreachable ({problem})", f"{fix}.")
    return url
