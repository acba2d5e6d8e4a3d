"""Each use of a library's private internals (`tasks/core/internals.py`) still behaves as on the
versions it was written for: an upgrade that changes one fails here."""

from __future__ import annotations

import atexit
import inspect
import platform
import subprocess
import sys

import pytest
import tensorflow as tf
from helpers import INNER_LIMIT_S, scaled

from tfscale.tasks.core import internals


def test_the_installed_versions_are_those_the_internals_were_written_for():
    """An upgrade must re-check every function of `tasks/core/internals.py`, then bump these."""
    assert tf.__version__ == internals.WRITTEN_FOR["tensorflow"]
    assert platform.python_version().startswith(internals.WRITTEN_FOR["python"] + ".")


def test_device_datasets_are_wrapped_once_and_lose_autotuning():
    from tensorflow.python.data.ops import multi_device_iterator_ops as ops

    internals.device_datasets_without_autotune()
    wrapped = ops._create_device_dataset
    internals.device_datasets_without_autotune()
    assert ops._create_device_dataset is wrapped  # not wrapped twice
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = tf.data.Dataset.range(8).batch(4)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    next(iterator)
    device_iterators = iterator._iterators[0]._iterator._device_iterators
    assert [it._dataset.options().autotune.enabled for it in device_iterators] == [False] * 2


@pytest.mark.integration  # trains, times rounds or starts a process
def test_exit_handlers_run_now_and_once():
    """In a process of its own: running this one's handlers would shut its logging down."""
    script = (
        "import atexit, os\n"
        "from tasks.core.internals import run_exit_handlers\n"
        "atexit.register(print, 'ran', flush=True)\n"
        "run_exit_handlers()\n"
        "run_exit_handlers()\n"
        "os._exit(0)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=scaled(120)
    )
    assert (proc.returncode, proc.stdout) == (0, "ran\n")


def test_input_pipelines_and_cluster_resolver_of_one_process_strategies():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert internals.input_pipelines_of(strategy) == 1
    assert internals.cluster_resolver_of(strategy) is None


def test_the_private_attributes_read_are_still_set_by_their_strategies():
    """MultiWorkerMirrored's extended keeps its worker count, ParameterServerStrategy its
    resolver, under the names `tasks/core/internals.py` reads (one needs a cluster to build, so
    their sources are read)."""
    from tensorflow.python.distribute import (
        collective_all_reduce_strategy,
        parameter_server_strategy_v2,
    )

    assert "self._num_workers = multi_worker_util.worker_count(" in inspect.getsource(
        collective_all_reduce_strategy.CollectiveAllReduceExtended
    )
    assert "self._cluster_resolver = cluster_resolver" in inspect.getsource(
        parameter_server_strategy_v2.ParameterServerStrategyV2
    )
    # the private name `run_exit_handlers` calls (its effect: test_exit_handlers_run_now_and_once)
    assert callable(getattr(atexit, "_run_exitfuncs", None))


def test_the_cluster_barrier_refuses_at_once_where_no_cluster_coordinates():
    """In a MultiWorkerMirrored task it waits for every task (proven by every cluster test
    whose tasks exit 0: `tasks.core.process.wait_for_peers_at_exit`); elsewhere it must not
    wait out its timeout."""
    with pytest.raises(tf.errors.FailedPreconditionError, match="not enabled"):
        internals.wait_for_cluster_tasks("a-barrier", timeout_s=scaled(INNER_LIMIT_S))


def test_only_a_successful_exit_of_a_cluster_task_waits_for_its_peers(monkeypatch):
    from tfscale.tasks.core import process

    waited = []
    monkeypatch.setattr(internals, "wait_for_cluster_tasks", lambda *a: waited.append(a))
    monkeypatch.setitem(process._PEERS_AT_EXIT, "timeout_s", 0.0)
    process._wait_for_peers(0)  # not in a cluster
    process.wait_for_peers_at_exit(12.0)
    process._wait_for_peers(3)  # a failed task
    process._wait_for_peers(42)  # a preempted one
    assert waited == []
    process._wait_for_peers(0)
    assert waited == [(process.EXIT_BARRIER, 12.0)]
