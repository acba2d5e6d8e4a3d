"""The whole suite, as the README's test command and `.ci/run` run it, in two phases:

1. every test not marked `serial`, spread over `TFSCALE_TEST_WORKERS` pytest-xdist
   workers (default 3, `PARALLEL_WORKERS`, on 2 cores): in-process tests, CLI processes,
   flows, servers, `dvc repro`;
2. the `serial` tests (clusters of worker processes, Slurm, anything that measures
   speed), one at a time on a machine nothing else uses.

First it lets Python write bytecode where the machine told it not to (`bytecode_written`:
each module is compiled once, by the first process that imports it), then it measures the
machine's pace
(`tests/pace.py`: a fixed workload against the reference machine's time) and scales every
timeout by it: the per-test timeout, the faulthandler's, and each wait and subprocess
limit in the tests (`TFSCALE_TEST_PACE`, which a caller may set to skip the measurement).
A timeout detects a hang, never a slow machine.

Arguments are passed to both phases (`python tests/suite.py -k cache`). The exit code is
the first phase's failure, else the second's; a phase that selects nothing (exit 5) is
fine when the other ran tests, and the suite fails with 5 when neither did. Every test
passed, it still fails (exit 3) where it took more than 1.5x its bound at the machine's
pace (`over_bound`).

After each phase it prints the phase's time against its share of the suite's 15-minute
bound (`SHARES_MIN`, on the reference machine; the pace it measured and how busy the CPUs
were beside it), and at the end the ten slowest tests of both phases with their share of
the bound (read back from each phase's JUnit XML, whose times hold a test's setup, call
and teardown), and the ten that took the most CPU (in the parallel phase, whose CPUs are
busy, a test's time is partly its neighbours'; its CPU is its own): a regression shows at
once, and where.

`pytest -m unit` stays the fast tier to run while working; plain `pytest` runs everything
in one serial process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import NamedTuple

import pace

NO_TESTS = 5
TIMEOUT_S, FAULTHANDLER_S = 300, 280  # pyproject.toml's, on the reference machine
PARALLEL = ["--dist", "loadfile", "--no-loadscope-reorder"]
BOUND_MIN = 15  # the whole suite, install included, on 2 cores (docs/benchmarks.md)
# each phase's part of it; the rest is the install and the pace measurement
SHARES_MIN = {"parallel": 9.0, "serial": 4.5}
SLOWEST = 10
REPORTS_VARIABLE = "TFSCALE_TEST_REPORTS"  # a folder to keep the phases' JUnit reports in
# the parallel phase's workers on the reference machine's 2 cores: a third fills what two
# leave idle while their tests wait on servers, schedules and processes starting (two: 13.1
# min at pace x1.00, the CPUs 91% busy; three: 12.3 min at x1.19, 98% busy)
PARALLEL_WORKERS = 3


def timeouts(factor: float) -> list[str]:
    """pytest's per-test timeout and faulthandler's, scaled by the machine's pace."""
    return [
        f"--timeout={round(TIMEOUT_S * factor)}",
        "-o",
        f"faulthandler_timeout={round(FAULTHANDLER_S * factor)}",
    ]


def phases(args: list[str], factor: float = 1.0) -> list[tuple[str, list[str]]]:
    workers = str(pace.workers(default=PARALLEL_WORKERS))
    args = [*timeouts(factor), *args]
    return [
        # whole modules (their fixtures run once), handed out in collection order, which
        # puts the slowest first (conftest), not xdist's order by number of tests
        ("parallel", ["-m", "not serial", "-n", workers, *PARALLEL, *args]),
        ("serial", ["-m", "serial", "-p", "no:xdist", *args]),
    ]


def outcome(codes: list[int]) -> int:
    """The suite's exit code from its phases' codes."""
    if all(code == NO_TESTS for code in codes):
        return NO_TESTS
    return next((code for code in codes if code not in (0, NO_TESTS)), 0)


# the suite's time, at the reference machine's pace, past which it fails though every test
# passed: a regression of that size is a defect, named by the slowest tests printed above it
OVER_BOUND = 1.5
OVER_BOUND_EXIT = 3


def over_bound(minutes: float, factor: float) -> str | None:
    """Where the suite's `minutes` (the install not counted), at the machine's pace
    `factor`, passed `OVER_BOUND` x `BOUND_MIN`: the line that says so; else None. Over
    it, the suite measures the pace again and judges by the slower of the two (a shared
    machine's pace moved from x1.00 to x1.26 between two runs of one hour)."""
    limit = OVER_BOUND * BOUND_MIN * factor
    if minutes <= limit:
        return None
    return (
        f"== error: the suite took {minutes:.1f} min, over {OVER_BOUND}x its {BOUND_MIN}-min "
        f"bound ({limit:.1f} min at pace x{factor:.2f}): the slowest tests above say where"
    )


def measure_pace() -> float:
    """The pace factor: `TFSCALE_TEST_PACE` if set, else measured here, now; at most
    `pace.CLAMP`, said loudly above it.

    Raises:
        ValueError: `TFSCALE_TEST_PACE` below 1, or not a number.
    """
    if os.environ.get(pace.VARIABLE):
        factor = pace.current()
        print(f"== pace: x{factor:.2f} as {pace.VARIABLE} says", flush=True)
        loud = pace.clamped_line(float(os.environ[pace.VARIABLE]))
    else:
        seconds = pace.measure()
        factor = pace.factor(seconds)
        print(f"== {pace.describe(seconds)}", flush=True)
        loud = ""  # in describe's lines already
    if loud:
        print(f"== {loud}", flush=True)
    os.environ[pace.VARIABLE] = f"{factor:.3f}"  # the phases' tests read it (helpers.scaled)
    return factor


def phase_line(
    name: str, code: int, minutes: float, factor: float, busy: Busy | None = None
) -> str:
    """A phase's end: its exit code and time against its share of the bound, and how busy
    the machine's CPUs were meanwhile (`busy_between`): a phase that leaves them idle waits,
    one that keeps them busy computes; the CPU-seconds it took are its work at this
    machine's speed over the whole phase, where the pace is one sample before it (the same
    tests took 1,117 CPU-s in one run and 1,417 in the next, the pace 9.4 and 9.8 s)."""
    share = SHARES_MIN[name]
    verdict = "within" if minutes <= share else f"{minutes / share:.1f}x"
    cpus = "" if busy is None else f"; the CPUs {busy.share:.0%} busy, {busy.seconds:,.0f} CPU-s"
    return (
        f"== tests, {name} phase: exit {code} after {minutes:.1f} min, {verdict} its "
        f"{share:.1f}-min share of the {BOUND_MIN}-min bound (pace x{factor:.2f}{cpus})"
    )


def cpu_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(busy, all) clock ticks of every CPU since boot, from the first line of /proc/stat
    (user, nice, system, idle, iowait, irq, softirq, steal; idle and iowait are not busy);
    None where the file is not there."""
    try:
        ticks = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


class Busy(NamedTuple):
    share: float  # of the CPUs' time
    seconds: float  # CPU-seconds, every CPU's together


def busy_between(
    before: tuple[int, int] | None, after: tuple[int, int] | None, hertz: int | None = None
) -> Busy | None:
    """How busy the CPUs were between two `cpu_ticks` readings: the share of their time,
    and the CPU-seconds (`hertz`: ticks a second, the system's where not given)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    busy = after[0] - before[0]
    hertz = hertz or os.sysconf("SC_CLK_TCK")
    return Busy(busy / (after[1] - before[1]), busy / hertz)


def junit_cases(report: Path) -> list[tuple[ElementTree.Element, str]]:
    """Each test a phase's JUnit XML holds, with its id (`tests/flows/test_dvc.py::name`);
    none when the phase wrote none."""
    if not report.exists():
        return []
    cases = ElementTree.parse(report).iter("testcase")
    return [(c, f"{c.get('classname', '').replace('.', '/')}.py::{c.get('name')}") for c in cases]


def durations(report: Path) -> list[tuple[float, str]]:
    """(seconds, test id) of each test a phase's JUnit XML holds: setup, call and teardown
    (a module's fixtures count in its first test's); none when the phase wrote none."""
    return [(float(case.get("time") or 0), test) for case, test in junit_cases(report)]


def cpu_costs(report: Path) -> list[tuple[float, str]]:
    """(CPU-seconds, test id) of each test a phase's JUnit XML holds: its `cpu_s` property
    (tests/conftest.py: its process's and the processes it waited for, from its setup to
    its teardown); none where the phase wrote no report or the test no such property."""
    return [
        (float(prop.get("value") or 0), test)
        for case, test in junit_cases(report)
        for prop in case.iter("property")
        if prop.get("name") == "cpu_s"
    ]


def costliest_lines(tests: list[tuple[float, str]], count: int = SLOWEST) -> list[str]:
    """The `count` tests that took the most CPU, each with its share of all the tests'."""
    total = sum(cpu for cpu, _ in tests)
    if not total:
        return []
    lines = [
        f"== the {min(count, len(tests))} tests that took the most CPU (with the processes "
        f"they waited for; share of the tests' {total:,.0f} CPU-s):"
    ]
    for cpu, test in sorted(tests, reverse=True)[:count]:
        lines.append(f"   {cpu:6.1f} CPU-s  {cpu / total:5.1%}  {test}")
    return lines


def slowest_lines(tests: list[tuple[float, str]], count: int = SLOWEST) -> list[str]:
    """The `count` slowest tests, each with its share of the bound."""
    lines = [f"== the {min(count, len(tests))} slowest tests (share of the {BOUND_MIN}-min bound):"]
    for seconds, test in sorted(tests, reverse=True)[:count]:
        share = seconds / (BOUND_MIN * 60)
        lines.append(f"   {seconds:6.1f} s  {share:5.1%}  {test}")
    return lines


def bytecode_written() -> str:
    """Bytecode written as the suite's processes import modules: `PYTHONDONTWRITEBYTECODE`
    (set on CI's machines) unset for the phases, which inherit it. A fresh install has no
    bytecode; told never to write it, every process compiled TensorFlow, Prefect and MLflow
    again (28.5 s of CPU to import them against 10.8 s compiled). Compiling every installed
    module first took 52 s before the first test, most of it modules no test imports; now
    the first import of each module compiles it once (Python writes it atomically: the
    processes that import it at once each write a whole file). The line to print."""
    told = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    said = " (PYTHONDONTWRITEBYTECODE unset for it)" if told is not None else ""
    return f"== bytecode: written as the suite's processes first import each module{said}"


# what the suite's processes import, compiled before the pace by two processes at once (one a
# core): TensorFlow and Keras in one; in the other, what the phases' workers and servers
# would otherwise each compile at once as they start (12.8 CPU-s to compile, once)
COMPILED_FIRST = (
    "import tensorflow, keras",
    "import prefect, prefect.server.api.server, mlflow, mlflow.server, sklearn, pandas, "
    "matplotlib.pyplot, dvc.repo",
)


def tensorflow_compiled() -> str:
    """The bytecode of TensorFlow and Keras, and beside them of Prefect, MLflow and DVC
    (`COMPILED_FIRST`), written before the pace is measured (`bytecode_written`) where
    TensorFlow's is not there yet: the pace's two processes would otherwise each compile
    TensorFlow, and a fresh install would read as a slower machine; the parallel phase's
    three workers, and the servers they start, would each compile the rest at once. The
    line to print ('' where there was nothing to write)."""
    import importlib.util

    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        return ""
    if Path(importlib.util.cache_from_source(spec.origin)).exists():
        return ""
    started = time.monotonic()
    imports = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for code in COMPILED_FIRST
    ]
    for process in imports:
        process.wait()
    seconds = time.monotonic() - started
    beside = "Prefect, MLflow and DVC beside them"
    return f"== bytecode: TensorFlow and Keras, {beside}, compiled first ({seconds:.0f} s)"


def main(args: list[str]) -> int:
    try:
        pace.current()  # a factor refused before anything is done
        print(bytecode_written(), flush=True)
        for line in filter(None, [tensorflow_compiled()]):
            print(line, flush=True)
        factor = measure_pace()
    except ValueError as exc:
        print(f"== error: {exc}", file=sys.stderr, flush=True)
        return 2
    codes, tests, costs, began = [], [], [], time.monotonic()
    # the phases' JUnit reports: kept in `TFSCALE_TEST_REPORTS` where it names a folder
    folder = tempfile.TemporaryDirectory(prefix="tfscale-suite-")
    reports = Path(os.environ.get(REPORTS_VARIABLE) or folder.name)
    reports.mkdir(parents=True, exist_ok=True)
    for name, options in phases(args, factor):
        report = reports / f"{name}.xml"
        started, ticks = time.monotonic(), cpu_ticks()
        print(f"== tests, {name} phase: pytest {' '.join(options)}", flush=True)
        code = subprocess.call([sys.executable, "-m", "pytest", *options, f"--junitxml={report}"])
        minutes = (time.monotonic() - started) / 60
        busy = busy_between(ticks, cpu_ticks())
        print(phase_line(name, code, minutes, factor, busy), flush=True)
        codes.append(code)
        tests += durations(report)
        costs += cpu_costs(report)
    folder.cleanup()
    print("\n".join(slowest_lines(tests) + costliest_lines(costs)), flush=True)
    over = over_bound((time.monotonic() - began) / 60, factor)
    if over and outcome(codes) == 0:  # the machine may have slowed since: its pace again
        again = pace.factor(pace.measure())
        print(f"== pace again, at the end: x{again:.2f}", flush=True)
        over = over_bound((time.monotonic() - began) / 60, max(factor, again))
    if over and outcome(codes) == 0:
        print(over, file=sys.stderr, flush=True)
        return OVER_BOUND_EXIT
    return outcome(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
