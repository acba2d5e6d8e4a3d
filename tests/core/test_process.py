"""Process-wide state that `tasks/core/process.py` sets for a block and puts back."""

from __future__ import annotations

import gc

import pytest

from tfscale.tasks.core.process import collector_paused


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_for_an_import_then_freezes_it_and_is_as_found(enabled):
    """Inside the block the cyclic collector does not run; after it, what the block made
    is frozen (the collector's passes skip it) and the collector is on or off as it was
    found, whether the block ends or raises."""
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        before = gc.get_freeze_count()
        with collector_paused():
            assert not gc.isenabled()
            made = [[] for _ in range(1000)]
        assert gc.isenabled() is enabled
        assert gc.get_freeze_count() >= before + len(made)
        with pytest.raises(ValueError), collector_paused():
            raise ValueError("an import that fails")
        assert gc.isenabled() is enabled
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()


def test_only_a_first_import_of_tensorflow_pauses_the_collector_and_freezes(monkeypatch):
    """Where TensorFlow is imported already (a notebook's second study, a sweep's next cell)
    the block leaves the collector alone: a freeze then would keep the garbage of the work
    done so far for good."""
    import sys

    import tensorflow  # noqa: F401

    from tfscale.tasks.core.process import startup_imports

    was, before = gc.isenabled(), gc.get_freeze_count()
    gc.enable()
    try:
        with startup_imports():
            assert gc.isenabled()
        assert gc.get_freeze_count() == before
        monkeypatch.delitem(sys.modules, "tensorflow")  # as in a process just started
        with startup_imports():
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()


class _Termination(BaseException):
    """What a Prefect flow run's SIGTERM handler raises (its `TerminationSignal`)."""


def _swallowed_sigterm() -> None:
    """SIGTERM to this process, its exception caught by code that catches everything (a
    user's callback, a library's clean-up), as seen once in CI: the run trained on."""
    import os
    import signal
    import time

    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs here, in the main thread
    except BaseException:  # noqa: BLE001 - the swallowing under test
        pass


def test_a_stop_whose_exception_was_swallowed_still_ends_the_noted_block():
    """Over another handler (Prefect's in a flow run), a SIGTERM is noted before that
    handler raises: `raise_if_stopped` and the block's end raise `Stopped` with the shell's
    143, though the handler's own exception never arrived; the handler is put back after,
    and work after the block does not meet the stop (in CI a later test's training did)."""
    import signal

    from tfscale.tasks.core.process import Stopped, raise_if_stopped, stops_noted

    raised = []

    def prefects(signum, frame):
        raised.append(signum)
        raise _Termination

    before = signal.signal(signal.SIGTERM, prefects)
    try:
        with pytest.raises(Stopped) as stopped, stops_noted():
            _swallowed_sigterm()
            assert raised == [signal.SIGTERM]  # the handler in place ran, and raised
            with pytest.raises(Stopped):
                raise_if_stopped()
        assert stopped.value.exit_code == 143
        assert signal.getsignal(signal.SIGTERM) is prefects
        raise_if_stopped()  # the stop was the block's: later work never meets it
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_stop_swallowed_inside_stopped_by_signals_is_raised_at_the_next_check():
    import signal

    from tfscale.tasks.core.process import Stopped, raise_if_stopped, stopped_by_signals

    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with stopped_by_signals() as request:
            _swallowed_sigterm()
            assert request.signum == signal.SIGTERM
            with pytest.raises(Stopped):
                raise_if_stopped()
    finally:
        signal.signal(signal.SIGTERM, before)
