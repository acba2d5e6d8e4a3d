"""Shared fixtures: small, seeded configs whose outputs live under a temporary directory."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from tasks.config import load_config  # noqa: E402


@pytest.fixture
def make_config(tmp_path):
    """Builds a Config from dotted overrides, with data under `tmp_path`."""

    def make(**overrides):
        values = {"prepare.data_dir": str(tmp_path / "tfrecords")}
        values.update({k.replace("__", "."): v for k, v in overrides.items()})
        return load_config(None, values)

    return make
