"""A sweep spread over a Prefect work pool on hosts of our own (`poollab`): a real Prefect
server on one network namespace, process workers on others, the submitter (`tfscale
sweep --pool`) beside the server. The cells train on two hosts, each row and MLflow child
run names its host, and a worker whose host dies mid-cell has its cell run again: the
sweep completes with every row. With no live worker, it stops before it does anything."""

from __future__ import annotations

import csv
import dataclasses
import subprocess
from pathlib import Path

import pytest
from helpers import BIN, INNER_LIMIT_S, LEAST_WORK, needs, scaled, tiny_params
from poollab import GRID, first_with_text, pool_lab

from tfscale.tasks.distribute import netlab

# the pool's grid at one cell of one epoch: whichever of the first two workers takes it dies
# in it, and it runs again on the other (free) or on host 3's, which joined. The cell at its
# least work (no noise scale, no evaluation while training: nothing here reads them). Cells
# spread over several workers: benchmarks/pool_sweep.py, four cells on two
CELLS = {
    **GRID,
    **LEAST_WORK,
    "sweep.replicas": [1],
    "sweep.batch_sizes": [32],
    "sweep.epochs": 1,
}


def sweep_on(lab, tmp: Path, *flags: str) -> subprocess.Popen:
    """`tfscale sweep --pool` on the server's host, its output in sweep.log."""
    params = tiny_params(tmp, **CELLS, **{"track.store_dir": str(tmp / "mlflow")})
    return lab.hosts.popen(
        0,
        [str(BIN / "tfscale"), "--params", str(params), "sweep", "--pool", lab.pool, *flags],
        env=lab.env,
        cwd=tmp,
        stdout=open(tmp / "sweep.log", "wb"),
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def hosts_possible():
    """Namespace hosts need root and iproute2: CI has both, and fails without them."""
    needs(netlab.available(), "namespace hosts for the pool tests")


@pytest.mark.integration
def test_a_pool_sweep_stops_with_no_live_worker_and_retries_the_cell_of_a_dead_host(
    tmp_path, hosts_possible
):
    """With no worker yet, the sweep stops before it prepares, tracks or submits anything,
    naming the command that starts one. Then hosts 1 and 2 are live and one of them takes
    the cell; that host dies in it; a worker started on host 3 joins. The lost cell runs
    again, and its row names a host still alive (the other first host, or host 3)."""
    from mlflow import MlflowClient

    refused = tmp_path / "refused"
    refused.mkdir()
    with pool_lab(0, tmp_path, spare=3) as lab:
        code = sweep_on(lab, refused).wait(timeout=scaled(INNER_LIMIT_S))
        lab.start_worker(1)
        lab.start_worker(2)
        assert_refused(code, refused)  # while the workers start
        lab.wait_live(1, 2)  # the sweep asks for a live worker before anything else
        sweep = sweep_on(lab, tmp_path)
        logs = {i: lab.log(f"worker-{i}") for i in (1, 2)}
        taker = first_with_text(logs, "cell on", 300)  # mid-cell: training has begun
        lab.kill_host(taker)
        lab.start_worker(3)
        code = sweep.wait(timeout=scaled(INNER_LIMIT_S))
        out = (tmp_path / "sweep.log").read_text(errors="replace")
        assert code == 0, out[-5000:]
        alive = {lab.hosts.address(i) for i in (1, 2, 3) if i != taker}
        dead = lab.hosts.address(taker)
    assert f"w{taker} stopped sending heartbeats; submitting it again" in out, out[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "sweep" / "sweep.csv")))
    assert len(rows) == 1, rows
    hosts = {row["host"].split("(")[-1].rstrip(")") for row in rows}
    assert hosts <= alive and dead not in hosts, (hosts, dead)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.tags["host"] for r in children) == sorted(row["host"] for row in rows)
    print(f"\npool sweep: the cell died with host {dead}, retried on {sorted(hosts)}")


def assert_refused(code: int, tmp: Path) -> None:
    """The sweep stopped before anything: one clear error; TensorFlow not loaded, no data
    prepared, no MLflow run, no table, no cell submitted (none left for the workers started
    next)."""
    from mlflow import MlflowClient
    from tfscale.flows.pool import PoolError

    out = (tmp / "sweep.log").read_text(errors="replace")
    assert code == PoolError.exit_code, out[-3000:]
    assert "error: work pool 'tfscale-test' has no live worker" in out, out[-3000:]
    assert "prefect worker start --pool tfscale-test" in out and "Traceback" not in out
    assert "submitted" not in out and "prepare " not in out, out[-3000:]
    assert "loading TensorFlow" not in out, out[-3000:]  # refused before the flow starts
    assert not (tmp / "tfrecords").exists() and not (tmp / "sweep").exists()
    client = MlflowClient(f"sqlite:///{tmp}/mlflow/mlflow.db")
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])


# -- the pieces, in this process ------------------------------------------------------


def test_a_cell_run_is_done_waited_on_lost_with_its_worker_or_failed():
    from tfscale.flows.pool import judge

    alive = {"w1": True, "w2": False}
    assert judge("COMPLETED", "w2", alive) == "done"
    assert judge("RUNNING", "w1", alive) == "wait"
    assert judge("PENDING", None, alive) == "wait"  # not taken yet
    assert judge("SCHEDULED", None, alive) == "wait"
    assert judge("RUNNING", "w2", alive) == "lost"
    assert judge("PENDING", "w2", alive) == "lost"
    assert judge("RUNNING", "w3", alive) == "wait"  # a worker the server has not listed
    for state in ("FAILED", "CRASHED", "CANCELLED"):
        assert judge(state, "w1", alive) == "failed"


def test_a_worker_is_lost_after_three_missed_heartbeats_and_never_sooner_than_the_floor():
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from tfscale.flows.pool import LOST_MIN_S, worker_lost

    now = datetime(2026, 11, 24, 12, tzinfo=UTC)

    def worker(age_s: float, interval: int | None) -> SimpleNamespace:
        beat = now - timedelta(seconds=age_s)
        return SimpleNamespace(last_heartbeat_time=beat, heartbeat_interval_seconds=interval)

    assert not worker_lost(worker(89, 30), now) and worker_lost(worker(91, 30), now)
    assert not worker_lost(worker(LOST_MIN_S - 1, 2), now)  # 3 beats of 2 s: the floor wins
    assert worker_lost(worker(LOST_MIN_S + 1, 2), now)
    assert worker_lost(worker(91, None), now)  # no interval reported: Prefect's default 30 s
    assert not worker_lost(SimpleNamespace(last_heartbeat_time=None), now)


def test_a_pool_the_server_has_not_made_has_no_live_worker_and_a_beating_one_has():
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from prefect.exceptions import ObjectNotFound

    from tfscale.flows.pool import PoolError, check_live_worker

    class Client:  # the two answers the server gives: no such pool, or its workers
        def __init__(self, workers):
            self.workers = workers

        def read_work_pool(self, pool):
            if self.workers is None:
                raise ObjectNotFound(http_exc=Exception(pool))

        def read_workers_for_work_pool(self, pool):
            return self.workers

    beating = SimpleNamespace(
        name="w1", last_heartbeat_time=datetime.now(UTC), heartbeat_interval_seconds=30
    )
    check_live_worker("p", Client([beating]))
    for workers in (None, []):
        with pytest.raises(PoolError, match="work pool 'p' has no live worker") as info:
            check_live_worker("p", Client(workers))
        assert "prefect worker start --pool p" in info.value.fix


def test_a_cell_refuses_a_host_that_does_not_share_the_sweep_or_the_data(tmp_path, digits):
    from tfscale.flows.pool import NotShared, check_data, check_shared, marker_path
    from tfscale.tasks.settings.config import load_config

    marker_path(tmp_path).write_text("abc\n")
    check_shared(tmp_path, "abc")
    with pytest.raises(NotShared, match="another sweep") as info:
        check_shared(tmp_path, "def")
    assert "same path on every host" in info.value.fix
    with pytest.raises(NotShared, match="no marker file"):
        check_shared(tmp_path / "elsewhere", "abc")
    overrides, manifest, _ = digits
    config = load_config(None, overrides)
    assert check_data(config, manifest.digest) == manifest
    with pytest.raises(NotShared, match="has manifest digest .* the sweep prepared 000000"):
        check_data(config, "0" * 64)
    elsewhere = load_config(None, {"prepare.data_dir": str(tmp_path / "none")})
    with pytest.raises(NotShared, match="has no prepared data at"):
        check_data(elsewhere, manifest.digest)


def test_a_pool_cell_gets_absolute_directories_and_the_same_run_directory(tmp_path, monkeypatch):
    from tfscale.flows.pool import absolute_paths
    from tfscale.tasks.settings.config import load_config

    monkeypatch.chdir(tmp_path)
    config = load_config(None, {})
    shared = absolute_paths(config)
    assert shared.prepare.data_dir == str(tmp_path / config.prepare.data_dir)
    assert shared.train.runs_dir == str(tmp_path / config.train.runs_dir)
    assert shared.sweep.out_dir == str(tmp_path / config.sweep.out_dir)
    assert dataclasses.replace(shared.train, runs_dir=config.train.runs_dir) == config.train


def test_a_host_is_named_with_the_address_it_reaches_a_server_from():
    import socket

    from tfscale.tasks.core.network import host_name

    assert host_name() == socket.gethostname()
    assert host_name("http://127.0.0.1:4200/api") == socket.gethostname()  # loopback: no address
    assert host_name("http://[::1]:4200/api") == socket.gethostname()  # not IPv4: the name


def test_the_table_names_hosts_only_when_cells_trained_on_several():
    from tfscale.tasks.report.scaling_grid import SweepRow, format_table

    def row(replicas: int, host: str) -> SweepRow:
        return SweepRow(0, 32, "weak", "float32", replicas, None, None, 10.0, 1.0, 1.0, None,
                        None, None, None, "mirrored", "overhead-bound", "runs/x", host)  # fmt: skip

    one = format_table([row(1, "a"), row(2, "a")])
    assert "host" not in one.splitlines()[0]
    two = format_table([row(1, "a (10.0.0.2)"), row(2, "a (10.0.0.3)")])
    assert two.splitlines()[0].endswith("host")
    assert two.splitlines()[2].endswith("a (10.0.0.2)")
    assert row(2, "a").run_name == "cell-0-b32-r2"
