"""The suite's own runner (`tests/suite.py`): what the README tells a new user to type is
what CI runs, it runs both phases, and a phase that finds no tests does not hide the
other's failure or pass an empty run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.unit


def test_ci_runs_the_readmes_test_command():
    """`.ci/run` runs the README's command, says how long it all took, and exits with its
    code."""
    readme = (ROOT / "README.md").read_text()
    command = readme.split("# 2. Run the tests\n", 1)[1].splitlines()[0]
    run = command.split(" && ")[-1]
    assert run == "python3 -m uv run --locked python tests/suite.py"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert f"{run} || code=$?" in ci and ci[-1] == 'exit "$code"'
    assert ci[-2].startswith('echo "== CI: exit $code after')


def test_the_suite_runs_a_parallel_phase_then_a_serial_one(monkeypatch):
    """Its parallel phase on 3 workers (`TFSCALE_TEST_WORKERS` unset), the fast tier's 2
    where it is unset too."""
    import pace
    import suite

    monkeypatch.delenv(pace.WORKERS_VARIABLE, raising=False)
    (first, parallel), (second, serial) = suite.phases(["-k", "dvc"])
    assert (first, second) == ("parallel", "serial")
    assert parallel[:2] == ["-m", "not serial"]
    assert parallel[parallel.index("-n") + 1] == "3" and pace.workers() == 2
    monkeypatch.setenv(pace.WORKERS_VARIABLE, "4")
    (_, four), _ = suite.phases([])
    assert four[four.index("-n") + 1] == "4"
    assert serial[:2] == ["-m", "serial"] and "no:xdist" in serial
    assert parallel[-2:] == serial[-2:] == ["-k", "dvc"]  # the caller's arguments, to both


@pytest.mark.parametrize(
    ("codes", "exit_code"),
    [
        ([0, 0], 0),
        ([0, 5], 0),  # the filter left the serial phase nothing: fine, the other ran
        ([5, 0], 0),
        ([5, 5], 5),  # nothing ran at all: pytest's own "no tests" code
        ([1, 0], 1),
        ([0, 1], 1),
        ([5, 1], 1),
        ([2, 1], 2),  # the first failure's code
    ],
)
def test_the_suites_exit_code_is_its_first_failure(codes, exit_code):
    import suite

    assert suite.outcome(codes) == exit_code


def test_timeouts_scale_with_the_pace_measured_never_below_the_reference():
    import pace
    import suite

    (_, parallel), (_, serial) = suite.phases([], factor=2.5)
    for options in (parallel, serial):
        assert "--timeout=750" in options and "faulthandler_timeout=700" in options
    reference = pace.reference()["seconds"]
    assert pace.factor(reference * 2.5) == pytest.approx(2.5)
    assert pace.factor(reference / 2) == 1.0  # a faster machine keeps the timeouts


def test_the_pace_is_clamped_at_3x_loudly_and_a_factor_below_1_refused(monkeypatch, capsys):
    """A machine 10x slower (or loaded while measured) gets 3x and a loud line, not 3,000 s
    a test; TFSCALE_TEST_PACE=0 (every wait zero), 0.5 or a word is refused by the suite
    with exit code 2 before any phase, and by the tests' helpers when they load."""
    import pace
    import suite

    reference = pace.reference()
    assert pace.factor(reference["seconds"] * 10) == pace.CLAMP == 3.0
    assert "ABOVE x3" in pace.describe(reference["seconds"] * 10)
    assert "ABOVE" not in pace.describe(reference["seconds"] * 2.9)
    assert {"tensorflow", "date", "measured_as"} <= set(reference), reference
    monkeypatch.setenv(pace.VARIABLE, "12")
    assert suite.measure_pace() == 3.0 and "ABOVE x3" in capsys.readouterr().out
    for refused in ("0", "0.5", "-1", "fast", "nan"):
        monkeypatch.setenv(pace.VARIABLE, refused)
        with pytest.raises(ValueError, match=f"{pace.VARIABLE}={refused} refused"):
            pace.current()
        monkeypatch.setattr(suite.subprocess, "call", lambda *a, **k: pytest.fail("a phase ran"))
        monkeypatch.setattr(suite, "bytecode_written", lambda *a: pytest.fail("set up first"))
        assert suite.main([]) == 2
        assert "a factor below 1" in capsys.readouterr().err


def inner_limits_above(limit: float, texts: dict[str, str]) -> list[str]:
    """Each `scaled(N)` of a number above `limit` in `texts` (a file's name: its text), as
    `name:line: scaled(N)`, and each default of a `timeout...` parameter above it (a
    helper's `wait(timeout_s=300)` scaled inside), as `name:line: timeout_s=N`: a wait or
    subprocess limit the per-test limit ends first, so its own message (which command,
    how long) never shows."""
    import re

    found = []
    default = r"\b(timeout\w*)\s*(?::\s*\w+)?\s*=\s*(\d+(?:\.\d+)?)"
    for name, text in texts.items():
        for number, line in enumerate(text.splitlines(), 1):
            for value in re.findall(r"scaled\((\d+(?:\.\d+)?)\)", line):
                if float(value) > limit:
                    found.append(f"{name}:{number}: scaled({value})")
            if line.lstrip().startswith("def "):
                for parameter, value in re.findall(default, line):
                    if float(value) > limit:
                        found.append(f"{name}:{number}: {parameter}={value}")
    return found


def test_the_reference_is_the_median_of_single_samples_with_what_it_ran_on(tmp_path, monkeypatch):
    """`python tests/pace.py --record` keeps the median of 5 single samples (a run measures
    one), each sample, and the TensorFlow and Keras it ran with, dated."""
    import datetime
    import importlib.metadata
    import json

    import pace

    samples = iter([15.0, 11.0, 13.0, 19.0, 12.0])
    monkeypatch.setattr(pace, "measure", lambda: next(samples))
    monkeypatch.setattr(pace, "REFERENCE", tmp_path / "pace.json")
    assert pace.record() == 13.0  # not the best (11), not the mean (14)
    kept = json.loads((tmp_path / "pace.json").read_text())
    assert (kept["seconds"], kept["samples"]) == (13.0, [15.0, 11.0, 13.0, 19.0, 12.0])
    assert kept["tensorflow"] == importlib.metadata.version("tensorflow")
    assert kept["keras"] == importlib.metadata.version("keras")
    assert kept["date"] == datetime.date.today().isoformat()
    assert kept["measured_as"].startswith("median of 5 runs, one sample each")


def test_no_inner_limit_outlasts_the_per_test_limit():
    """Every wait and subprocess limit in the tests is `helpers.INNER_LIMIT_S` or less,
    below faulthandler's and pytest-timeout's (tests/suite.py)."""
    import helpers
    import suite

    assert helpers.INNER_LIMIT_S < suite.FAULTHANDLER_S < suite.TIMEOUT_S
    tests = Path(__file__).parent
    texts = {str(p.relative_to(tests)): p.read_text() for p in sorted(tests.rglob("*.py"))}
    del texts[Path(__file__).name]  # this file's own examples
    assert inner_limits_above(helpers.INNER_LIMIT_S, texts) == []
    planted = {"a.py": "x = 1\nproc.wait(timeout=scaled(600))\nscaled(270)\n"}
    assert inner_limits_above(helpers.INNER_LIMIT_S, planted) == ["a.py:2: scaled(600)"]
    defaults = "def wait(self, job: str, timeout_s: float = 300) -> str:\ndef f(timeout=270):\n"
    found = inner_limits_above(helpers.INNER_LIMIT_S, {"b.py": defaults})
    assert found == ["b.py:1: timeout_s=300"]


def test_ci_is_read_as_a_boolean(monkeypatch):
    from helpers import needs, on_ci

    for value, ci in (("true", True), ("1", True), ("false", False), ("0", False), ("", False)):
        monkeypatch.setenv("CI", value)
        assert on_ci() is ci, value
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        needs("no namespaces here", "network namespaces")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI needs network namespaces"):
        needs("no namespaces here", "network namespaces")


def test_the_suite_prints_each_phase_against_its_share_and_the_slowest_tests(tmp_path):
    """A phase's time is set against its share of the 15-minute bound; the ten slowest
    tests of both phases' JUnit reports are listed, slowest first, with their share."""
    import suite

    assert sum(suite.SHARES_MIN.values()) < suite.BOUND_MIN  # room left for the install
    within = suite.phase_line("serial", 0, 4.0, 1.9)
    assert "after 4.0 min, within its 4.5-min share of the 15-min bound (pace x1.90)" in within
    assert "2.0x its 4.5-min share" in suite.phase_line("serial", 1, 9.0, 1.0)
    assert suite.phase_line("parallel", 0, 9.0, 1.0, suite.Busy(0.874, 1117.4)).endswith(
        "(pace x1.00; the CPUs 87% busy, 1,117 CPU-s)"
    )
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 10 40 800 50 5 5 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    before = suite.cpu_ticks(stat)
    assert before == (160, 1010)  # idle (800) and iowait (50) are not busy
    stat.write_text("cpu  400 10 90 900 60 5 5 0 0 0\n")
    assert suite.busy_between(before, suite.cpu_ticks(stat), hertz=100) == (350 / 460, 3.5)
    assert suite.cpu_ticks(tmp_path / "none") is None and suite.busy_between(None, before) is None
    cases = "".join(
        f'<testcase classname="tests.flows.test_pool" name="test_{i}" time="{i * 10}.5"/>'
        for i in range(12)
    )
    report = tmp_path / "parallel.xml"
    report.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    tests = suite.durations(report)
    assert len(tests) == 12 and (110.5, "tests/flows/test_pool.py::test_11") in tests
    assert suite.durations(tmp_path / "none.xml") == []  # a phase that wrote none
    lines = suite.slowest_lines(tests)
    assert lines[0].startswith("== the 10 slowest tests") and len(lines) == 11
    assert lines[1].split() == ["110.5", "s", "12.3%", "tests/flows/test_pool.py::test_11"]
    assert lines[-1].endswith("test_2")  # test_0 and test_1, the fastest, left out


def test_the_suite_lists_the_tests_that_took_the_most_cpu(tmp_path):
    """Each test's `cpu_s` property (tests/conftest.py) read back from a phase's JUnit XML;
    the ten that took the most listed first, each with its share of all the tests' CPU:
    test_11's 22 of the 132 CPU-s of 0 + 2 + ... + 22 is 16.7%."""
    import suite

    cases = "".join(
        f'<testcase classname="tests.flows.test_dvc" name="test_{i}" time="1.0">'
        f'<properties><property name="cpu_s" value="{2 * i}"/></properties></testcase>'
        for i in range(12)
    )
    report = tmp_path / "parallel.xml"
    report.write_text(
        f"<testsuites><testsuite>{cases}<testcase name='x'/></testsuite></testsuites>"
    )
    costs = suite.cpu_costs(report)
    assert len(costs) == 12 and (22.0, "tests/flows/test_dvc.py::test_11") in costs
    assert suite.cpu_costs(tmp_path / "none.xml") == [] and suite.costliest_lines([]) == []
    lines = suite.costliest_lines(costs)
    assert lines[0].endswith("share of the tests' 132 CPU-s):") and len(lines) == 11
    assert lines[1].split() == ["22.0", "CPU-s", "16.7%", "tests/flows/test_dvc.py::test_11"]
    assert lines[-1].endswith("test_2")


def test_each_test_records_the_cpu_it_took(request):
    """The conftest's clock counts this process's CPU (and its waited-for children's, as
    the kernel adds them): 0.3 s spun here adds at least that much."""
    import time

    import conftest

    before, started = conftest.cpu_seconds(), time.process_time()
    while time.process_time() - started < 0.3:
        pass
    assert conftest.cpu_seconds() - before >= 0.3
    assert conftest.CPU_AT_SETUP in request.node.stash  # read again at its teardown


def test_the_suites_processes_write_the_bytecode_they_compile(monkeypatch):
    """Told never to write bytecode (CI's machines), the phases' processes would each
    compile every module they import again: the suite unsets it for them, and says so."""
    import suite

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    line = suite.bytecode_written()
    assert "PYTHONDONTWRITEBYTECODE" not in os.environ and "unset" in line
    assert "unset" not in suite.bytecode_written()  # not set: nothing to say


def test_tensorflow_is_compiled_once_before_the_pace_is_measured(tmp_path, monkeypatch):
    """Where TensorFlow's bytecode is missing, two imports at once write it and the rest
    the phases' processes import, before the pace's two processes would each compile it;
    where it is there, nothing runs."""
    import importlib.util
    from types import SimpleNamespace

    import suite

    origin = tmp_path / "tensorflow" / "__init__.py"
    origin.parent.mkdir()
    origin.write_text("")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(origin=origin))
    ran = []

    class Started:
        def __init__(self, argv, **kwargs):
            ran.append(argv[-1])

        def wait(self):
            return 0

    monkeypatch.setattr(suite.subprocess, "Popen", Started)
    assert suite.tensorflow_compiled().startswith("== bytecode: TensorFlow and Keras, Prefect")
    assert ran[0] == "import tensorflow, keras" and "import prefect" in ran[1]
    compiled = Path(importlib.util.cache_from_source(str(origin)))
    compiled.parent.mkdir()
    compiled.write_bytes(b"")
    assert suite.tensorflow_compiled() == "" and len(ran) == 2


def test_the_fast_tier_takes_both_cores_unless_told_otherwise():
    """`pytest -m unit` runs on two xdist workers (`TFSCALE_TEST_WORKERS` sets how many);
    `-n` as given wins (`-n 0`: one process), and any other selection is left as asked."""
    from conftest import fast_tier_workers

    assert fast_tier_workers("unit", None, {}) == 2
    assert fast_tier_workers(" unit ", None, {"TFSCALE_TEST_WORKERS": "3"}) == 3
    assert fast_tier_workers("unit", 0, {}) is None  # -n 0
    assert fast_tier_workers("unit", 4, {}) is None  # -n 4: xdist takes it as given
    for other in ("", "serial", "not serial", "integration", "unit and not slow"):
        assert fast_tier_workers(other, None, {}) is None, other


def test_a_fast_tier_worker_starts_no_workers_of_its_own(monkeypatch):
    """xdist resets a worker's `-n` to none: read there as not given, each worker of
    `pytest -m unit` would start two more, and those two more (it hung, starting them)."""
    from types import SimpleNamespace

    import pace
    from conftest import pytest_cmdline_main

    monkeypatch.delenv(pace.WORKERS_VARIABLE, raising=False)  # the default: 2

    def config(**extra):
        options = {"markexpr": "unit", "numprocesses": None}
        plugins = SimpleNamespace(hasplugin=lambda name: name == "xdist")
        return SimpleNamespace(
            pluginmanager=plugins,
            getoption=options.get,
            option=SimpleNamespace(numprocesses=None),
            **extra,
        )

    main, worker = config(), config(workerinput={"workerid": "gw0"})
    pytest_cmdline_main(main)
    pytest_cmdline_main(worker)
    assert (main.option.numprocesses, worker.option.numprocesses) == (2, None)


def test_a_test_leaves_the_tracking_uri_and_the_prefect_api_as_it_found_them(monkeypatch):
    """What a flow run sets in the test's worker (its API's URL, MLflow's tracking URI,
    process-wide) is put back when the test ends, set or unset before."""
    from helpers import tracking_and_api_restored

    import mlflow

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////before/mlflow.db")
    before = mlflow.get_tracking_uri()
    with tracking_and_api_restored():
        monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
        mlflow.set_tracking_uri("sqlite:////during/mlflow.db")  # sets the variable too
        assert mlflow.get_tracking_uri() == "sqlite:////during/mlflow.db"
    assert "PREFECT_API_URL" not in os.environ
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:////before/mlflow.db"
    assert mlflow.get_tracking_uri() == before


class _Started:
    """A stand-in for a server's process: what `on_a_free_port` asks of one."""

    def __init__(self):
        self.killed = False

    def poll(self):
        return None if not self.killed else -9

    def kill(self):
        self.killed = True

    def wait(self, timeout=None):
        return -9


def test_a_server_that_lost_its_port_starts_again_on_another_and_any_other_failure_fails():
    """`on_a_free_port`: a port taken between its choice and the server's bind (the server
    says the address is in use) is given up for another, at most 3 times; anything else
    fails at once, naming what the server said."""
    from helpers import on_a_free_port

    tried = []

    def start(port):
        tried.append(port)
        return _Started()

    def lost_once(port, process):
        return "OSError: [Errno 98] Address already in use" if len(tried) == 1 else None

    port, process = on_a_free_port(start, lost_once)
    assert len(tried) == 2 and port == tried[1] and not process.killed
    tried.clear()
    with pytest.raises(AssertionError, match=r"did not start: boom"):
        on_a_free_port(start, lambda port, process: "boom")
    assert len(tried) == 1
    tried.clear()
    with pytest.raises(AssertionError, match="Address already in use"):
        on_a_free_port(start, lambda port, process: "[Errno 98] Address already in use")
    assert len(tried) == 3


def test_a_suite_over_one_and_a_half_times_its_bound_fails_at_the_machines_pace():
    """22.5 minutes at the reference pace, 45 on a machine measured twice as slow: within,
    nothing said; past it, an error naming the bound and the pace."""
    import suite

    assert suite.over_bound(22.5, 1.0) is None and suite.over_bound(45.0, 2.0) is None
    said = suite.over_bound(23.0, 1.0)
    assert said.startswith("== error: the suite took 23.0 min, over 1.5x its 15-min bound")
    assert "(22.5 min at pace x1.00)" in said
    assert suite.over_bound(46.0, 2.0) is not None


def test_the_session_has_a_home_of_its_own_and_sees_what_is_written_under_it(tmp_path):
    """`~` is the session's own folder (another process's files in the developer's home are
    not a test's); a file written under it is named at the session's end, tfscale's cache
    is not."""
    import tempfile

    from conftest import HOME, home_written

    assert Path.home() == HOME and HOME.is_relative_to(tempfile.gettempdir())
    (tmp_path / ".cache" / "tfscale").mkdir(parents=True)
    (tmp_path / ".cache" / "tfscale" / "empty.db").write_text("")
    assert home_written(tmp_path) == []
    (tmp_path / ".config" / "tool").mkdir(parents=True)
    (tmp_path / ".config" / "tool" / "settings").write_text("")
    (tmp_path / "notes.txt").write_text("")
    assert home_written(tmp_path) == [".config/tool/settings", "notes.txt"]
