"""Schedules on a real Prefect server (SQLite), served by `tfscale serve`: the server itself
creates the scheduled runs, a schedule that falls due during the test runs to completion
with no request from the test while an on-demand run completes beside it, and stopping the
runner leaves the schedules active. Every call to the server goes through Prefect's own
client, which retries a busy server's 503 answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import LEAST_WORK, on_a_free_port, prefect_home, scaled, tiny_params

from tfscale.tasks.core.network import wait_healthy

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory) -> Iterator[dict]:
    """A real Prefect server on a free localhost port, and the environment that reaches it.
    The tests share it in any order: each waits for its own registration of the deployments
    (`tfscale serve` replaces a deployment's schedules and deletes its future scheduled runs)
    and reads only the runs its schedule made."""
    home = prefect_home(tmp_path_factory.mktemp("prefect"))
    env = dict(
        os.environ,
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
    )
    log = open(home / "server.log", "wb")

    def start(port: int) -> subprocess.Popen:
        command = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1"]
        return subprocess.Popen(
            [*command, "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
        )

    def up(port: int, proc: subprocess.Popen) -> str | None:
        alive = lambda: proc.poll() is None  # noqa: E731
        problem = wait_healthy(f"http://127.0.0.1:{port}/api/health", scaled(120), 0.5, alive)
        return problem and f"{problem}: {(home / 'server.log').read_text(errors='replace')}"

    port, proc = on_a_free_port(start, up)
    url = f"http://127.0.0.1:{port}/api"
    try:
        yield {"url": url, "env": dict(env, PREFECT_API_URL=url), "log": home / "server.log"}
    finally:
        proc.terminate()
        proc.wait(timeout=scaled(30))
        log.close()
    server_log = (home / "server.log").read_text(errors="replace")
    assert "bulk DML" not in server_log, "the scheduler service failed"


@contextmanager
def client_for(url: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        with get_client(sync_client=True) as client:
            yield client


@contextmanager
def serving(server: dict, params: Path, cwd: Path, *flags: str):
    """`tfscale serve` against the server until the block ends (then SIGTERM, as a service
    manager stops it)."""
    log = open(cwd / "serve.log", "wb")
    proc = subprocess.Popen(
        [str(BIN / "tfscale"), "--params", str(params), "serve", *flags],
        cwd=cwd,
        env=server["env"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=scaled(60))
        log.close()


def wait_for(what: str, probe, timeout_s: float, every_s: float = 1.0):
    """Polls `probe()` until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


SERVED = ("nightly-scaling", "on-demand-train")


def deployments_by_name(client, cron: str) -> dict:
    """tfscale's deployments, once `tfscale serve` registered them with `cron` (a test
    before may have left them with another)."""
    from prefect.client.schemas.sorting import DeploymentSort

    def registered():
        found = {d.name: d for d in client.read_deployments(limit=50, sort=DeploymentSort.NAME_ASC)}
        if not set(SERVED) <= set(found):
            return None
        schedules = found["nightly-scaling"].schedules
        return schedules and schedules[0].schedule.cron == cron and found

    return wait_for(f"the served deployments registered with {cron!r}", registered, 120)


def flow_runs_of(client, deployment_id) -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    return client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        limit=50,
    )


def artifacts_of(client, flow_run_id) -> list[dict]:
    """A flow run's own artifacts, asked for as the UI's run page asks: by the artifacts'
    flow run alone (the client's filter joins task runs, which drops an artifact that a
    flow made outside any task)."""
    found = client._client.post(
        "/artifacts/filter",
        json={"artifacts": {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 10},
    )
    found.raise_for_status()
    return found.json()


def table_rows(markdown: str) -> list[str]:
    """A Markdown table's body rows."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return lines[2:]


def task_runs_of(client, flow_run_id) -> list:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    )


def logs_of(client, flow_run_id) -> list:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    return client.read_logs(
        log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
    )


def test_nightly_deployments_default_to_two_in_the_morning():
    """The schedule `tfscale serve` registers unless `--cron` says otherwise (the test below
    serves one that falls due within a minute or two, and the server's own runs follow it)."""
    from tfscale.flows.deployments import build_deployments

    nightly, on_demand = build_deployments("params.yaml")
    assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
    assert (nightly.name, on_demand.name, on_demand.schedules) == (*SERVED, [])
    nightly, _ = build_deployments("params.yaml", "30 4 * * 1")  # what --cron gives it
    assert [s.schedule.cron for s in nightly.schedules] == ["30 4 * * 1"]


# the longest `tfscale serve` may take to register its deployments and the server to schedule
# their runs, on the reference machine: its schedule names the first whole minute after that
REGISTERS_WITHIN_S = 30  # 8-12 s seen under the suite's load (2.5x that): the rest is margin


def once_a_year(lead_s: float) -> tuple[str, datetime]:
    """A cron that names one minute of the year (in UTC, the schedule's zone): the first
    whole minute at least `lead_s` from now, and that minute. Within a test it falls due
    once: `* * * * *` fell due every minute, and each time started another sweep."""
    soon = datetime.now(UTC) + timedelta(seconds=lead_s)
    due = soon.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return f"{due.minute} {due.hour} {due.day} {due.month} *", due


# the runs' figures are not what these tests check: least work, and a sweep of one cell
LEAST_SWEEP = {**LEAST_WORK, "sweep.replicas": [1]}


def test_a_served_schedule_falls_due_and_runs_beside_an_on_demand_run_and_stop_keeps_it(
    prefect_server, tmp_path
):
    """The server itself creates the scheduled runs; the one that falls due during the test
    (at the minute its cron names) runs to completion with no request from the test, while
    an on-demand run, asked for meanwhile, completes too; the runs not yet due stay
    scheduled; stopping the runner leaves the schedule active."""
    params = tiny_params(tmp_path, **LEAST_SWEEP)
    cron, due = once_a_year(scaled(REGISTERS_WITHIN_S))
    with client_for(prefect_server["url"]) as client:
        with serving(prefect_server, params, tmp_path, "--cron", cron) as serve:
            deployments = deployments_by_name(client, cron)
            nightly = deployments["nightly-scaling"]
            assert nightly.schedules[0].active
            registered = datetime.now(UTC)

            def scheduled_runs():  # not a run another test's schedule left, already due
                found = flow_runs_of(client, nightly.id)
                return [r for r in found if r.auto_scheduled and r.expected_start_time > registered]

            scheduled = wait_for("the server's scheduler creating the runs", scheduled_runs, 120)
            # registered after `due`, the first would fall due a year later: a start this slow
            # needs a longer REGISTERS_WITHIN_S
            assert scheduled[0].expected_start_time == due, (registered, scheduled[0])
            on_demand = client.create_flow_run_from_deployment(
                deployments["on-demand-train"].id,
                parameters={"params_path": str(params), "overrides": {"train.epochs": 1}},
            )
            shows_its_work(client, on_demand.id, tmp_path)

            def the_due_run_finished():
                (run, *later) = scheduled_runs()
                assert all(r.state.type.value == "SCHEDULED" for r in later), later
                return run.state.type.value in FINAL and run

            run = wait_for("the scheduled run finishing", the_due_run_finished, 400, 2)
            assert run.state.type.value == "COMPLETED", (tmp_path / "serve.log").read_text()[-3000:]
        stopped = (tmp_path / "serve.log").read_text()
        assert serve.returncode == 0, stopped[-3000:]  # stopped by its SIGTERM, not killed
        assert "RuntimeWarning" not in stopped and "Traceback" not in stopped, stopped[-3000:]
        after = client.read_deployment(nightly.id)
        assert not after.paused and after.schedules[0].active  # stopping did not pause it
    assert (tmp_path / "sweep" / "sweep.csv").exists()


def shows_its_work(client, flow_run_id, tmp_path: Path) -> None:
    """The on-demand run completes, and its own page holds the work: the summary, every
    task and log line (no subflow hides them), under a name that says what ran."""
    state = wait_for(
        "the on-demand run finishing",
        lambda: (s := client.read_flow_run(flow_run_id).state.type.value) in FINAL and s,
        400,
        every_s=2,
    )
    assert state == "COMPLETED", (tmp_path / "serve.log").read_text()[-3000:]
    assert list((tmp_path / "runs" / "digits").glob("mirrored-*/summary.json"))
    shown = artifacts_of(client, flow_run_id)
    assert len(shown) == 1, (tmp_path / "serve.log").read_text()[-3000:]
    (shown,) = shown
    assert shown["key"] == "scaling-summary" and "speedup" in shown["data"]
    assert all(row.split("|")[1].strip() for row in table_rows(shown["data"]))
    assert client.read_flow_run(flow_run_id).name == "digits-mlp-auto-2x-1ep"
    own = task_runs_of(client, flow_run_id)
    tasks = {t.name.rsplit("-", 1)[0] for t in own}
    assert {"train baseline (one device)", "track in MLflow"} <= tasks, tasks
    ids = {t.id for t in own}
    assert not [r for r in client.read_flow_runs(limit=200) if r.parent_task_run_id in ids]
    logs = [log.message for log in logs_of(client, flow_run_id)]
    assert any(m.startswith("distributed epoch 1/1") for m in logs), logs
    done = [m for m in logs if m.startswith("Finished in state") and "COMPLETED" in m.upper()]
    assert not done, done  # completed and cached-completed states: noise


def test_prefects_own_cli_and_deploy_work_against_the_projects_server(prefect_server, tmp_path):
    """`prefect work-pool ls`, `prefect deployment ls`, `prefect deploy` and `flow.deploy()`
    against a server of the project's locked set (under FastAPI 0.151+ the server answered
    its own client's `limit: null` with 422)."""
    env = prefect_server["env"]
    (tmp_path / "hello.py").write_text(
        "from prefect import flow\n\n@flow\ndef hello():\n    return 1\n"
    )

    def prefect(*args: str) -> str:
        proc = subprocess.run(
            [str(BIN / "prefect"), "--no-prompt", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(180),
        )
        assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    prefect("work-pool", "create", "cli-pool", "--type", "process")
    assert "cli-pool" in prefect("work-pool", "ls")
    prefect("deploy", "hello.py:hello", "-n", "by-cli", "-p", "cli-pool")
    script = (
        "from prefect import flow\n"
        f"f = flow.from_source(source={str(tmp_path)!r}, entrypoint='hello.py:hello')\n"
        "print(f.deploy(name='by-api', work_pool_name='cli-pool', print_next_steps=False))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=scaled(180)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed = prefect("deployment", "ls")
    assert "hello/by-cli" in listed and "hello/by-api" in listed, listed
