"""Scheduled and on-demand deployments of the scaling study, served by a Prefect runner.

Schedules fire only against a real Prefect server (not the temporary one Prefect starts
when `PREFECT_API_URL` is unset): start one with `prefect server start` and point
`PREFECT_API_URL` at it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import flow
from prefect.flows import _display_serve_start_message
from prefect.runner import Runner

from tfscale.flows.prefect_api import check_prefect_server, named_by
from tfscale.tasks.core.process import import_tensorflow, set_up_process
from tfscale.tasks.core.progress import status
from tfscale.tasks.settings.config import load_config, study_name, sweep_name

NIGHTLY_CRON = "0 2 * * *"


def _run_config(parameters: dict) -> Any:
    """The config a deployment's run will load from its parameters."""
    return load_config(
        parameters.get("params_path", "params.yaml"), parameters.get("overrides") or {}
    )


# `digits-cnn-auto-2x-10ep`: the study of the run's params file and overrides
@flow(
    name="tfscale",
    log_prints=True,
    flow_run_name=named_by(lambda parameters: study_name(_run_config(parameters))),
)
def scheduled_study(params_path: str = "params.yaml", overrides: dict | None = None) -> dict:
    """A deployment entry point: the scaling study on `params_path` with dotted overrides,
    its tasks in this flow run (its page shows them, their logs and the summary)."""
    set_up_process()  # a flow run's own process: before TensorFlow is imported
    status("start", "loading TensorFlow")  # on the run's page while it loads
    import_tensorflow()
    # after the process's set-up: TensorFlow's and Prefect's settings are read at import
    from tfscale.flows.study import run_study

    return run_study(load_config(params_path, overrides or {})).to_dict()


# `sweep-cnn-mirrored`: the sweep of the run's params file and overrides
@flow(
    name="tfscale-nightly",
    log_prints=True,
    flow_run_name=named_by(lambda parameters: sweep_name(_run_config(parameters))),
)
def scheduled_sweep(params_path: str = "params.yaml", overrides: dict | None = None) -> list:
    """The scaling sweep on `params_path`: the nightly benchmark, its tasks in this flow
    run."""
    set_up_process()  # a flow run's own process: before TensorFlow is imported
    status("start", "loading TensorFlow")  # on the run's page while it loads
    import_tensorflow()
    # after the process's set-up: TensorFlow's and Prefect's settings are read at import
    from tfscale.flows.sweep import run_sweep

    return run_sweep(load_config(params_path, overrides or {}))


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
