"""The scaling sweep on a tiny grid: a child run per cell, table and charts holding every
cell, and repeated cells reused instead of re-run."""

from __future__ import annotations

import csv
import dataclasses
import shutil

import pytest

from tasks.config import load_config
from tasks.sweep import Cell, plan_cells, tabulate


def test_plan_always_includes_one_replica():
    config = load_config(
        None, {"sweep.replicas": [2, 4], "sweep.dataset_sizes": [100], "sweep.batch_sizes": [8, 16]}
    )
    cells = plan_cells(config)
    assert len(cells) == 2 * 3
    assert {c.replicas for c in cells} == {1, 2, 4}


def test_speedup_divides_by_the_groups_one_replica_cell():
    cells = [
        Cell(100, 8, "weak", "float32", 1),
        Cell(100, 8, "weak", "float32", 2),
        Cell(200, 8, "weak", "float32", 1),
        Cell(200, 8, "weak", "float32", 2),
    ]
    results = [
        {"examples_per_s": v, "strategy": "s", "bottleneck": "b", "run_dir": "d"}
        for v in (100.0, 150.0, 200.0, 400.0)
    ]
    rows = tabulate(cells, results)
    assert [r["speedup"] for r in rows] == [1.0, 1.5, 1.0, 2.0]
    assert [r["scaling_efficiency"] for r in rows] == [1.0, 0.75, 1.0, 1.0]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    from flows.sweep import sweep_flow

    tmp = tmp_path_factory.mktemp("sweep")
    config = load_config(
        None,
        {
            "prepare.data_dir": str(tmp / "data"),
            "train.runs_dir": str(tmp / "runs"),
            "sweep.replicas": [1, 2],
            "sweep.dataset_sizes": [256, 512],
            "sweep.model": "mlp",
            "sweep.epochs": 2,
            "sweep.precision": ["float32"],
            "sweep.out_dir": str(tmp / "out"),
            "track.store_dir": str(tmp / "mlflow"),
        },
    )
    first = sweep_flow(config)
    stamps = {p: p.stat().st_mtime_ns for p in (tmp / "runs").rglob("metrics.json")}
    second = sweep_flow(config)
    reused = stamps == {p: p.stat().st_mtime_ns for p in (tmp / "runs").rglob("metrics.json")}
    # a cell whose run directory is gone is trained again; the others are still reused
    gone = sorted(stamps)[0]
    shutil.rmtree(gone.parent)
    sweep_flow(config)
    after_delete = {p: p.stat().st_mtime_ns for p in (tmp / "runs").rglob("metrics.json")}
    # another checkout (its own runs directory) never reuses this one's cells
    other = dataclasses.replace(
        config, train=dataclasses.replace(config.train, runs_dir=str(tmp / "other" / "runs"))
    )
    sweep_flow(other)
    return {
        "tmp": tmp,
        "rows": (first, second),
        "reused": reused,
        "deleted": gone,
        "stamps": stamps,
        "after_delete": after_delete,
    }


def test_every_cell_has_a_child_run_with_metrics(swept):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{swept['tmp']}/mlflow/mlflow.db")
    experiment = client.get_experiment_by_name("tfscale")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    assert len(parents) == 4
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(children) == 4
    for child in children:
        assert {"examples_per_s", "speedup", "scaling_efficiency", "loss"} <= set(
            child.data.metrics
        )
        assert child.data.tags["bottleneck"]
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"sweep.csv", "sweep.json", "speedup.png", "efficiency.png"} <= artifacts


def test_table_and_charts_hold_every_cell(swept):
    out = swept["tmp"] / "out"
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert sorted((int(r["size"]), int(r["replicas"])) for r in rows) == [
        (256, 1),
        (256, 2),
        (512, 1),
        (512, 2),
    ]
    assert all(float(r["speedup"]) == 1.0 for r in rows if r["replicas"] == "1")
    # each group forecast from its 2-replica cell's own measurements, drawn over the points
    assert all(0 < float(r["forecast_speedup"]) <= int(r["replicas"]) for r in rows)
    assert (out / "speedup.png").stat().st_size > 5000
    assert (out / "efficiency.png").stat().st_size > 5000


def test_repeated_cells_are_reused(swept):
    first, second = swept["rows"]
    assert swept["reused"]
    assert [r["examples_per_s"] for r in first] == [r["examples_per_s"] for r in second]


def test_a_cell_whose_run_directory_is_gone_is_trained_again(swept):
    after = swept["after_delete"]
    assert swept["deleted"] in after  # made again
    untouched = {p: t for p, t in swept["stamps"].items() if p != swept["deleted"]}
    assert {p: after[p] for p in untouched} == untouched  # the others reused


def test_cached_results_live_in_the_project_and_do_not_cross_checkouts(swept):
    tmp = swept["tmp"]
    assert list((tmp / "runs" / ".prefect-results").iterdir())
    other = list((tmp / "other" / "runs").rglob("metrics.json"))
    assert len(other) == 4  # every cell trained afresh for the other checkout
