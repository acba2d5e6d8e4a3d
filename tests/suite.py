"""The whole suite, as the README's test command and `.ci/run` run it, in two phases:

1. every test not marked `serial`, spread over `TFSCALE_TEST_WORKERS` pytest-xdist
   workers (default 2): in-process tests, CLI processes, flows, servers, `dvc repro`;
2. the `serial` tests (clusters of worker processes, Slurm, anything that measures
   speed), one at a time on a machine nothing else uses.

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

NO_TESTS = 5
PARALLEL = ["--dist", "loadfile", "--no-loadscope-reorder"]


def phases(args: list[str]) -> list[tuple[str, list[str]]]:
    workers = os.environ.get("TFSCALE_TEST_WORKERS", "2")
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


def main(args: list[str]) -> int:
    codes = []
    for name, options in phases(args):
        started = time.monotonic()
        print(f"== tests, {name} phase: pytest {' '.join(options)}", flush=True)
        code = subprocess.call([sys.executable, "-m", "pytest", *options])
        minutes = (time.monotonic() - started) / 60
        print(f"== tests, {name} phase: exit {code} after {minutes:.1f} min", flush=True)
        codes.append(code)
    return outcome(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
