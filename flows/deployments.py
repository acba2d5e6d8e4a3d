"""Scheduled and on-demand deployments of the scaling study, served by a Prefect runner.

Schedules fire only against a real Prefect server (not the temporary one Prefect starts
when `PREFECT_API_URL` is unset): start one with `prefect server start` and point
`PREFECT_API_URL` at it.
"""

from __future__ import annotations

import asyncio
import logging

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactCreate
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
    TaskRunFilter,
)
from prefect.client.schemas.sorting import ArtifactSort
from prefect.context import FlowRunContext
from prefect.flows import _display_serve_start_message
from prefect.runner import Runner

from flows.prefect_api import check_prefect_server
from tasks.core.process import import_tensorflow, set_up_process
from tasks.core.progress import status
from tasks.settings.config import load_config

NIGHTLY_CRON = "0 2 * * *"


def show_here(subflow_state, key: str) -> None:
    """The artifact `key` of the subflow run that ended in `subflow_state`, on this
    (the deployment's) flow run's page too, where a person who started the run looks."""

    here = FlowRunContext.get()
    subflow_run_id = subflow_state.state_details.flow_run_id
    if here is None or subflow_run_id is None:
        return
    try:
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[subflow_run_id])),
                task_run_filter=TaskRunFilter(),  # the server refuses a request without it
                sort=ArtifactSort.CREATED_DESC,
                limit=1,
                offset=0,
            )
            for artifact in found:
                client.create_artifact(
                    ArtifactCreate(
                        key=key,
                        type=artifact.type,
                        description=artifact.description,
                        data=artifact.data,
                        flow_run_id=here.flow_run.id,
                    )
                )
    except Exception as exc:  # noqa: BLE001 - the run's results are saved; only a copy is lost
        logging.getLogger(__name__).warning(
            "the %s artifact stays on the subflow run's page only (%s)", key, exc
        )


@flow(name="tfscale", log_prints=True)
def scheduled_study(params_path: str = "params.yaml", overrides: dict | None = None) -> dict:
    """A deployment entry point: the scaling study on `params_path` with dotted overrides."""
    set_up_process()  # a flow run's own process: before TensorFlow is imported
    status("start", "loading TensorFlow")  # on the run's page while it loads
    import_tensorflow()
    # after the process's set-up: TensorFlow's and Prefect's settings are read at import
    from flows.study import scaling_study

    state = scaling_study(load_config(params_path, overrides or {}), return_state=True)
    show_here(state, "scaling-summary")
    return state.result().to_dict()


@flow(name="tfscale-nightly", log_prints=True)
def scheduled_sweep(params_path: str = "params.yaml", overrides: dict | None = None) -> list:
    """The scaling study on `params_path`: the nightly benchmark."""
    set_up_process()  # a flow run's own process: before TensorFlow is imported
    status("start", "loading TensorFlow")  # on the run's page while it loads
    import_tensorflow()
    # after the process's set-up: TensorFlow's and Prefect's settings are read at import
    from flows.sweep import sweep_flow

    state = sweep_flow(load_config(params_path, overrides or {}), return_state=True)
    show_here(state, "scaling-sweep")
    return state.result()


def build_deployments(params_path: str = "params.yaml", cron: str = NIGHTLY_CRON) -> list:
    return [
        scheduled_sweep.to_deployment(
            name="nightly-scaling",
            cron=cron,
            parameters={"params_path": params_path},
            description="The scaling study (the sweep grid in params.yaml), every night.",
        ),
        scheduled_study.to_deployment(
            name="on-demand-train",
            parameters={"params_path": params_path, "overrides": {}},
            description="One scaling study; pass overrides such as {'train.epochs': 3}.",
        ),
    ]


def serve_deployments(params_path: str = "params.yaml", cron: str = NIGHTLY_CRON) -> None:
    """Registers the deployments with the server and runs them when due (blocks).

    Stopping it leaves the schedules active: the server keeps creating the nightly runs,
    and they run when `tfscale serve` (or any runner of these deployments) is back.
    """

    class _Runner(Runner):
        def handle_sigterm(self, *args: object, **kwargs: object) -> None:
            """Stops by cancelling the runner in its own event loop. (Prefect's handler
            calls its stop from the signal handler and exits before the stop coroutine
            runs: 'RuntimeWarning: coroutine Runner.astop was never awaited'.)"""
            self._logger.info("SIGTERM received, stopping")
            raise KeyboardInterrupt

    check_prefect_server()
    deployments = build_deployments(params_path, cron)
    runner = _Runner(pause_on_shutdown=False)
    for deployment in deployments:
        runner.add_deployment(deployment)
    _display_serve_start_message(*deployments)
    try:
        asyncio.run(runner.start())
    except KeyboardInterrupt:
        pass  # a stop asked for (SIGTERM from a service manager, or Ctrl-C)
