"""How the flows reuse results: Prefect cache policies over a task's inputs and the code
that makes its result, stored beside the runs they point at.

A cached result is reused only while (1) its inputs are the same (`INPUTS`: the config,
the data manifest, the hardware report and the strategy, each a value), (2) the code that
made it is the same (`CODE`: the project's sources and the TensorFlow and Keras versions,
`tasks.core.provenance`), and (3) the files it points at are still on disk (`cached`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import INPUTS, CachePolicy

from tfscale.tasks.core.provenance import code_version
from tfscale.tasks.settings.config import Config


@dataclass
class CodeVersion(CachePolicy):
    """The code that makes a result: a key part that changes with any edit of the project's
    sources or an upgrade of TensorFlow or Keras."""

    def compute_key(self, task_ctx: Any, inputs: dict, flow_parameters: dict, **kwargs: Any):
        return code_version()


CODE = CodeVersion()
# a task's inputs and the code; callbacks (an MLflow epoch log) do not change a result
RESULTS = INPUTS - "on_epoch" + CODE


def cache_dir(config: Config) -> Path:
    """Where this project's cached task results live: beside the runs they point at (not
    in Prefect's home directory, where another checkout's results could be reused)."""
    return Path(config.train.runs_dir).resolve() / ".prefect-results"


def cached(task_: Any, config: Config, *, files_present: bool) -> Any:
    """`task_` reading and writing the project's cache; a cached result whose files are
    gone (`files_present` false) is computed again and replaces the cached one."""
    return task_.with_options(result_storage=cache_dir(config), refresh_cache=not files_present)


def reused(state: Any) -> bool:
    """Whether a task's final state is a cached result reused (Prefect's `Cached` state)."""
    return state.name == "Cached"
