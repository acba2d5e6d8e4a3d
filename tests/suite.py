"""The whole suite, as the README's test command and `.ci/run` run it, in two phases:

1. every test not marked `serial`, spread over `TFSCALE_TEST_WORKERS` pytest-xdist
   workers (default 2): in-process tests, CLI processes, flows, servers, `dvc repro`;
2. the `serial` tests (clusters of worker processes, Slurm, anything that measures
   speed), one at a time on a machine nothing else uses.

First it measures the machine's pace (`tests/pace.py`: a fixed workload against the
reference machine's time) and scales every timeout by it: the per-test timeout, the
faulthandler's, and each wait and subprocess limit in the tests (`TFSCALE_TEST_PACE`, which
a caller may set to skip the measurement). A timeout detects a hang, never a slow machine.

Arguments are passed to both phases (`python tests/suite.py -k cache`). The exit code is
the first phase's failure, else the second's; a phase that selects nothing (exit 5) is
fine when the other ran tests, and the suite fails with 5 when neither did.

`pytest -m unit` stays the fast tier to run while working; plain `pytest` runs everything
in one serial process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pace

NO_TESTS = 5
TIMEOUT_S, FAULTHANDLER_S = 300, 280  # pyproject.toml's, on the reference machine
PARALLEL = ["--dist", "loadfile", "--no-loadscope-reorder"]


def timeouts(factor: float) -> list[str]:
    """pytest's per-test timeout and faulthandler's, scaled by the machine's pace."""
    return [
        f"--timeout={round(TIMEOUT_S * factor)}",
        "-o",
        f"faulthandler_timeout={round(FAULTHANDLER_S * factor)}",
    ]


def phases(args: list[str], factor: float = 1.0) -> list[tuple[str, list[str]]]:
    workers = os.environ.get("TFSCALE_TEST_WORKERS", "2")
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


def main(args: list[str]) -> int:
    try:
        factor = measure_pace()
    except ValueError as exc:
        print(f"== error: {exc}", file=sys.stderr, flush=True)
        return 2
    codes = []
    for name, options in phases(args, factor):
        started = time.monotonic()
        print(f"== tests, {name} phase: pytest {' '.join(options)}", flush=True)
        code = subprocess.call([sys.executable, "-m", "pytest", *options])
        minutes = (time.monotonic() - started) / 60
        print(f"== tests, {name} phase: exit {code} after {minutes:.1f} min", flush=True)
        codes.append(code)
    return outcome(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
