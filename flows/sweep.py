"""The scaling study as a Prefect flow: one cached training run per grid cell, then the
table and charts, tracked as an MLflow parent run with a child run per cell."""

from __future__ import annotations

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from pathlib import Path  # noqa: E402

from prefect import flow, task  # noqa: E402

from flows.pipeline import (  # noqa: E402
    _key,
    cached,
    check_tracking_task,
    detect_task,
    prepare_task,
)
from tasks import config as config_mod  # noqa: E402
from tasks import probes, runs, strategy, sweep, tracking  # noqa: E402


def cell_cache_key(context, parameters: dict) -> str:
    """Cell config + data manifest hash + hardware fingerprint + the run directory the result
    points at: a repeated cell is reused."""
    config, manifest, report = parameters["config"], parameters["manifest"], parameters["report"]
    choice = strategy.select_strategy(report, config.train)
    return _key(
        "cell",
        config_mod.config_to_dict(config.train),
        manifest.digest,
        report.fingerprint,
        str(runs.run_dir_for(config, manifest, choice).resolve()),
    )


@task(name="plan-cells")
def plan_task(config):
    return sweep.plan_cells(config)


@task(name="set-up-devices")
def devices_task(config, report):
    if config.sweep.strategy == "mirrored" and not report.gpus:
        strategy.ensure_logical_cpus(max(config.sweep.replicas))


@task(name="run-cell", cache_key_fn=cell_cache_key, persist_result=True)
def _cell_task(config, manifest, data_dir: str, report) -> dict:
    choice = strategy.select_strategy(report, config.train)
    result = runs.run_training(config, manifest, data_dir, choice, report)
    diagnosis = probes.diagnose_run(
        config.train,
        manifest,
        data_dir,
        choice,
        report.cpu_flags,
        end_to_end=result.examples_per_s,
        steps=10,
    )
    return dict(result.to_dict(), bottleneck=diagnosis.bottleneck, diagnosis=diagnosis.to_dict())


def cell_task(config, manifest, data_dir: str, report) -> dict:
    """One cell, reusing a cached result only while its run directory is intact."""
    choice = strategy.select_strategy(report, config.train)
    complete = runs.is_complete(config, manifest, choice)
    return cached(_cell_task, config, complete)(config, manifest, data_dir, report)


@task(name="start-tracking", retries=2, retry_delay_seconds=2)
def start_sweep_tracking_task(report, config):
    return tracking.start_parent_run(
        "sweep",
        {
            "kind": "sweep",
            "hardware_fingerprint": report.fingerprint,
            "git_commit": tracking.git_commit(),
            "grid": str(config_mod.config_to_dict(config.sweep)),
        },
    )


@task(name="tabulate")
def tabulate_task(cells, results, config):
    rows = sweep.tabulate(cells, results)
    return rows, sweep.write_outputs(rows, Path(config.sweep.out_dir))


@task(name="track", retries=2, retry_delay_seconds=2)
def track_sweep_task(parent_id, rows, results, files):
    tracking.log_sweep(parent_id, rows, results, files)


@flow(name="tfscale-sweep", log_prints=True)
def sweep_flow(config: config_mod.Config) -> list[dict]:
    """Every cell of the grid in `config.sweep`, reusing cells seen before."""
    check_tracking_task()
    report = detect_task()
    devices_task(config, report)
    cells = plan_task(config)
    parent_id = start_sweep_tracking_task(report, config)
    results = []
    for cell in cells:
        cell_cfg = sweep.cell_config(config, cell)
        prepared = prepare_task(cell_cfg)
        results.append(cell_task(cell_cfg, prepared.manifest, prepared.data_dir, report))
    rows, files = tabulate_task(cells, results, config)
    track_sweep_task(parent_id, rows, results, files)
    return rows
