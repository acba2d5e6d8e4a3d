"""Shared fixtures: small, seeded configs whose outputs live under a temporary directory."""

from __future__ import annotations

import pytest

from tasks.config import load_config
from tasks.process import set_up_process

set_up_process()  # the test session is a process entry too

TIERS = ("unit", "integration", "cluster")


def pytest_collection_modifyitems(items):
    """A test marked neither `integration` nor `cluster` is `unit`: the fast tier
    (`pytest -m unit`) is everything that stays in this process."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)


@pytest.fixture
def make_config(tmp_path):
    """Builds a Config from dotted overrides, with data under `tmp_path`."""

    def make(**overrides):
        values = {"prepare.data_dir": str(tmp_path / "tfrecords")}
        values.update({k.replace("__", "."): v for k, v in overrides.items()})
        return load_config(None, values)

    return make


@pytest.fixture(scope="session", autouse=True)
def two_logical_cpus():
    """Mirrored tests need 2 logical CPU devices, configured before TensorFlow starts."""
    from tasks.process import logical_cpus, set_up_devices

    set_up_devices(2)
    return logical_cpus(2)


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """The digits dataset prepared once for the session: (config overrides, manifest, dir)."""
    from tasks.preparation import prepare_dataset

    root = tmp_path_factory.mktemp("digits")
    overrides = {"prepare.data_dir": str(root / "tfrecords"), "train.runs_dir": str(root / "runs")}
    result = prepare_dataset(load_config(None, overrides), progress=False)
    return overrides, result.manifest, result.data_dir
