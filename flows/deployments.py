"""Scheduled and on-demand deployments of the pipeline, served by a Prefect runner.

Schedules fire only against a real Prefect server (not the temporary one Prefect starts
when `PREFECT_API_URL` is unset): start one with `prefect server start` and point
`PREFECT_API_URL` at it.
"""

from __future__ import annotations

from prefect import flow

from flows.errors import ServerUnavailable

NIGHTLY_CRON = "0 2 * * *"


def check_prefect_server() -> str:
    """The configured server's API URL, once it answers its health check (through
    Prefect's own client, which retries a busy server's 429 and 503 answers)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    fix = (
        "start one with 'prefect server start' (SQLite by default) and run "
        "'export PREFECT_API_URL=http://127.0.0.1:4200/api'"
    )
    if not url:
        raise ServerUnavailable(
            "tfscale serve needs a running Prefect server: schedules never fire on the temporary "
            "server Prefect starts when PREFECT_API_URL is unset",
            f"{fix}.",
        )
    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        raise ServerUnavailable(f"Prefect server {url} is unreachable ({problem})", f"{fix}.")
    return url


@flow(name="tfscale", log_prints=True)
def scheduled_pipeline(params_path: str = "params.yaml", overrides: dict | None = None) -> dict:
    """A deployment entry point: the pipeline on `params_path` with dotted overrides."""
    from tasks.process import import_tensorflow, set_up_process
    from tasks.progress import stage

    set_up_process()  # a flow run's own process: before TensorFlow is imported
    stage("start", "loading TensorFlow")  # on the run's page while it loads
    import_tensorflow()
    from flows.pipeline import pipeline
    from tasks.config import load_config

    return pipeline(load_config(params_path, overrides or {})).to_dict()


@flow(name="tfscale-nightly", log_prints=True)
def scheduled_sweep(params_path: str = "params.yaml", overrides: dict | None = None) -> list:
    """The scaling study on `params_path`: the nightly benchmark."""
    from tasks.process import import_tensorflow, set_up_process
    from tasks.progress import stage

    set_up_process()  # a flow run's own process: before TensorFlow is imported
    stage("start", "loading TensorFlow")  # on the run's page while it loads
    import_tensorflow()
    from flows.sweep import sweep_flow
    from tasks.config import load_config

    return sweep_flow(load_config(params_path, overrides or {}))


def build_deployments(params_path: str = "params.yaml", cron: str = NIGHTLY_CRON) -> list:
    return [
        scheduled_sweep.to_deployment(
            name="nightly-scaling",
            cron=cron,
            parameters={"params_path": params_path},
            description="The scaling study (the sweep grid in params.yaml), every night.",
        ),
        scheduled_pipeline.to_deployment(
            name="on-demand-train",
            parameters={"params_path": params_path, "overrides": {}},
            description="One pipeline run; pass overrides such as {'train.epochs': 3}.",
        ),
    ]


def serve_deployments(params_path: str = "params.yaml", cron: str = NIGHTLY_CRON) -> None:
    """Registers the deployments with the server and runs them when due (blocks).

    Stopping it leaves the schedules active: the server keeps creating the nightly runs,
    and they run when `tfscale serve` (or any runner of these deployments) is back.
    """
    from prefect import serve

    check_prefect_server()
    serve(*build_deployments(params_path, cron), pause_on_shutdown=False)
