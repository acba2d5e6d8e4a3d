"""The scaling study as a Prefect flow: one cached training run per grid cell, then the
table and charts, tracked as an MLflow parent run with a child run per cell."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from tfscale.flows import pool
from tfscale.flows.caching import RESULTS, cached, reused
from tfscale.flows.prefect_api import named_by, quiet_run_logs
from tfscale.flows.study import check_tracking_task, detect_task, fail_tracking_task, prepare_task
from tfscale.tasks.core import process
from tfscale.tasks.core.network import host_name
from tfscale.tasks.core.progress import status
from tfscale.tasks.distribute import strategy
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.execute import sweep_cells
from tfscale.tasks.report import scaling_grid
from tfscale.tasks.settings import config as config_mod
from tfscale.tasks.track import records, tracking


@task(name="plan the grid")
def plan_task(config):
    return sweep_cells.plan_cells(config)


@task(name="set up devices")
def devices_task(config, report):
    process.set_up_devices(sweep_cells.cell_devices(config, report))


@task(name="train a cell", cache_policy=RESULTS, persist_result=True)
def _cell_task(run: Run) -> dict:
    return sweep_cells.train_cell(run, host_name())


def cell_task(config, manifest, data_dir: str, report) -> dict:
    """One cell, reusing a cached result only while its run directory is intact."""
    run = Run(config, manifest, data_dir, strategy.select_strategy(report, config.train), report)
    state = cached(_cell_task, config, files_present=run.is_complete)(run, return_state=True)
    result = state.result()
    if reused(state):
        status(
            "cell",
            f"{run.run_dir.name} reused: trained before with the same settings, data "
            "and code, its run directory intact",
        )
    return result


@task(name="train the cells on a work pool")
def pool_task(config, cells, prepared) -> list[dict]:
    """Each cell a flow run on `sweep.work_pool` (`flows.pool`), its data prepared here."""
    shared = pool.absolute_paths(config)
    return pool.run_cells_on_pool(
        config.sweep.work_pool,
        [sweep_cells.cell_config(shared, cell) for cell in cells],
        [p.manifest.digest for p in prepared],
        [cell.run_name for cell in cells],
        config.sweep.cell_retries,
    )


@task(name="start tracking", retries=2, retry_delay_seconds=2)
def start_sweep_tracking_task(tracker: tracking.Tracker, report, config):
    grid = config_mod.config_to_dict(config.sweep)
    tags = tracking.run_tags(kind="sweep", hardware_fingerprint=report.fingerprint)
    parent_id = tracker.start_run("sweep", tags, system_metrics=True)
    tracker.log(parent_id, params={f"sweep.{k}": json.dumps(v) for k, v in grid.items()})
    return parent_id


@task(name="tabulate and chart")
def tabulate_task(cells, results, config):
    forecasts = scaling_grid.forecast_lines(cells, results)
    rows = scaling_grid.tabulate(cells, results, forecasts)
    critical = scaling_grid.critical_batches(rows, results)
    out_dir = Path(config.sweep.out_dir)
    return rows, scaling_grid.write_outputs(rows, out_dir, forecasts, critical)


@task(name="track in MLflow", retries=2, retry_delay_seconds=2)
def track_sweep_task(tracker: tracking.Tracker, parent_id, rows, results, files):
    records.log_sweep(tracker, parent_id, rows, results, files)
    create_table_artifact(
        [row.shown() for row in rows],
        key="scaling-sweep",
        description=f"speedup and scaling efficiency per cell; MLflow run "
        f"{tracker.run_url(tracker.ui_base, parent_id)}",
    )


@flow(
    name="tfscale-sweep",
    log_prints=True,
    flow_run_name=named_by(lambda parameters: config_mod.sweep_name(parameters["config"])),
)
def sweep_flow(config: config_mod.Config) -> list[scaling_grid.SweepRow]:
    """Every cell of the grid in `config.sweep`, reusing cells seen before."""
    return run_sweep(config)


def run_sweep(config: config_mod.Config) -> list[scaling_grid.SweepRow]:
    """The sweep's tasks, in the flow run that calls it (`sweep_flow`, or a deployment's
    own run, whose page then shows them)."""
    with process.stops_noted():  # a stop Prefect's or a library's handling swallowed
        return _sweep(config)


def _sweep(config: config_mod.Config) -> list[scaling_grid.SweepRow]:
    quiet_run_logs()
    tracker = tracking.Tracker.for_config(config.track)
    check_tracking_task(tracker)
    if config.sweep.work_pool:  # no live worker: refused before anything is prepared or run
        pool.check_live_worker(config.sweep.work_pool)
    report = detect_task()
    devices_task(config, report)
    cells = plan_task(config)
    parent_id = start_sweep_tracking_task(tracker, report, config)
    try:
        if config.sweep.work_pool:
            prepared = [prepare_task(sweep_cells.cell_config(config, cell)) for cell in cells]
            results = pool_task(config, cells, prepared)
        else:
            results = []
            for cell in cells:
                cell_cfg = sweep_cells.cell_config(config, cell)
                prepared = prepare_task(cell_cfg)
                results.append(cell_task(cell_cfg, prepared.manifest, prepared.data_dir, report))
        rows, files = tabulate_task(cells, results, config)
        track_sweep_task(tracker, parent_id, rows, results, files)
    except BaseException as exc:
        fail_tracking_task(tracker, parent_id, repr(exc), tracking.ended_as(exc))
        raise
    return rows
