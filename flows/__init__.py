"""Layer 10, the ways in: the `tfscale` command (`cli`, `commands`), the Prefect flows that
order the steps of `tasks/` (`study`, `sweep`, `pool`, with their cache policies in
`caching`), the deployments `tfscale serve` registers, the temporary Prefect API, and the
worker process's entry point (`worker`).

Importing it sends tfscale's status lines and epochs to the current Prefect run's log too
(`tasks.core.progress.log_runs_with`), where a run is in progress."""

from __future__ import annotations

import sys
from typing import Any

from tasks.core.progress import log_runs_with


def prefect_run_logger() -> Any:
    """The logger of the Prefect flow or task run in progress here, or None (none, or
    Prefect not imported: nothing runs in a flow then)."""
    if "prefect" not in sys.modules:
        return None
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.logging import get_run_logger

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return None
    return get_run_logger()


log_runs_with(prefect_run_logger)
