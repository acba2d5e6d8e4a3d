"""What the files beside a trained model say: the newest run of a dataset (`latest.json`),
the training that made a model (its metrics and MLflow run), the study it was a stage of.
Plain JSON reading, with nothing heavy imported: `tfscale evaluate` of a model whose
training recorded its evaluation (`tasks.train.evaluation.recorded`) needs no TensorFlow.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.core.errors import MissingInput


def latest_run(runs_dir: str, dataset: str) -> dict:
    """The newest completed run for a dataset.

    Raises:
        MissingInput: no completed run, saying which command makes one.
    """
    path = Path(runs_dir) / dataset / "latest.json"
    if not path.exists():
        raise MissingInput(
            f"No trained model for {dataset!r} under {runs_dir}; run 'tfscale train "
            f"--dataset {dataset}' first, or pass --model-path."
        )
    return json.loads(path.read_text())


# beside a trained model: {"run_id", "url"} of its MLflow run, and "study_run_id" when it
# was a stage of a scaling study (`tfscale train --baseline`, `--against-baseline DIR`)
TRACKED_AS = "mlflow_run.json"


def trained_by(model_dir: Path) -> dict[str, str]:
    """What the files beside a model say about the training that made it, as tags: its
    dataset, model, strategy, replicas and precision, its run directory, and its MLflow
    run (id and link) when one logged it."""
    tags: dict[str, str] = {}
    for name in ("metrics.json", "train_metrics.json"):  # a run directory, an export
        if (model_dir / name).exists():
            metrics = json.loads((model_dir / name).read_text())
            keys = ("dataset", "model", "strategy", "replicas", "precision")
            tags.update({k: str(metrics[k]) for k in keys if k in metrics})
            tags["training_run_dir"] = str(metrics.get("run_dir", model_dir))
            break
    if (model_dir / TRACKED_AS).exists():
        tracked = json.loads((model_dir / TRACKED_AS).read_text())
        tags.update(training_run_id=tracked["run_id"], training_run_url=tracked["url"])
    return tags


def study_of(model_dir: Path) -> str | None:
    """The MLflow study run the training beside this model was a stage of, if any."""
    if not (model_dir / TRACKED_AS).exists():
        return None
    tracked = json.loads((model_dir / TRACKED_AS).read_text())
    return tracked.get("study_run_id") or tracked.get("pipeline_run_id")  # before 2026-11-26
