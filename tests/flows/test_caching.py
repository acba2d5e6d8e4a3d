"""Cached results know the code that made them: in a clone of the repository, `tfscale run`
reuses its baseline while nothing changed, and trains it afresh once a model module changed
(`flows/caching.py`, `tasks/core/provenance.py`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import (
    INNER_LIMIT_S,
    LEAST_WORK,
    ROOT,
    clone_as_it_is,
    scaled,
    stage_lines,
    tiny_params,
)

pytestmark = pytest.mark.integration


def tfscale_run(clone: Path, params: Path) -> str:
    """`tfscale run` with the clone's own code (its directory first on the path)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tfscale.flows.cli", "--params", str(params), "run"],
        cwd=clone,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(clone), TF_CPP_MIN_LOG_LEVEL="2"),
        timeout=scaled(INNER_LIMIT_S),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def baseline_line(output: str) -> str:
    """The baseline's stage line (`baseline    2,590 examples/s, 1 replica, ...`), whole."""
    (line,) = [line for line in stage_lines(output, "baseline") if re.match(r"[\d,]+ ex", line)]
    return line


def hidden_widths(model_path: Path) -> list[int]:
    """The units of the model's hidden Dense layers, read from the saved file's config."""
    with zipfile.ZipFile(model_path) as archive:
        config = json.loads(archive.read("config.json"))
    layers = config["config"]["layers"]
    return [
        layer["config"]["units"]
        for layer in layers
        if layer["class_name"] == "Dense" and layer["config"]["name"] != "logits"
    ]


def git_status(clone: Path) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
        timeout=scaled(60),
    ).stdout


def test_a_changed_model_module_trains_the_baseline_afresh(tmp_path):
    """Also: the outputs of `tfscale run` where it puts them by default (data/, runs/,
    mlflow/ in the working directory) are ignored by git: a run leaves git status clean.

    The three runs report to one temporary Prefect API (PREFECT_API_URL, as a user's own
    server), not one each: a reused result is read from the cache beside the runs
    (`flows.caching.cache_dir`), never from the server, so which server saw the first run
    cannot decide the reuse. The speedup's measurement is one short round and no step
    records the gradient noise scale: reuse is decided before either, and nothing here reads
    them."""
    from tfscale.flows.prefect_api import temporary_api

    clone = tmp_path / "clone"
    clone_as_it_is(clone)  # the caching code as it is here, committed or not
    where = {"prepare.data_dir": "data/tfrecords", "train.runs_dir": "runs"}
    params = tiny_params(
        tmp_path, **{"train.epochs": 1, "track.store_dir": "mlflow", **where, **LEAST_WORK}
    )
    runs = clone / "runs" / "digits"
    models = clone / "tasks" / "train" / "models.py"
    source = models.read_text()
    assert "for width in (256, 128):" in source

    with temporary_api() as api:
        api.wait(scaled(180))
        first = baseline_line(tfscale_run(clone, params))
        again = baseline_line(tfscale_run(clone, params))
        assert "(reused)" not in first and "(reused)" in again
        assert (clone / "mlflow" / "mlflow.db").exists() and list(runs.glob("*/metrics.json"))
        assert git_status(clone) == ""  # every output is ignored

        models.write_text(source.replace("for width in (256, 128):", "for width in (64, 32):"))
        changed = baseline_line(tfscale_run(clone, params))
        assert "(reused)" not in changed

    baselines = sorted(runs.glob("one_device-*/model.keras"), key=lambda p: p.stat().st_mtime)
    assert len(baselines) == 2  # the old code's run directory is kept, not resumed
    assert hidden_widths(baselines[0]) == [256, 128]
    assert hidden_widths(baselines[-1]) == [64, 32]
    distributed = sorted(runs.glob("mirrored-*/model.keras"), key=lambda p: p.stat().st_mtime)
    assert hidden_widths(distributed[-1]) == [64, 32]  # both sides of the speedup agree


def test_a_second_uv_run_pays_nothing_the_install_paid_once(tmp_path):
    """`uv run tfscale --help` twice in a fresh clone, as the README's commands start: the
    first installs the locked set (from uv's cache), the second syncs nothing and compiles
    no bytecode (Python caches what it imports; with uv's `compile-bytecode` every `uv run`
    recompiled 19,404 files, 1.2-4.7 s)."""
    import shutil

    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is not on PATH: install it as the README says (python3 -m pip install uv)"
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=scaled(120))
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    outputs = []
    for _ in range(2):
        proc = subprocess.run(
            [uv, "run", "--locked", "tfscale", "--help"],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(INNER_LIMIT_S),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(proc)
    assert "Installed" in outputs[0].stderr, outputs[0].stderr  # the clone's own install
    assert "usage: tfscale" in outputs[1].stdout
    assert "Bytecode" not in outputs[1].stderr, outputs[1].stderr
    assert "Installed" not in outputs[1].stderr, outputs[1].stderr
