"""The MLflow UI as `tfscale ui` serves it: MLflow's own server app, opening on training.

MLflow's UI keeps a "workflow type" per browser (GenAI or model training) and starts a
new browser on GenAI, whatever the experiment's kind: a run page clicked from the
results table then opens under "Evaluations" with a Traces tab, and the assistant's
chat panel opens over it. The page this app serves sets the browser's defaults to model
training and a closed assistant before MLflow's script reads them; a choice the user
made in the UI's toggle is kept. Everything else is MLflow's app, unchanged.

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


def defaults_script() -> str:
    """A script that stores each default the browser does not have yet."""
    pairs = json.dumps({key: json.dumps(value) for key, value in BROWSER_DEFAULTS.items()})
    return (
        "<script>(function(d){try{for(var k in d){if(localStorage.getItem(k)===null)"
        f"localStorage.setItem(k,d[k]);}}}}catch(e){{}}}})({pairs});</script>"
    )


def index_page(html: str) -> str:
    """MLflow's index page with the defaults set first thing in its head."""
    return html.replace("<head>", "<head>" + defaults_script(), 1)


def _serve_index():
    from flask import Response

    page = Path(flask_app.static_folder, "index.html")
    return Response(index_page(page.read_text()), mimetype="text/html")


flask_app.view_functions["serve"] = _serve_index
