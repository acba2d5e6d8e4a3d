"""A test blocked where pytest-timeout cannot reach fails at its limit, not at CI's.

pytest-timeout's `signal` method raises in the main thread when its limit passes, which
Python does only between bytecodes: a test blocked inside a TensorFlow op (a dequeue from
an empty queue, a collective waiting on a dead peer) never returns to the interpreter, and
was still blocked 75 s past a 10 s limit. TensorFlow releases the GIL while its ops run, so
a watchdog thread still runs: `grace_s(limit)` after a test's limit, it prints what is
blocked and every thread's stack, and ends the process (exit 1; under xdist the worker,
which pytest-xdist reports as that test's failure and replaces). The signal goes first: a
test blocked in Python fails as before, with its own traceback, and the watchdog is
cancelled with it.

Loaded by tests/conftest.py; alone as `pytest -p hang_watchdog` (its own test does).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from collections.abc import Iterator

import pytest


def grace_s(limit: float) -> float:
    """How long after its limit a test still running is taken as blocked outside Python:
    long enough for pytest-timeout's signal to land and the test's teardown to run."""
    return max(10.0, 0.1 * limit)


def limit_of(item: pytest.Item) -> float:
    """The test's pytest-timeout limit: its `timeout` mark's, else the run's; 0 for none."""
    mark = item.get_closest_marker("timeout")
    if mark is not None and mark.args:
        return float(mark.args[0])
    value = item.config.getoption("timeout", None) or item.config.getini("timeout")
    return float(value or 0)


def blocked(item: pytest.Item, limit: float) -> None:
    """What the watchdog does at the end of a test's grace: puts pytest's capture of the
    standard streams back on the terminal (with what the test wrote), says what is
    blocked, dumps every thread's stack, and ends the process."""
    capture = item.config.pluginmanager.getplugin("capturemanager")
    written = ("", "")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
        written = capture.read_global_capture()
    waited = limit + grace_s(limit)
    sys.stdout.flush()
    sys.__stderr__.write(
        f"{written[0]}{written[1]}\n{item.nodeid}: still running {waited:.0f} s into its "
        f"{limit:.0f} s limit, blocked where pytest-timeout's signal cannot reach (inside "
        "TensorFlow or another library's C code); every thread's stack follows, then this "
        "process ends\n"
    )
    sys.__stderr__.flush()
    faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
    os._exit(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    limit = limit_of(item)
    if limit <= 0:
        yield
        return
    watchdog = threading.Timer(limit + grace_s(limit), blocked, (item, limit))
    watchdog.daemon = True
    watchdog.name = "tfscale-hang-watchdog"
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
