"""The MLflow UI as `tfscale ui` serves it: MLflow's own server app, opening on training.

MLflow's UI keeps a "workflow type" per browser (GenAI or model training) and starts a
new browser on GenAI, whatever the experiment's kind: a run page clicked from the
results table then opens under "Evaluations" with a Traces tab, and the assistant's
chat panel opens over it. The page this app serves sets the browser's defaults to model
training and a closed assistant before MLflow's script reads them; a choice the user
made in the UI's toggle is kept. An experiment with tfscale's saved results view
(`tracking.results_view`) gets its runs table's columns the same way, so the table opens
on them without the view's key in the address; a table the user arranged is kept.
Everything else is MLflow's app, unchanged.

`tfscale ui` runs `mlflow server --app-name tfscale`; the name is this module's entry
point in `pyproject.toml` (`mlflow.app`, MLflow's plugin group for server apps).
"""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.server import app as flask_app
from mlflow.server.fastapi_app import app

__all__ = ["app", "BROWSER_DEFAULTS", "index_page"]

# MLflow's browser-state keys (`<key>_v<version>`, JSON values), as its UI names them
BROWSER_DEFAULTS = {
    "mlflow.workflowType_v1": "machine_learning",
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True,
}


# the runs table's state as MLflow's UI keeps it per experiment in the browser (its own
# defaults, read from MLflow 3.17's "Override saved view"); an experiment's saved view
# (`tracking.results_view`) goes over it
TABLE_KEY = 'MLflowLocalStorage-1.1-ExperimentPage-["{}"]-ReactComponentState'
TABLE_STATE = {
    "searchFilter": "",
    "orderByKey": "attributes.start_time",
    "orderByAsc": False,
    "startTime": "ALL",
    "lifecycleFilter": "Active",
    "datasetsFilter": [],
    "modelVersionFilter": "All Runs",
    "selectedColumns": [],
    "columnOrder": [],
    "columnWidths": {},
    "runsExpanded": {},
    "runsPinned": [],
    "runsHidden": [],
    "runsVisibilityMap": {},
    "runsHiddenMode": "FIRST_10_RUNS",
    "viewMaximized": False,
    "runListHidden": False,
    "isAccordionReordered": False,
    "useGroupedValuesInCharts": True,
    "hideEmptyCharts": True,
    "groupBy": None,
    "groupsExpanded": {},
    "autoRefreshEnabled": True,
    "globalLineChartConfig": {
        "xAxisKey": "step",
        "lineSmoothness": 0,
        "selectedXAxisMetricKey": "",
    },
}


def table_defaults() -> dict[str, object]:
    """The browser state of each experiment's runs table that has a saved results view
    (the experiment's tag `tracking.VIEW_TAG`): the table opens on its columns without the
    view's key in the address. Read from the store the UI serves."""
    from mlflow.server.handlers import _get_tracking_store

    from tfscale.tasks.track.tracking import VIEW_TAG

    defaults: dict[str, object] = {}
    for experiment in _get_tracking_store().search_experiments(max_results=1000):
        view = experiment.tags.get(VIEW_TAG)
        if view:
            key = TABLE_KEY.format(experiment.experiment_id)
            defaults[key] = {**TABLE_STATE, **json.loads(view)}
    return defaults


def defaults_script(table: dict[str, object] | None = None) -> str:
    """A script that stores each default the browser does not have yet: the page's
    (`BROWSER_DEFAULTS`) and the runs tables' (`table`: `table_defaults`). A table the
    user arranged keeps its own state."""
    every = {**BROWSER_DEFAULTS, **(table or {})}
    pairs = json.dumps({key: json.dumps(value) for key, value in every.items()})
    pairs = pairs.replace("</", "<\\/")  # a saved view's words cannot end the script
    return (
        "<script>(function(d){try{for(var k in d){if(localStorage.getItem(k)===null)"
        f"localStorage.setItem(k,d[k]);}}}}catch(e){{}}}})({pairs});</script>"
    )


def index_page(html: str, table: dict[str, object] | None = None) -> str:
    """MLflow's index page with the defaults set first thing in its head."""
    return html.replace("<head>", "<head>" + defaults_script(table), 1)


def _serve_index():
    from flask import Response

    page = Path(flask_app.static_folder, "index.html")
    try:
        table = table_defaults()
    except Exception:  # noqa: BLE001 - the page without them, rather than no page
        table = {}
    return Response(index_page(page.read_text(), table), mimetype="text/html")


flask_app.view_functions["serve"] = _serve_index
