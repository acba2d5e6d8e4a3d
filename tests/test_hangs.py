"""A test blocked inside TensorFlow fails at its limit (`tests/hang_watchdog.py`), where
pytest-timeout's signal alone left it blocked until CI's own limit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import scaled

BLOCKED = """
import tensorflow as tf


def test_dequeue_from_an_empty_queue():
    print("dequeuing")
    tf.queue.FIFOQueue(1, tf.int32).dequeue()
"""


@pytest.mark.integration
def test_a_test_blocked_in_a_tensorflow_op_fails_at_its_limit(tmp_path):
    """A dequeue from an empty queue, under a 3 s limit: the signal cannot land while the
    op blocks, so the watchdog ends the run 10 s later (a hang would meet this test's own
    limit instead), saying which test, its limit, what it printed and where it blocked."""
    (tmp_path / "test_blocked.py").write_text(BLOCKED)
    env = dict(os.environ, PYTHONPATH=str(os.path.dirname(__file__)))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "hang_watchdog"]
        + ["--timeout=3", "test_blocked.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(150),
    )
    said = done.stderr
    assert done.returncode == 1, said[-2000:]
    assert (
        "test_blocked.py::test_dequeue_from_an_empty_queue: still running 13 s into its 3 s "
        "limit, blocked where pytest-timeout's signal cannot reach"
    ) in said, said[-2000:]
    assert "dequeuing" in said  # what the test printed, put back from pytest's capture
    assert 'test_blocked.py", line 7 in test_dequeue_from_an_empty_queue' in said
