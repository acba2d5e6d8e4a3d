"""A command owns the servers it starts: `tfscale run` as a user runs it, with what it starts
watched from outside. Its Prefect API is the only server it starts (never Prefect's own
ephemeral one, which a thread or the seeds phase once reached and left running), two runs at
once never collide, a stop by signal takes the server with it, and a server killed
mid-run ends the run in seconds with one clear error."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import BIN, console_row, scaled, stage_lines, tiny_params

pytestmark = pytest.mark.integration

# how long a run takes to end after SIGTERM or its server's death, on the reference machine:
# its own teardown (the watchdog sees the server's exit at once); Prefect's clients alone
# retried a dead server for 60-70 s
ENDS_WITHIN_S = 20


class Run:
    """`tfscale run` in `tmp` (a process of its own: the process is the claim), its output
    read as it comes and every process it starts recorded while it lives."""

    def __init__(self, tmp: Path, *args: str):
        tmp.mkdir(parents=True, exist_ok=True)
        params = tiny_params(tmp, **{"track.store_dir": str(tmp / "mlflow")})
        self.process = subprocess.Popen(
            [str(BIN / "tfscale"), "--params", str(params), "run", *args],
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.started: dict[int, psutil.Process] = {}
        self.commands: dict[int, list[str]] = {}  # read while they live
        self.owners: dict[int, str] = {}  # a server's: tfscale's own, or Prefect's ephemeral
        self.alive: dict[int, tuple[float, float]] = {}  # a server's first and last sight
        self.parents: dict[int, int] = {}  # each process's parent, read while it lives
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def _watch(self) -> None:
        me = psutil.Process(self.process.pid)
        while not self._done.is_set() and self.process.poll() is None:
            try:
                children = me.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for child in children:
                try:  # read again while it lives: just forked, it shows no command yet
                    command = child.cmdline()
                except psutil.NoSuchProcess:
                    continue
                self.started.setdefault(child.pid, child)
                self.parents.setdefault(child.pid, child.ppid())
                if command or child.pid not in self.commands:
                    self.commands[child.pid] = command
                if "uvicorn" in command and child.pid not in self.owners:
                    self.owners[child.pid] = _owner(child)
                if "uvicorn" in command:
                    now = time.monotonic()
                    self.alive[child.pid] = (self.alive.get(child.pid, (now,))[0], now)
            time.sleep(0.05)

    def servers(self) -> list[psutil.Process]:
        """The API servers it started (uvicorn serving Prefect's app), in start order: not
        a process a server forked (it carries the server's command line too)."""
        pids = {pid for pid, cmd in self.commands.items() if "uvicorn" in cmd}
        own = pids - self.forked(pids)
        return [self.started[pid] for pid in self.commands if pid in own]

    def forked(self, pids: set[int]) -> set[int]:
        """Those of `pids` whose parent is one of them."""
        return {pid for pid in pids if self.parents.get(pid) in pids}

    def wait_for_line(self, start: str, timeout_s: float = 180) -> str:
        deadline = time.monotonic() + scaled(timeout_s)
        while time.monotonic() < deadline:
            found = [line for line in self.lines if line.startswith(start)]
            if found:
                return found[0]
            assert self.process.poll() is None, "".join(self.lines)[-3000:]
            time.sleep(0.05)
        raise AssertionError(f"no {start!r} line within {timeout_s:.0f} s: {self.lines[-5:]}")

    def wait(self, timeout_s: float = 240) -> int:
        code = self.process.wait(timeout=scaled(timeout_s))
        self._done.set()
        self._reader.join(timeout=scaled(10))
        return code

    def output(self) -> str:
        return "".join(self.lines)

    def left_running(self) -> list[str]:
        """What it started that still runs (zombies are gone already)."""
        alive = []
        for proc in self.started.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(" ".join(self.commands[proc.pid][:4]))
            except psutil.NoSuchProcess:
                pass
        return alive

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for proc in self.started.values():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


def servers_said(run: Run) -> str:
    """A run's servers (each one's start, owner and command) and its output's end, as one
    text: pytest shows a message of text whole, where it cuts a tuple's repr short."""
    lines = [
        f"pid {pid}: started {time.strftime('%H:%M:%S', time.localtime(proc.create_time()))}, "
        f"{run.owners.get(pid)}: {' '.join(run.commands[pid])}"
        for pid, proc in run.started.items()
        if "uvicorn" in run.commands.get(pid, [])
    ]
    return "\n".join([*lines, "output's end:", run.output()[-4000:]])


def _owner(server: psutil.Process) -> str:
    """Whose API server this is: tfscale's (`prefect_api._start_server` sets analytics
    off in its environment) or Prefect's ephemeral one, which a thread without the API's
    URL would start."""
    try:
        ours = server.environ().get("PREFECT_SERVER_ANALYTICS_ENABLED") == "false"
    except psutil.Error:
        return "unknown"
    return "tfscale's" if ours else "Prefect's ephemeral"


def port_of(run: Run) -> str:
    """The port of the API server that served the run: its last one."""
    cmdline = [cmd for cmd in run.commands.values() if "uvicorn" in cmd][-1]
    return cmdline[cmdline.index("--port") + 1]


def examples(text: str) -> int:
    return int(text.replace(",", ""))


def mlperf_mean(values: list[int]) -> float:
    """MLPerf Training's score, by hand: the mean without the fastest and the slowest."""
    kept = sorted(values)[1:-1]
    return sum(kept) / len(kept)


# a run whose speed is not what its test checks: plain steps (no noise-scale recording), one
# measuring round of few steps
LEAST_MEASURED = ("--measure-rounds", "1", "--measure-steps", "10", "--noise-scale", "false")


def test_two_runs_at_once_each_own_one_api_and_the_seeds_are_scored_as_mlperf(tmp_path):
    """Two `tfscale run`s at once, one with `--seeds 5` to a target every seed reaches: each
    starts exactly one server, on a port of its own, and none is left when they end (the
    seeds phase once had a thread start Prefect's ephemeral server, which outlived the run
    and lost its logs). The seeds' examples to the target, as their lines print them, give
    the summary's figures by MLPerf's rule (a median, or a mean over all five, would not).
    The other run's rounds aim at +-50%, which the first interval (6 rounds) meets: they
    stop there, well before their cap of 20, and say so. Neither does work its claims do not
    read: the seeds' run trains plain steps (no noise-scale recording) and measures one
    round, the other evaluates nothing while training."""
    seeds = Run(tmp_path / "seeds", "--seeds", "5", "--target-accuracy", "0.85", *LEAST_MEASURED)
    other = Run(
        tmp_path / "other",
        *("--epochs", "1", "--measure-rounds", "20", "--measure-precision", "0.5"),
        *("--evaluate-every", "0"),
    )
    try:
        codes = (seeds.wait(), other.wait())
    finally:
        seeds.kill()
        other.kill()
    assert codes == (0, 0), seeds.output()[-3000:] + other.output()[-3000:]
    lost = [run.output().count("lost its start to another command") for run in (seeds, other)]
    # two servers starting at once on a fresh database: one of them fails its start, once
    assert sum(lost) <= 1, lost
    for run, again in zip((seeds, other), lost, strict=True):
        # one server, or one more for the start lost to the other run, and said so
        assert len(run.servers()) == 1 + again, servers_said(run)
        assert set(run.owners.values()) == {"tfscale's"}, run.owners
        assert run.left_running() == []
        assert "APILogWorker" not in run.output() and "ephemeral" not in run.output()
    assert port_of(seeds) != port_of(other)
    # at once: a server of each was seen alive while one of the other's was
    spans = [[run.alive[p.pid] for p in run.servers()] for run in (seeds, other)]
    both = [(a, b) for a in spans[0] for b in spans[1] if a[0] < b[1] and b[0] < a[1]]
    assert both, spans

    out = seeds.output()
    reached = {}  # side -> examples to the target, the study's own training first
    for side in ("baseline", "distributed"):
        said = " ".join(stage_lines(out, side))
        (first,) = re.findall(r"held-out 0\.85 at ([\d,]+) examples", said)
        again = re.findall(rf"^seed \d+ +{side}: 0\.85 at ([\d,]+) examples", out, re.M)
        assert len(again) == 4, out[-3000:]
        reached[side] = [examples(v) for v in (first, *again)]
    brief = console_row(out, "to target")  # the console's: the figures, then the whole
    summaries = [json.loads(f.read_text()) for f in (tmp_path / "seeds").rglob("summary.json")]
    (line,) = {
        s["to_target"] for s in summaries if s["seeds"] == 5
    }  # the run's, its copy in MLflow
    dist, base = re.search(r"([\d,]+) examples to it against ([\d,]+)", line).groups()
    assert f"{dist} examples to it against {base} (" in brief
    assert "each the mean of 5 seeds by MLPerf's rule" in brief, brief
    assert examples(base) == round(mlperf_mean(reached["baseline"])), (line, reached)
    assert examples(dist) == round(mlperf_mean(reached["distributed"])), (line, reached)
    assert "the mean of 5 seeds each, the fastest and slowest dropped" in line

    # each run's measuring blocks as its measure-steps set them: the flag's 10, the params' 30
    for run, steps in ((seeds, 10), (other, 30)):
        said = " ".join(stage_lines(run.output(), "measuring"))
        assert f"in blocks of up to {steps} steps" in said, said

    measured = console_row(other.output(), "measured over")
    rounds = int(re.search(r"^(\d+) alternating rounds", measured)[1])
    assert 6 <= rounds < 20 and "the most allowed" not in measured, measured
    known = float(re.search(r"until the speedup was known to \+-([\d.]+)%", measured)[1])
    assert known <= 50, measured


def test_a_run_stopped_by_sigterm_takes_its_api_with_it(tmp_path):
    run = Run(tmp_path)
    try:
        run.wait_for_line("strategy")  # its API answers and training is about to start
        (server,) = run.servers()
        stopped = time.monotonic()
        run.process.send_signal(signal.SIGTERM)
        code = run.wait(timeout_s=60)
        seconds = time.monotonic() - stopped
        assert code == 128 + signal.SIGTERM, run.output()[-3000:]
        assert seconds <= scaled(ENDS_WITHIN_S), f"ended {seconds:.1f} s after SIGTERM"
        assert "stopped by signal" in run.output()
        assert run.left_running() == [], f"left after {seconds:.1f} s"
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    finally:
        run.kill()


def test_a_run_whose_api_is_killed_ends_with_one_clear_error(tmp_path):
    """The server SIGKILLed while the run trains: the run ends at once (it kept retrying the
    dead server for minutes, its console filling with connection errors) with an error
    that names the server and what to do, exit 1, and nothing left running.

    The baseline trains 60 epochs (several seconds): at the tiny params' 2 (a fraction of a
    second once traced) it could finish, and print its line, while the watchdog was still
    turning Prefect's retries off, before it interrupted the run."""
    run = Run(tmp_path, "--epochs", "60")
    try:
        run.wait_for_line("strategy")
        (server,) = run.servers()
        server.kill()
        killed, seen = time.monotonic(), len(run.lines)
        code = run.wait(timeout_s=120)  # a hang's limit
        seconds, out = time.monotonic() - killed, run.output()
        assert seconds <= scaled(ENDS_WITHIN_S), f"ended {seconds:.1f} s after: {out[-3000:]}"
        # ended at once, mid-training: not at the next call to the server, after the
        # baseline had trained (a training may call it only at its end, minutes later)
        assert not [line for line in run.lines[seen:] if line.startswith("baseline ")], out
        assert code == 1, out[-3000:]
        errors = [line for line in out.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, out[-4000:]
        assert "Prefect's temporary API server" in errors[0] and "stopped during the run" in out
        assert "fix: run again" in out
        assert run.left_running() == []
    finally:
        run.kill()


SLOW_SERVER = (
    "import http.server, sys, time\n"
    "time.sleep(float(sys.argv[2]))\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'true')\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)


def test_the_api_waits_for_a_slow_start_and_moves_off_a_taken_port(monkeypatch, tmp_path):
    """Prefect's own server started on a port another process holds (a real conflict: the
    port picked, then taken before the server bound) fails its bind, and the API starts
    again on another port; there a server that answers only after seconds is waited for
    (Prefect's own waited 20 s, which a slow, busy machine's start exceeded)."""
    import socket

    from tfscale.flows import prefect_api

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    picks, real_pick = [[taken]], prefect_api.free_ports
    monkeypatch.setattr(prefect_api, "free_ports", lambda n: picks.pop() if picks else real_pick(n))
    starts, real_start = [], prefect_api._start_server

    def start(port, log):
        starts.append(port)
        if len(starts) == 1:  # the real server, on the port the holder took
            return real_start(port, log)
        return subprocess.Popen(
            [sys.executable, "-c", SLOW_SERVER, str(port), "3"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    monkeypatch.setattr(prefect_api, "_start_server", start)
    assert prefect_api.START_TIMEOUT_S >= 120
    try:
        with prefect_api.temporary_api() as api:
            begun = time.monotonic()
            api.wait()
            assert time.monotonic() - begun >= 3  # the slow start, waited for
            assert starts[0] == taken and len(starts) == 2 and starts[1] != taken
            assert api.url == f"http://127.0.0.1:{starts[1]}/api"
            assert os.environ["PREFECT_API_URL"] == api.url  # threads and children see it
            process = api.process
    finally:
        holder.close()
    assert process.poll() is not None
    assert "PREFECT_API_URL" not in os.environ


def test_tfscale_ui_links_where_a_browser_reaches_it_and_a_stop_takes_its_server(tmp_path):
    """`tfscale ui --host 0.0.0.0`: its links name 127.0.0.1 (a browser cannot open
    0.0.0.0), its record of where it serves exists while it serves, and SIGTERM to the
    command (not its group) stops MLflow's server and removes the record."""
    import json

    from helpers import on_a_free_port

    def start(port: int) -> subprocess.Popen:
        return subprocess.Popen(
            [str(BIN / "tfscale"), "ui", "--host", "0.0.0.0", "--port", str(port)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a stray server is found and killed below, not left
        )

    lines: list[str] = []

    def up(port: int, ui: subprocess.Popen) -> str | None:
        lines.clear()
        deadline = time.monotonic() + scaled(180)
        for line in ui.stdout:
            lines.append(line)
            if line.startswith("results: ") or time.monotonic() > deadline:
                break
        return None if lines and lines[-1].startswith("results: ") else "".join(lines)

    port, ui = on_a_free_port(start, up)
    record = tmp_path / "mlflow" / "ui.json"
    started: list[psutil.Process] = []
    try:
        assert lines[-1].startswith(f"results: http://127.0.0.1:{port}/#/"), lines
        assert json.loads(record.read_text())["url"] == f"http://127.0.0.1:{port}"
        started = psutil.Process(ui.pid).children(recursive=True)
        assert started, "no server process"
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=scaled(60)) == 0
        assert not record.exists()
        gone, alive = psutil.wait_procs(started, timeout=scaled(10))
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
        for proc in started:
            if proc.is_running():
                proc.kill()


def test_a_ui_stops_when_a_library_swallows_the_stop(tmp_path):
    """SIGTERM lands in library code that catches every exception (it happened inside
    MLflow's store set-up, the UI then waited on its server for ever): the stop is
    recorded where it was raised, so the UI still stops its server and its record goes."""
    from tfscale.tasks.track.tracking import Tracker
    from tfscale.tasks.track.ui_server import serve_ui

    class Swallowing(Tracker):
        def latest_study(self):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler runs here, and its exception is caught below
            except BaseException:  # noqa: BLE001 (the library's habit, reproduced)
                pass
            return None

    script = tmp_path / "server.py"
    script.write_text(
        "import http.server, sys, threading\n"
        "class Health(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "server = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), Health)\n"
        "threading.Thread(target=server.serve_forever, daemon=True).start()\n"
        "threading.Event().wait(60)\n"
        "sys.exit(7)  # a UI that waited for the server instead of the stop returns this\n"
    )
    from helpers import free_port

    port = free_port()
    command = [sys.executable, str(script), str(port)]
    tracker = Swallowing(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path))
    others = set(psutil.Process().children())
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the block takes only a default
    try:
        assert serve_ui(tracker, command, dict(os.environ), f"http://127.0.0.1:{port}") == 0
    finally:
        signal.signal(signal.SIGTERM, before)
    assert signal.getsignal(signal.SIGTERM) is before
    assert list(tmp_path.glob("ui.json")) == []
    assert set(psutil.Process().children()) <= others, "the server outlived the UI"


def test_a_ui_whose_server_fails_to_start_says_so_and_records_nothing(tmp_path):
    """MLflow's server exits before it answers: one error naming the address and the fix,
    no record of a UI serving the store (links would point at nothing)."""
    from tfscale.tasks.core.errors import UserError
    from tfscale.tasks.track.tracking import Tracker
    from tfscale.tasks.track.ui_server import serve_ui

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path))
    failing = [sys.executable, "-c", "import sys; print('cannot bind'); sys.exit(3)"]
    with pytest.raises(UserError, match="did not start: its process ended"):
        serve_ui(tracker, failing, dict(os.environ), "http://127.0.0.1:9")
    assert list(tmp_path.glob("ui.json")) == []
