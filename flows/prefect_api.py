"""A temporary Prefect API server that boots while TensorFlow imports, and the check of a
configured one (`check_prefect_server`: what serve and a pool sweep need).

With no PREFECT_API_URL, a flow's first API call starts Prefect's temporary server and
waits for it: 6-9 s on 2 cores, spent after TensorFlow's own 8 s import. `tfscale run`
and `tfscale sweep` start the same server (Prefect's app under uvicorn, UI off) in its own
process first, import TensorFlow meanwhile, and then point the flow at it:

    with temporary_api() as api:
        from tfscale.flows.study import scaling_study  # the heavy imports, while the server boots
        api.wait()
        scaling_study(config)

Prefect itself is imported inside the functions that talk to it: the server's process
starts before this one pays Prefect's own import (1-2 s).

Every flow imports this module, which sends tfscale's status lines and epochs to the
current Prefect run's log too (`prefect_run_logger`, installed by
`tasks.core.progress.log_runs_with`): the steps of `tasks/` never import Prefect.
"""

from __future__ import annotations

import _thread
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tfscale.flows.errors import ServerUnavailable
from tfscale.tasks.core.network import free_ports, wait_healthy
from tfscale.tasks.core.process import Stopped, stopped_by_signals
from tfscale.tasks.core.progress import log_runs_with
from tfscale.tasks.core.servers import start_owned, stop_owned

START_TIMEOUT_S = 180.0  # a hang detector: Prefect's server starts in 6-20 s on 2 busy cores
START_TIMEOUT_VARIABLE = "TFSCALE_SERVER_START_TIMEOUT_S"
WITHOUT_SERVER = {"PREFECT_CLIENT_MAX_RETRIES": "0", "PREFECT_LOGGING_TO_API_ENABLED": "false"}
# a port another process took between its pick and the server's bind, or Prefect's database
# locked by another command's server starting at the same moment: started again
START_TRIES = 3
DATABASE_CROWDED = ("database is locked", "Application startup failed")


class TemporaryAPI:
    """The server process and its URL; `wait()` blocks until it answers. While the block
    runs, a watchdog thread ends the run if the server dies (`died`)."""

    def __init__(self, log: Path | None = None):
        self.log = log
        self.process: subprocess.Popen | None = None
        self.url: str | None = None
        self.died: int | None = None  # the exit code of a server that stopped mid-run
        self.closing = threading.Event()
        self.interrupt = signal.SIGINT  # what the watchdog interrupts the main thread with
        self.restore_logging: Callable[[], None] = lambda: None  # once the server died

    def start(self) -> None:
        """The server on a free port, its URL PREFECT_API_URL for the whole process."""
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}/api"
        with open(self.log, "wb") as log:
            self.process = _start_server(port, log)
        _point_prefect_at(self.url)

    def wait(self, timeout_s: float | None = None) -> None:
        """Returns once `<url>/health` answers (within `START_TIMEOUT_S`, or
        `TFSCALE_SERVER_START_TIMEOUT_S` seconds: a slow, busy machine's start); a server
        whose port was taken before it bound starts again on another, and one whose database
        another server held locked starts again.

        Raises:
            ServerUnavailable: the server exited or did not answer in time, with its log.
        """
        if self.process is None:
            return
        if timeout_s is None:
            timeout_s = float(os.environ.get(START_TIMEOUT_VARIABLE, START_TIMEOUT_S))
        for attempt in range(1, START_TRIES + 1):
            alive = lambda: self.process.poll() is None  # noqa: E731
            problem = wait_healthy(f"{self.url}/health", timeout_s, interval_s=0.1, alive=alive)
            if problem is None:
                self._watch()
                return
            if not self.crowded_out() or attempt == START_TRIES:
                break
            taken = self.url
            self.start()
            logging.getLogger(__name__).info(
                "Prefect's temporary API server at %s lost its start to another command "
                "(its port or its database); started again at %s",
                taken,
                self.url,
            )
        code = self.process.poll()
        state = f"exited with code {code}" if code is not None else problem
        raise ServerUnavailable(
            f"Prefect's temporary API server at {self.url} did not start ({state}).\n"
            f"{self.log_tail()}",
            "start one with 'prefect server start' and set PREFECT_API_URL to it "
            "(http://127.0.0.1:4200/api), or give a slow machine longer with "
            f"{START_TIMEOUT_VARIABLE}=SECONDS, then run again.",
        )

    def log_text(self) -> str:
        """This start's whole log (each start writes its log afresh)."""
        if not self.log or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")

    def log_tail(self) -> str:
        return self.log_text()[-2000:]

    def crowded_out(self) -> bool:
        """The server exited at its start because another command took what it needed
        meanwhile: its port, or Prefect's database, which two servers starting at once on
        a fresh one both migrate (seen once in a suite run on a busy machine: one failed
        its start in a migration's query). The whole log is read: a failed bind can be
        followed by a failed shutdown whose traceback is longer than any tail (seen in CI:
        "Reactive triggers not started" pushed the bind's error out of the last 2000
        characters)."""
        if self.process.poll() is None:
            return False
        text = self.log_text()
        return any(m in text for m in ("address already in use", *DATABASE_CROWDED))

    def _watch(self) -> None:
        """A daemon thread that, should the server die before the block ends, records its
        exit code and interrupts the main thread as Ctrl-C would: the block
        then ends with one clear error, where Prefect's clients would retry for minutes."""
        process = self.process

        def follow() -> None:
            code = process.wait()
            if not self.closing.is_set() and process is self.process:
                # Prefect's clients would retry the dead server for a minute (its crash
                # report too) and its log handler print each failure: neither, now; what
                # puts it back is kept before `died` says there is something to put back
                os.environ.update(WITHOUT_SERVER)
                _point_prefect_at(self.url)
                self.restore_logging = _quiet_about_the_server()
                self.died = code
                _thread.interrupt_main(self.interrupt)  # KeyboardInterrupt in the main thread

        threading.Thread(target=follow, daemon=True, name="prefect-api-watchdog").start()

    def died_error(self) -> ServerUnavailable:
        return ServerUnavailable(
            f"Prefect's temporary API server at {self.url} stopped during the run (exit code "
            f"{self.died}), so the run was ended: its flow could no longer report.\n"
            f"{self.log_tail()}",
            "run again (finished work is reused); if something on this machine stops it, "
            "start a server of your own with 'prefect server start' and set PREFECT_API_URL "
            "to it (http://127.0.0.1:4200/api)",
        )

    def stop(self) -> None:
        self.closing.set()
        if self.process is not None:
            try:
                if self.died is None and self.process.poll() is None:
                    _drain_workers()
            finally:  # a second stop while the logs drain still stops the server
                stop_owned(self.process)
        if self.died is not None:  # every process-wide setting the death changed, back
            for name in WITHOUT_SERVER:
                os.environ.pop(name, None)
            self.restore_logging()


# `python -m uvicorn ARGS`, its app's module imported first as tfscale imports TensorFlow,
# the garbage collector paused and what it made frozen after (`collector_paused`): 0.9 of
# the import's 5.5 CPU-s
UVICORN = (
    "import runpy, sys\n"
    "from tfscale.tasks.core.process import collector_paused\n"
    "with collector_paused():\n"
    "    import prefect.server.api.server\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_module('uvicorn', run_name='__main__', alter_sys=True)\n"
)


def _start_server(port: int, log) -> subprocess.Popen:
    """Prefect's own temporary-server command (prefect.server.api.server) under uvicorn
    (`UVICORN`)."""

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
        "-P",  # the working directory not on the path: a project's own `prefect` never loads
        "-c",
        UVICORN,
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
    return start_owned(command, env, log)  # dies with this command, stopped whole


QUIETED = ("prefect._internal.concurrency", "prefect.events.clients", "EventsWorker")


def _quiet_about_the_server() -> Callable[[], None]:
    """Prefect's log and event workers, their server gone, would print each batch they
    cannot send (the log worker's line with no newline, so that the run's own error line
    joined it): the run says once what happened (`TemporaryAPI.died_error`). Returns what
    puts the process's logging back as it was."""
    raised = logging.raiseExceptions
    levels = {name: logging.getLogger(name).level for name in QUIETED}
    logging.raiseExceptions = False  # the log worker prints its failures only while true
    for name in QUIETED:
        logging.getLogger(name).setLevel(logging.CRITICAL)

    def restore() -> None:
        logging.raiseExceptions = raised
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)

    return restore


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
    """Starts the server unless PREFECT_API_URL names one; stops it when the block ends.

    While the block runs, PREFECT_API_URL names it for the whole process (`_point_prefect_at`):
    the flow, threads with no settings context of their own (a training's epoch watcher
    logging to the run; Prefect's log and event workers) and child processes. Prefect's own
    ephemeral server, which a thread with no URL would start and leave running, is never
    reached. A stop (SIGTERM, SIGHUP, Ctrl-C) or an error stops the server and every process
    it started; a server that dies first ends the block with `ServerUnavailable`."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        yield TemporaryAPI()
        return
    before = os.environ.get("PREFECT_API_URL")
    with (
        stopped_by_signals(),
        _interrupt_signal() as interrupt,
        tempfile.TemporaryDirectory(prefix="tfscale-prefect-") as folder,
    ):
        api = TemporaryAPI(Path(folder) / "server.log")
        api.interrupt = interrupt
        try:
            api.start()
            yield api
        except BaseException:  # the watchdog's interrupt, or what Prefect made of it
            if api.died is not None:
                raise api.died_error() from None
            signum = _signal_behind(sys.exc_info()[1])
            if signum is not None:
                raise Stopped(signum) from None
            raise
        finally:
            api.stop()
            _point_prefect_at(before)


def _signal_behind(exc: BaseException | None) -> int | None:
    """The signal that stopped the run, where Prefect's engine raised an error of its own
    while ending a task the signal interrupted: its SIGTERM handler raises
    `TerminationSignal` and sends the signal again only once the flow ends, so a stop that
    lands as a task run is being created ends in "ValueError: Task run is not set" (seen
    in 2 of 6 placements) with the signal only in the error's context."""
    from prefect.exceptions import TerminationSignal

    seen = set()
    while exc is not None and id(exc) not in seen and not isinstance(exc, KeyboardInterrupt):
        if isinstance(exc, TerminationSignal):
            return exc.signal
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextmanager
def _interrupt_signal() -> Iterator[int]:
    """The signal the watchdog interrupts the main thread with (`_thread.interrupt_main`,
    which does nothing for a signal Python does not handle): SIGINT, Ctrl-C's own path,
    where Python handles it; where SIGINT is ignored (a command a shell started in the
    background: `tfscale run &` in a script, a CI runner's job), SIGUSR2, handled for the
    block as Ctrl-C is. Measured: in such a process the killed server's run went on
    training to its end and failed only at its next call to the server."""
    usable = signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.SIG_DFL, None)
    if usable or threading.current_thread() is not threading.main_thread():
        yield signal.SIGINT
        return
    previous = signal.signal(signal.SIGUSR2, signal.default_int_handler)
    try:
        yield signal.SIGUSR2
    finally:
        signal.signal(signal.SIGUSR2, previous)


def _point_prefect_at(url: str | None) -> None:
    """PREFECT_API_URL set to `url` (unset with None) in this process's environment and in
    Prefect's global settings, which every context without settings of its own reads."""
    from prefect.context import refresh_global_settings_context

    if url is None:
        os.environ.pop("PREFECT_API_URL", None)
    else:
        os.environ["PREFECT_API_URL"] = url
    refresh_global_settings_context()


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


def prefect_run_logger() -> Any:
    """The logger of the Prefect flow or task run in progress here, or None (none, or
    Prefect not imported: nothing runs in a flow then)."""
    if "prefect" not in sys.modules:
        return None
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.logging import get_run_logger

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return None
    return get_run_logger()


log_runs_with(prefect_run_logger)
