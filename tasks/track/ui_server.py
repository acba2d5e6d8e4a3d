"""The MLflow UI's server process, as `tfscale ui` runs it: its command (MLflow's server on
the project's store, with tfscale's app, `tasks.track.ui`), and its supervision until it
ends or this process is stopped, with the record of where it serves while it does
(`tracking.record_serving_ui`)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfscale.tasks.core.process import StopRequest


def server_command(tracker: Any, host: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The MLflow server's command on the `tracker`'s store at `host`:`port`, and its
    environment."""
    uri = tracker.uri
    command = [
        sys.executable,
        "-P",  # not the working directory first: a project's `signal.py` is not the stdlib's
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--registry-store-uri",  # the same store (MLflow says so at start when not given)
        uri,
        "--default-artifact-root",
        tracker.artifact_root,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--app-name",  # MLflow's app, opening pages on model training (tasks/track/ui.py)
        "tfscale",
    ]
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}  # no job workers
    # MLflow's own use of a deprecated Starlette module warns at every start; not the user's
    quiet = "ignore:starlette.middleware.wsgi is deprecated"
    env["PYTHONWARNINGS"] = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w)
    return command, env


def serve_ui(tracker: Any, command: list[str], env: dict[str, str], base: str) -> int:
    """Runs the MLflow server `command` until it ends or this process is stopped: once it
    answers, records where it serves (`tracking.serving_ui`: the links a run writes while
    it serves point there, whatever the port) and prints its address, the results table and
    the latest study's run. A stop (Ctrl-C, SIGTERM, SIGHUP) stops the server and the record
    goes."""
    from tfscale.tasks.core.process import forget_stops, stopped_by_signals
    from tfscale.tasks.core.servers import start_owned

    with stopped_by_signals() as stop:  # the server dies with this command, stopped whole
        code = _serve_ui(tracker, start_owned(command, env), base, stop)
    forget_stops()  # a stop ends the serving as asked: 0, not the shell's 128+N
    return code


def _serve_ui(tracker: Any, server: Any, base: str, stop: StopRequest) -> int:
    from tfscale.tasks.core.errors import UserError
    from tfscale.tasks.core.network import wait_healthy
    from tfscale.tasks.core.servers import stop_owned
    from tfscale.tasks.track.tracking import forget_serving_ui, record_serving_ui

    try:
        print(f"MLflow UI for {tracker.uri}: starting at {base}", flush=True)
        problem = wait_healthy(f"{base}/health", 180.0, 0.5, lambda: server.poll() is None)
        if problem:
            raise UserError(
                f"the MLflow UI at {base} did not start: {problem}",
                "the server's own lines above say why; or serve on another port with "
                "'tfscale ui --port N'",
            )
        record_serving_ui(tracker.store_dir, base)
        print(f"MLflow UI at {base} (Ctrl-C stops it)", flush=True)
        print(f"results: {tracker.results_url(base)}", flush=True)
        latest = tracker.latest_study()
        if latest:
            print(f"latest run: {tracker.run_url(base, latest)}", flush=True)
        return _until_stopped(server, stop)
    except KeyboardInterrupt:
        return 0
    finally:
        stop_owned(server, 20.0)  # the server and the workers it started
        forget_serving_ui(tracker.store_dir)


def _until_stopped(server: Any, stop: StopRequest) -> int:
    """The server's exit code when it ends, or 0 once a stop was requested: a stop whose
    exception some library swallowed (`StopRequest`) ends the wait as well."""
    while stop.signum is None:
        try:
            return server.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    return 0
