"""The typed tracking boundary: result fields logged by their type into a real SQLite
store that the test hands the tracker (nothing patched, no environment changed)."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
from helpers import ROOT, scaled

from tfscale.tasks.core.fields import PARAM, fields_by_type
from tfscale.tasks.core.files import write_json_atomic
from tfscale.tasks.core.process import Stopped
from tfscale.tasks.core.progress import EpochWatcher
from tfscale.tasks.track.tracking import STORE_LOCK, EpochLog, Tracker, rounded
from tfscale.tasks.train.result import TrainResult


@dataclasses.dataclass(frozen=True)
class Probe:
    """A result with one field of each kind, as a new result type would have."""

    batch: int = dataclasses.field(default=64, metadata=PARAM)
    rate: float = 1234.5
    steps: int = 7
    bottleneck: str = "compute-bound"
    resumed: bool = False
    history: list = dataclasses.field(default_factory=lambda: [{"epoch": 1}])
    missing: float | None = None


def test_fields_are_sorted_by_type_and_marked_params():
    metrics, params, tags = fields_by_type(Probe(), prefix="probe_")
    assert metrics == {"probe_rate": 1234.5, "probe_steps": 7.0}
    assert params == {"probe_batch": "64"}
    assert tags == {"probe_bottleneck": "compute-bound", "probe_resumed": "False"}


def test_a_field_added_to_a_training_result_is_logged_without_touching_tracking():
    Extended = dataclasses.make_dataclass(
        "Extended",
        [("peak_memory_mb", float, dataclasses.field(default=512.0))],
        bases=(TrainResult,),
        frozen=True,
    )
    result = Extended(
        "runs/x", "runs/x/model.keras", "mirrored", "why", 2, 1, "float32", 32, 64, 1, 0.002, 10
    )
    metrics, params, tags = fields_by_type(result)
    assert metrics["peak_memory_mb"] == 512.0
    assert params["replicas"] == "2" and params["strategy"] == "mirrored"
    assert "history" not in metrics and tags["run_dir"] == "runs/x"


def test_a_tracker_logs_a_result_into_the_store_it_was_given(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    environment = dict(os.environ)
    tracker = Tracker(tmp_path / "store", experiment="probe")
    parent = tracker.start_run("parent", {"kind": "test"})
    child = tracker.start_run("child", {}, parent_id=parent)
    tracker.log_result(child, Probe())
    tracker.log_history(child, [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.25}])
    tracker.finish(child)
    tracker.finish(parent)
    assert dict(os.environ) == environment
    assert (tmp_path / "store" / "mlflow.db").exists()

    from mlflow import MlflowClient

    run = MlflowClient(tracker.uri).get_run(child)
    assert run.data.metrics["rate"] == 1234.0 and run.data.params["batch"] == "64"  # rounded
    assert run.data.tags["bottleneck"] == "compute-bound"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.info.run_name == "child"  # a child is named by its role under the parent
    top = MlflowClient(tracker.uri).get_run(parent).info
    assert top.run_name == f"{parent[:6]}-parent"  # a top-level run begins with its id's start
    history = MlflowClient(tracker.uri).get_metric_history(child, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.25)]


def test_figures_are_rounded_to_four_significant_digits():
    assert rounded(1.3180673662313493) == 1.318
    assert rounded(0.0028123) == 0.002812
    assert rounded(62059.4) == 62060.0


def test_system_metrics_are_logged_rounded(tmp_path):
    tracker = Tracker(tmp_path / "store", experiment="probe")
    run = tracker.start_run("run", {}, system_metrics=True)
    deadline = time.monotonic() + scaled(30)
    while not tracker.client.get_run(run).data.metrics and time.monotonic() < deadline:
        time.sleep(0.5)
    tracker.finish(run)
    metrics = tracker.client.get_run(run).data.metrics
    assert any(name.startswith("system/") for name in metrics), metrics
    assert all(value == rounded(value) for value in metrics.values()), metrics


def test_a_failed_study_leaves_no_run_running(tmp_path):
    tracker = Tracker(tmp_path / "store", experiment="probe")
    parent = tracker.start_run("parent", {})
    live = EpochLog(tracker, tracker.start_run("baseline", {}, parent_id=parent))
    live({"epoch": 1, "loss": 0.5, "accuracy": 0.8})
    tracker.fail(parent, "RuntimeError('worker 1 died')")

    client = tracker.client
    assert client.get_run(parent).info.status == "FAILED"
    assert client.get_run(parent).data.tags["error"] == "RuntimeError('worker 1 died')"
    assert client.get_run(live.run_id).info.status == "FAILED"
    assert client.get_run(live.run_id).data.metrics == {"loss": 0.5, "accuracy": 0.8}


@pytest.mark.parametrize(
    ("raised", "status"),
    [(Stopped(signal.SIGTERM), "KILLED"), (KeyboardInterrupt(), "KILLED"), (OSError(), "FAILED")],
    ids=["SIGTERM", "Ctrl-C", "an error"],
)
def test_a_run_a_signal_stops_ends_killed_and_one_that_fails_failed(raised, status, tmp_path):
    """A command's run and the study it nests under end KILLED when a signal or Ctrl-C
    stops the work (MLflow's status for a run stopped from outside), FAILED on an error."""
    tracker = Tracker(tmp_path / "store", experiment="probe")
    study = tracker.start_run("study", {})
    with pytest.raises(type(raised)), tracker.run("train", {}, nested_under=study) as run:
        raise raised
    assert tracker.client.get_run(run).info.status == status
    assert tracker.client.get_run(study).info.status == status


def test_epochs_reach_the_callback_while_the_training_writes_them(tmp_path):
    """The watcher follows history.json as the training process rewrites it."""
    seen: list[tuple[int, float]] = []
    path = tmp_path / "history.json"
    history: list[dict] = []
    with EpochWatcher(tmp_path, 3, "test", lambda e: seen.append((e["epoch"], time.time())), 0.05):
        for epoch in (1, 2, 3):
            history.append(
                {"epoch": epoch, "loss": 1 / epoch, "accuracy": 0.5, "examples_per_s": 9}
            )
            write_json_atomic(path, history)
            wrote = time.time()
            deadline = wrote + 10
            while len(seen) < epoch and time.time() < deadline:
                time.sleep(0.01)
            assert [e for e, _ in seen] == list(range(1, epoch + 1))  # before the next epoch
    assert [e for e, _ in seen] == [1, 2, 3]


def test_a_resumed_run_does_not_report_its_earlier_epochs_again(tmp_path):
    write_json_atomic(
        tmp_path / "history.json",
        [{"epoch": 1, "loss": 1.0, "accuracy": 0.5, "examples_per_s": 9}],
    )
    seen: list[dict] = []
    with EpochWatcher(tmp_path, 2, "test", seen.append, 0.05):
        pass
    assert seen == []


BAR_SCRIPT = """
import json, sys, time
from pathlib import Path
from tfscale.tasks.core.progress import EpochWatcher
run_dir = Path(sys.argv[1])
history = []
with EpochWatcher(run_dir, 3, "baseline", interval_s=0.05):
    for epoch in (1, 2, 3):
        history.append({"epoch": epoch, "loss": 0.5, "accuracy": 0.75, "examples_per_s": 9})
        (run_dir / "history.json").write_text(json.dumps(history))
        time.sleep(0.3)
"""


@pytest.mark.integration
def test_a_terminal_shows_a_progress_bar_per_training(tmp_path):
    """On a real pseudo-terminal, as a user's shell runs it."""
    import fcntl
    import pty
    import select
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-c", BAR_SCRIPT, str(tmp_path)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    os.close(slave)
    out = b""
    while select.select([master], [], [], 30)[0]:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=scaled(30)) == 0
    text = out.decode(errors="replace")
    assert "baseline" in text and "0/3" in text and "3/3" in text
    assert "acc 0.7500" in text


def test_the_quiet_console_drops_only_the_expected_warnings():
    """TensorFlow's retracing warning (the diagnosis builds a runner per configuration on
    purpose) stays off the console; any other warning reaches it."""
    import logging

    from tfscale.tasks.core.process import _quiet_console

    def record(level: int, message: str, name: str = "tensorflow") -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, message, None, None)

    retraced = "5 out of the last 14 calls to <function f> triggered tf.function retracing."
    assert not _quiet_console(record(logging.WARNING, retraced))
    assert _quiet_console(record(logging.WARNING, "a real problem"))
    assert not _quiet_console(record(logging.INFO, "a library notice"))
    assert _quiet_console(record(logging.INFO, "a stage line", name="tfscale.tasks.core.progress"))


@pytest.mark.parametrize("signal_name", ["an interrupt signal", "a termination signal"])
def test_prefects_crash_lines_for_a_stop_stay_off_the_console(signal_name):
    """Ctrl-C or SIGTERM during `run` or `sweep`: Prefect's "Crash detected!" and Crashed
    state lines stay off the console (the command says the stop once, with what it
    leaves); a crash for any other cause reaches it."""
    import logging

    from tfscale.tasks.core.process import _quiet_console

    def record(message: str, name: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, message, None, None)

    crash = f"Crash detected! Execution was aborted by {signal_name}."
    state = f"Finished in state Crashed('Execution was aborted by {signal_name}.')"
    assert not _quiet_console(record(crash, "prefect.flow_runs"))
    assert not _quiet_console(record(state, "prefect.task_runs"))
    other = "Crash detected! Execution was interrupted by an unexpected exception: OSError"
    assert _quiet_console(record(other, "prefect.flow_runs"))


def test_the_console_says_a_user_error_once_not_in_prefects_reports_of_it():
    """A user error raised in a task or flow: Prefect's error lines reporting it (with the
    exception, and the failed state's line after them with its text) stay off the console,
    since the command says it once, with its fix; Prefect's errors about anything else (a
    crash, its server) reach the console, and tfscale's own error lines do."""
    import io
    import logging
    import sys

    from tfscale.tasks.core.errors import MissingInput
    from tfscale.tasks.core.process import ConsoleFormat, _quiet_console

    def raised(exc: BaseException) -> tuple:
        try:
            raise exc
        except BaseException:
            return sys.exc_info()

    def record(name: str, message: str, exc: BaseException | None = None) -> logging.LogRecord:
        exc_info = raised(exc) if exc else None
        return logging.LogRecord(name, logging.ERROR, __file__, 1, message, None, exc_info)

    error = MissingInput("shards.py: no such file (from --model shards.py:f)", "give the path")
    crash = ZeroDivisionError("division by zero")
    reports = [
        record("prefect.task_runs", f"Task run failed with exception: {error!r}", error),
        record("prefect.task_runs", f"Finished in state Failed('Task run encountered an "
               f"exception MissingInput: {error}')"),
        record("prefect.flow_runs", f"Encountered exception during execution: {error!r}", error),
    ]  # fmt: skip
    others = [
        record("prefect.task_runs", f"Task run failed with exception: {crash!r}", crash),
        record("prefect.flow_runs", "Finished in state Failed('Flow run encountered an exception "
               "ZeroDivisionError: division by zero')"),
        record("prefect.server", "database is locked"),
        record("tfscale.tasks.train.training", f"{error.message}: not in this task's records",
               error),
    ]  # fmt: skip
    handler = logging.StreamHandler(stream := io.StringIO())
    handler.setFormatter(ConsoleFormat())
    handler.addFilter(_quiet_console)
    for each in reports + others:
        handler.handle(each)
    shown = stream.getvalue().splitlines()
    assert [line.split(":")[0] for line in shown] == [
        "ERROR prefect.task_runs",
        "ERROR prefect.flow_runs",
        "ERROR prefect.server",
        "ERROR tfscale.tasks.train.training",
    ], shown
    assert not any("shards.py" in line for line in shown[:3]), shown


def test_links_point_where_the_ui_is(tmp_path):
    """The configured UI address (`track.ui_url`, where `tfscale ui` serves), or the
    tracking server itself; never a port the UI is not on."""
    from tfscale.tasks.settings.config import load_config

    (tmp_path / "params.yaml").write_text("track:\n  ui_url: http://10.0.0.7:5123\n")
    track = load_config(tmp_path / "params.yaml").track
    assert track.ui_url == "http://10.0.0.7:5123"
    local = Tracker(tmp_path, uri=f"sqlite:///{tmp_path}/mlflow.db", ui_url=track.ui_url)
    assert local.ui_base == "http://10.0.0.7:5123"
    assert Tracker(tmp_path, uri=f"sqlite:///{tmp_path}/m.db").ui_base == "http://127.0.0.1:5000"
    server = Tracker(tmp_path, uri="http://mlflow.internal:8080", ui_url=track.ui_url)
    assert server.ui_base == "http://mlflow.internal:8080"


@pytest.mark.integration  # trains, times rounds or starts a process
def test_links_follow_a_serving_ui_to_its_port_and_never_a_stopped_ones(tmp_path):
    """A `tfscale ui` serving the store records its address (`serving_ui`): links point
    there, whatever the port, while its process lives; a record a killed UI left behind is
    not trusted, and links fall back to track.ui_url."""
    import json
    import subprocess
    import sys

    from tfscale.tasks.track.tracking import UI_RECORD

    tracker = Tracker(tmp_path, uri=f"sqlite:///{tmp_path}/mlflow.db")
    assert tracker.ui_base == "http://127.0.0.1:5000"
    record = tmp_path / UI_RECORD
    record.write_text(json.dumps({"url": "http://127.0.0.1:5077", "pid": os.getpid()}))
    assert tracker.ui_base == "http://127.0.0.1:5077"
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    record.write_text(json.dumps({"url": "http://127.0.0.1:5077", "pid": int(gone.stdout)}))
    assert tracker.ui_base == "http://127.0.0.1:5000"
    record.write_text("{")  # half-written
    assert tracker.ui_base == "http://127.0.0.1:5000"


@pytest.mark.unit
def test_a_fresh_embedded_store_is_made_by_one_command_at_a_time(tmp_path, monkeypatch):
    """Two commands starting at once on a fresh store each ran MLflow's migrations and one
    failed: the store is made, migrated and given its experiment under a lock file beside
    it, which a second holder (another process's open of the file, as here another
    thread's) waits for, and which is free again once the client is made."""
    import fcntl
    import threading

    tracker = Tracker(tmp_path / "mlflow")
    lock = tmp_path / "mlflow" / STORE_LOCK

    def held() -> bool:
        with open(lock, "a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(other, fcntl.LOCK_UN)
            return False

    seen = []
    monkeypatch.setattr(Tracker, "_made_client", lambda self: seen.append(held()) or "client")
    assert tracker.client == "client" and seen == [True] and not held()

    order = []
    with tracker._store_lock():
        waiting = threading.Thread(target=lambda: order.append(Tracker(tmp_path / "mlflow").client))
        waiting.start()
        waiting.join(timeout=1.0)
        assert waiting.is_alive() and order == []  # waits while another holds the store
        order.append("first")
    waiting.join(timeout=scaled(30))
    assert order == ["first", "client"]


@pytest.mark.unit
def test_a_new_store_is_a_copy_of_an_empty_one_as_mlflow_makes_it(tmp_path, monkeypatch):
    """A new embedded store is the cached empty store's copy (MLflow makes that once per
    version): its tables, schema version and Default experiment are those of a store
    MLflow makes from the same directory, and a second new store runs no migration."""
    import sqlite3

    from mlflow import MlflowClient
    from tfscale.tasks.track import new_store

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)

    def contents(db):
        """Tables (each one's columns and constraints: MLflow's migrations write a table's
        constraints in no fixed order), schema version and Default experiment."""
        with sqlite3.connect(db) as store:
            tables = [
                (name, sorted(line.strip().rstrip(",").strip() for line in (sql or "").split("\n")))
                for name, sql in store.execute("SELECT name, sql FROM sqlite_master ORDER BY name")
            ]
            version = store.execute("SELECT * FROM alembic_version").fetchall()
            (default,) = store.execute(
                "SELECT name, artifact_location, lifecycle_stage, workspace FROM experiments"
                " WHERE experiment_id = 0"
            ).fetchall()
        return tables, version, default

    MlflowClient(f"sqlite:///{tmp_path / 'by-mlflow.db'}").search_experiments()
    made = []
    made_by_mlflow = new_store._made_by_mlflow
    monkeypatch.setattr(new_store, "_made_by_mlflow", lambda p: made.append(p) or made_by_mlflow(p))
    tracker = Tracker(tmp_path / "mlflow")
    assert tracker.client.get_experiment_by_name("tfscale") is not None and len(made) == 1
    assert contents(tmp_path / "mlflow" / "mlflow.db") == contents(tmp_path / "by-mlflow.db")
    assert str(tmp_path / "mlruns" / "0") == contents(tmp_path / "by-mlflow.db")[2][1]
    other = Tracker(tmp_path / "other")
    run = other.client.create_run(other.client.get_experiment_by_name("tfscale").experiment_id)
    other.client.log_metric(run.info.run_id, "speedup", 1.5)
    assert len(made) == 1 and other.client.get_run(run.info.run_id).data.metrics == {"speedup": 1.5}
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == sorted(
        ["mlflow.db", STORE_LOCK]
    )
