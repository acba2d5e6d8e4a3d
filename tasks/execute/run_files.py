"""A training's files (`tasks.core.run_layout` names them): its metrics written
(`write_metrics`), exported (`export_run`) and read back (`load_exported`); what the
files beside a trained model say: the newest run of a dataset, the training that made a
model (its metrics and MLflow run), the study it was a stage of. Plain JSON, with nothing
heavy imported: reading a run's results, or `tfscale evaluate` of a model whose training
recorded its evaluation (`tasks.train.evaluation.recorded`), needs no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from tfscale.tasks.core.errors import MissingInput
from tfscale.tasks.core.files import atomic_path, write_json_atomic
from tfscale.tasks.core.run_layout import EXPORTED_METRICS, LATEST, METRICS
from tfscale.tasks.train.result import TrainResult

if TYPE_CHECKING:
    from tfscale.tasks.distribute.run import Run


def latest_run(runs_dir: str, dataset: str) -> dict:
    """The newest completed run for a dataset.

    Raises:
        MissingInput: no completed run, saying which command makes one.
    """
    path = Path(runs_dir) / dataset / LATEST
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
    for name in (METRICS, EXPORTED_METRICS):  # a run directory, an export
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


def write_metrics(result: TrainResult, run: Run) -> Path:
    run_dir = Path(result.run_dir)
    metrics = dict(
        result.to_dict(),
        dataset=run.manifest.dataset,
        model=run.train.model,
        lr_scaling_rule=run.train.lr_scaling,  # the rule asked for (`lr_scaling`: followed)
        manifest_digest=run.manifest.digest,
        hardware_fingerprint=run.report.fingerprint,
    )
    path = write_json_atomic(run_dir / METRICS, metrics)
    latest = {"run_dir": str(run_dir), "model_path": result.model_path}
    write_json_atomic(run_dir.parent / LATEST, latest)
    return path


def load_exported(export_dir: Path) -> TrainResult:
    """The training result `tfscale train --export-dir` wrote into `export_dir`.

    Raises:
        MissingInput: no `train_metrics.json` there, naming the command that writes it.
    """
    path = export_dir / EXPORTED_METRICS
    if not path.exists():
        raise MissingInput(
            f"No training metrics at {path}; run 'tfscale train --export-dir {export_dir}' "
            "(add --baseline for the single-device baseline) first."
        )
    metrics = json.loads(path.read_text())
    names = {f.name for f in dataclasses.fields(TrainResult)}
    return TrainResult(**{k: v for k, v in metrics.items() if k in names})


def export_run(result: TrainResult, export_dir: Path) -> None:
    """Copies the model, metrics, per-epoch history (CSV, for plots) and, where the run has
    them, its diagnosis, its MLflow run and its final evaluation to a fixed place: `tfscale
    evaluate` of the exported model reads that evaluation back (`evaluation.recorded`, which
    checks the model file's digest) instead of evaluating it again."""
    import csv

    from tfscale.tasks.train.evaluation import RECORDED

    export_dir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(result.run_dir)
    with atomic_path(export_dir / "model.keras") as tmp:
        shutil.copyfile(result.model_path, tmp)
    shutil.copyfile(run_dir / METRICS, export_dir / EXPORTED_METRICS)
    for name in (TRACKED_AS, "diagnosis.json", RECORDED):
        if (run_dir / name).exists():
            shutil.copyfile(run_dir / name, export_dir / name)
        else:  # an earlier export's, not this run's
            (export_dir / name).unlink(missing_ok=True)
    with open(export_dir / "history.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(result.history[0]))
        writer.writeheader()
        writer.writerows(result.history)
