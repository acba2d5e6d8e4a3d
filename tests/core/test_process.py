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
