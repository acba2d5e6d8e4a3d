"""A sweep's cells on a Prefect work pool: each cell is a flow run of the deployment
`tfscale-sweep-cell/<pool>`, taken by a worker of the pool on whichever host it runs.

The submitter (`tfscale sweep --pool NAME`) prepares every cell's data, submits the cells
at once, and watches them: a finished cell's result is read from the sweep's directory, a
failed cell is named and submitted again, and a cell whose worker stopped sending its
heartbeats (the host died, the worker was killed) is marked crashed and submitted again.
The table, the charts, the forecast and the MLflow runs are then made exactly as for a
sweep in one process: the cells never write to the tracking store, the submitter does.

Shared state, checked: every host must see the sweep's directory, the prepared data and
the runs directory at the same paths (one file system, e.g. NFS mounted alike). A cell
refuses to train on a host that does not see the sweep's marker file, or whose copy of the
data has another manifest digest than the one the submitter prepared.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.sorting import FlowRunSort
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelled, Crashed

from tfscale.flows.prefect_api import check_prefect_server
from tfscale.tasks.core import process
from tfscale.tasks.core.errors import UserError
from tfscale.tasks.core.files import write_json_atomic
from tfscale.tasks.core.network import host_name
from tfscale.tasks.core.progress import status
from tfscale.tasks.data.manifest import ShardError, load_manifest
from tfscale.tasks.data.preparation import dataset_dir
from tfscale.tasks.distribute import hardware, strategy
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.execute import sweep_cells
from tfscale.tasks.settings.config import config_from_dict, config_to_dict

CELL_FLOW = "tfscale-sweep-cell"
ROOT = Path(__file__).resolve().parent.parent  # the project: the deployment's source
ENTRYPOINT = "flows/pool.py:sweep_cell_flow"
# a worker is gone once its last heartbeat is this many of its intervals old (and at
# least LOST_MIN_S): Prefect's own server marks a worker offline after 3 missed ones
LOST_AFTER_BEATS = 3
LOST_MIN_S = 10.0
ACTIVE = {"SCHEDULED", "PENDING", "RUNNING", "CANCELLING", "PAUSED"}


class PoolError(UserError, RuntimeError):
    """A work pool has no live worker, or a cell failed on every attempt."""


class NotShared(UserError, RuntimeError):
    """A cell's host does not see what the submitter wrote (sweep directory, data)."""


def marker_path(sweep_dir: Path) -> Path:
    return sweep_dir / ".pool-marker"


def result_path(sweep_dir: Path, flow_run_id: str) -> Path:
    return sweep_dir / "cells" / f"{flow_run_id}.json"


def absolute_paths(config: Any) -> Any:
    """The config with its directories made absolute: a cell runs in the deployment's
    working directory on another host, where relative paths would mean other places."""
    prepare = dataclasses.replace(
        config.prepare, data_dir=str(Path(config.prepare.data_dir).resolve())
    )
    train = dataclasses.replace(config.train, runs_dir=str(Path(config.train.runs_dir).resolve()))
    sweep = dataclasses.replace(config.sweep, out_dir=str(Path(config.sweep.out_dir).resolve()))
    return dataclasses.replace(config, prepare=prepare, train=train, sweep=sweep)


# -- on the worker's host ----------------------------------------------------------------


def this_host() -> str:
    """This host's name and the address it reaches the Prefect server from."""
    return host_name(PREFECT_API_URL.value())


def check_shared(sweep_dir: Path, token: str) -> None:
    """Raises NotShared when this host does not see the submitter's marker."""
    host = this_host()
    marker = marker_path(sweep_dir)
    seen = marker.read_text().strip() if marker.exists() else None
    if seen != token:
        raise NotShared(
            f"host {host} does not see the sweep's directory {sweep_dir} "
            f"({'another sweep' if seen else 'no marker file'} there): a work pool's hosts "
            "must share the file system holding sweep.out_dir, prepare.data_dir and "
            "train.runs_dir",
            "mount that file system at the same path on every host of the pool (NFS, or a "
            "cluster file system), or run the sweep without --pool.",
        )


def check_data(config: Any, digest: str) -> Any:
    """The prepared data's manifest on this host, once its digest is the submitter's.

    Raises:
        NotShared: no prepared data here, or a copy that differs.
    """
    data_dir = dataset_dir(config)
    fix = (
        "share prepare.data_dir between the hosts (the submitter prepares it), or delete "
        "this host's copy so the shared one shows."
    )
    try:
        manifest = load_manifest(data_dir)
    except (OSError, ValueError, ShardError) as exc:
        raise NotShared(
            f"host {this_host()} has no prepared data at {data_dir} ({exc})", fix
        ) from exc
    if manifest.digest != digest:
        raise NotShared(
            f"host {this_host()}'s copy of {manifest.dataset} at {data_dir} has manifest "
            f"digest {manifest.digest[:12]}, the sweep prepared {digest[:12]}: a cell "
            "trained on other data would not compare",
            fix,
        )
    return manifest


@flow(name=CELL_FLOW, log_prints=True)
def sweep_cell_flow(config: dict, data_digest: str, sweep_dir: str, token: str) -> dict:
    """One cell of a sweep on this host: its result (as a cell in one process gives it,
    with the host) written to the sweep's directory under this flow run's id."""
    cfg = config_from_dict(config)
    check_shared(Path(sweep_dir), token)
    manifest = check_data(cfg, data_digest)
    report = hardware.detect_hardware()
    process.set_up_devices(sweep_cells.cell_devices(cfg, report))
    choice = strategy.select_strategy(report, cfg.train)
    run = Run(cfg, manifest, str(dataset_dir(cfg)), choice, report)
    host = this_host()
    print(f"cell on {host}: {choice.kind}, {choice.shape}, {choice.precision}")
    out = sweep_cells.train_cell(run, host)
    path = result_path(Path(sweep_dir), str(flow_run.id))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, out)
    return {"host": out["host"], "examples_per_s": out["examples_per_s"]}


# -- on the submitter's host -------------------------------------------------------------


@dataclass
class Attempt:
    """One cell's current flow run."""

    index: int
    label: str
    flow_run_id: str
    number: int  # 1 for the first submission, 2 for the first retry, ...
    worker: str | None = None  # the worker that took it, once one has


def deploy_cell_flow(pool: str) -> str:
    """The cell deployment on `pool` (made or updated): its id. The pool is made (type
    process) when the server has none of that name."""
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            status("pool", f"made work pool {pool!r} (type process)")
    source = sweep_cell_flow.from_source(source=str(ROOT), entrypoint=ENTRYPOINT)
    deployment = source.to_deployment(name=pool, work_pool_name=pool)
    return str(deployment.apply())


def live_workers(client: Any, pool: str, now: datetime) -> dict[str, bool]:
    """Each worker of the pool by name: whether its heartbeats still arrive."""
    workers = client.read_workers_for_work_pool(pool)
    return {w.name: not worker_lost(w, now) for w in workers}


def workers_now(client: Any, pool: str) -> dict[str, bool]:
    """`live_workers` now; none where the server has not made the pool yet (a worker
    started on it makes it; reading its workers answers 404). The sweep's watching loop
    reads `live_workers` alone: its pool was made before it submitted."""
    try:
        client.read_work_pool(pool)
    except ObjectNotFound:
        return {}
    return live_workers(client, pool, datetime.now(UTC))


def check_live_worker(pool: str, client: Any = None) -> None:
    """Raises PoolError, naming the command that starts one, where `pool` has no live
    worker (`client`: a client of its own where None). `tfscale sweep --pool` asks before
    its flow starts, the flow at its start (a deployment's run asks there first), and
    again just before it submits."""
    if client is None:
        with get_client(sync_client=True) as own:
            return check_live_worker(pool, own)
    if not any(workers_now(client, pool).values()):
        raise PoolError(
            f"work pool {pool!r} has no live worker",
            f"start one on each host that should train: PREFECT_API_URL=<this server> "
            f"prefect worker start --pool {pool} --type process --limit 1",
        )


def worker_lost(worker: Any, now: datetime) -> bool:
    """A worker whose last heartbeat is LOST_AFTER_BEATS intervals (at least LOST_MIN_S)
    old: its host died or it was killed."""
    if worker.last_heartbeat_time is None:
        return False
    interval = worker.heartbeat_interval_seconds or 30
    age = (now - worker.last_heartbeat_time).total_seconds()
    return age > max(LOST_AFTER_BEATS * interval, LOST_MIN_S)


def run_cells_on_pool(
    pool: str, cell_configs: list[Any], digests: list[str], labels: list[str], retries: int
) -> list[dict]:
    """Every cell as a flow run on `pool`; their results in order. A cell that fails or
    whose worker is lost runs again, up to `retries` more times.

    Raises:
        PoolError: the pool has no live worker, or a cell failed on every attempt.
    """

    sweep_dir = Path(cell_configs[0].sweep.out_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    marker_path(sweep_dir).write_text(token + "\n")
    deployment_id = deploy_cell_flow(pool)
    cells = _PoolCells(pool, deployment_id, cell_configs, digests, labels, sweep_dir, token)
    with get_client(sync_client=True) as client:
        check_live_worker(pool, client)
        attempts = [cells.submit(i, 1) for i in range(len(cell_configs))]
        status("pool", f"{len(attempts)} cells submitted to work pool {pool!r}")
        results: dict[int, dict] = {}
        try:
            while len(results) < len(attempts):
                time.sleep(1.0)
                cells.poll(client, attempts, results, retries)
        except BaseException:  # a failed cell, Ctrl-C: no cell left running for nobody
            _cancel(client, [a for a in attempts if a.index not in results])
            raise
        finally:
            marker_path(sweep_dir).unlink(missing_ok=True)
    return [results[i] for i in range(len(attempts))]


@dataclass
class _PoolCells:
    """The cells of one sweep on a pool: how each is submitted, and one round of watching
    their flow runs."""

    pool: str
    deployment_id: str
    configs: list[Any]
    digests: list[str]
    labels: list[str]
    sweep_dir: Path
    token: str  # in the marker file: a cell on a host that does not see it refuses (check_shared)

    def submit(self, index: int, number: int) -> Attempt:
        parameters = {
            "config": config_to_dict(self.configs[index]),
            "data_digest": self.digests[index],
            "sweep_dir": str(self.sweep_dir),
            "token": self.token,
        }
        flow_run = run_deployment(
            self.deployment_id,
            parameters=parameters,
            timeout=0,
            flow_run_name=f"{self.labels[index]}-try{number}",
            tags=["tfscale-sweep"],
            idempotency_key=f"{self.token}-{index}-{number}",  # a retried request: one run
        )
        return Attempt(index, self.labels[index], str(flow_run.id), number)

    def poll(self, client: Any, attempts: list[Attempt], results: dict, retries: int) -> None:
        """Reads every waiting cell's flow run once: records the done, submits again the
        failed and lost (`attempts` updated in place), raises when one has no retry left."""
        workers = live_workers(client, self.pool, datetime.now(UTC))
        waiting = [a for a in attempts if a.index not in results]
        flow_runs = read_flow_runs(client, [a.flow_run_id for a in waiting])
        for attempt in waiting:
            run = flow_runs[attempt.flow_run_id]
            state = run.state_type.value if run.state_type else "SCHEDULED"
            worker = (run.labels or {}).get("prefect.worker.name")
            if worker and attempt.worker is None:
                attempt.worker = worker
                status("pool", f"{attempt.label} taken by worker {worker}")
            step = judge(state, worker, workers)
            if step == "done":
                results[attempt.index] = done = _read_result(self.sweep_dir, attempt, run)
                status(
                    "pool",
                    f"{attempt.label} done on {done['host']} ({done['examples_per_s']:,.0f}"
                    f" ex/s; {len(results)}/{len(attempts)} cells)",
                )
            elif step != "wait":
                attempts[attempt.index] = self.retry(client, attempt, run, step, worker, retries)

    def retry(
        self, client: Any, attempt: Attempt, run: Any, step: str, worker: str | None, retries: int
    ) -> Attempt:
        """A failed or lost cell (`worker`: the one its flow run names) submitted again, or
        the sweep's error once it has no retry left."""
        why = _why(run, step, worker)
        if step == "lost":  # so the Prefect UI shows what happened to it
            client.set_flow_run_state(run.id, Crashed(message=why), force=True)
        if attempt.number > retries:
            raise PoolError(
                f"sweep cell {attempt.label} failed on all {attempt.number} "
                f"attempts (flow run {run.name}: {why})",
                "read the flow run's logs in the Prefect UI (or the worker's "
                "output), fix the cause and run the sweep again.",
            )
        status("pool", f"{attempt.label}: {why}; submitting it again")
        return self.submit(attempt.index, attempt.number + 1)


def judge(state: str, worker: str | None, alive: dict[str, bool]) -> str:
    """What to do with a cell's flow run: "done", "wait", "lost" (active, but the worker
    that took it stopped sending heartbeats) or "failed" (failed, crashed, cancelled)."""
    if state == "COMPLETED":
        return "done"
    if state in ACTIVE:
        return "lost" if worker and alive.get(worker) is False else "wait"
    return "failed"


def _why(run: Any, step: str, worker: str | None) -> str:
    """Why a cell's run ended without a result (`judge`'s "lost" or "failed")."""
    if step == "lost":
        return f"worker {worker} stopped sending heartbeats"
    message = (run.state.message or "").strip() if run.state else ""
    return f"{run.state_type.value.lower()}" + (f": {message}" if message else "")


def read_flow_runs(client: Any, ids: list[str]) -> dict[str, Any]:
    """The flow runs of `ids`, by id, in one request."""
    found = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(i) for i in ids])),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        limit=len(ids),
        offset=0,
    )
    return {str(run.id): run for run in found}


def _cancel(client: Any, attempts: list[Attempt]) -> None:
    for attempt in attempts:
        try:
            client.set_flow_run_state(
                uuid.UUID(attempt.flow_run_id), Cancelled(message="the sweep stopped"), force=True
            )
        except Exception:  # noqa: BLE001 - best effort while already failing
            pass


def _read_result(sweep_dir: Path, attempt: Attempt, run: Any) -> dict:
    path = result_path(sweep_dir, attempt.flow_run_id)
    if not path.exists():
        raise NotShared(
            f"sweep cell {attempt.label} completed (flow run {run.name}) but its result "
            f"{path} is not on this host: the pool's hosts do not share {sweep_dir}",
            "mount one file system at the same path on every host of the pool.",
        )
    result = json.loads(path.read_text())
    path.unlink()  # its figures go on into the sweep's rows and runs
    return result


def check_server() -> str:
    """The Prefect server a pool's workers reach (PREFECT_API_URL), once it answers.

    Raises:
        ServerUnavailable: none is set (the temporary server no other host can reach), or
            it does not answer.
    """
    return check_prefect_server(
        unset="sweep.work_pool needs a Prefect server the pool's workers reach: "
        "PREFECT_API_URL is unset",
        fix="start one ('prefect server start --host 0.0.0.0') and export "
        "PREFECT_API_URL=http://<its address>:4200/api here and on every worker's host",
    )
