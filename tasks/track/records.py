"""tfscale's results as MLflow runs: a training's (its fields, epochs, held-out curve and
gradient noise scale), a study's on its parent (summary, diagnosis, artifacts, the
registered model), and a forecast's, a plan's and a sweep's runs; the domain's tags, params
and run names, each read from the typed `Run` a study trains (one route to MLflow). The
domain's logging, over the store's client (`tasks.track.tracking.Tracker`), as MLflow
keeps its fluent API apart from its client."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfscale.tasks.core.fields import fields_by_type
from tfscale.tasks.core.run_layout import METRICS
from tfscale.tasks.track.tracking import Tracker, rounded, run_tags, write_json_artifact

if TYPE_CHECKING:
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.report.summary import StudyRecord


def study_tags(run: Run) -> dict[str, str]:
    """Hardware fingerprint, the strategy decision's reason, git commit, manifest hash (the
    strategy and precision are params: `choice_params`)."""
    return run_tags(
        hardware_fingerprint=run.report.fingerprint,
        strategy_reason=run.choice.reason,
        manifest_hash=run.manifest.digest,
    )


def choice_params(choice: Any) -> dict[str, str]:
    """The strategy and precision a run trains with: params (how it was set up), logged as
    it opens so the table shows them while it trains, and never also as tags."""
    return {"strategy": choice.kind, "precision": choice.precision}


def study_run_name(run: Run) -> str:
    """What tells a study's runs apart in the table: `digits-cnn-mirrored-2x-10ep`."""
    choice, train = run.choice, run.train
    split = {"stages": "st", "columns": "tp"}.get(choice.spec.splits)
    devices = f"{choice.stages}{split}" if split else f"{choice.replicas}x"
    return f"{run.manifest.dataset}-{train.model}-{choice.kind}-{devices}-{train.epochs}ep"


def child_tags(tags: dict[str, str]) -> dict[str, str]:
    """A study child's tags: the parent's, without its `strategy_reason` (the child's own
    `reason` is logged with its result)."""
    return {k: v for k, v in tags.items() if k != "strategy_reason"}


def study_params(run: Run) -> dict[str, Any]:
    """What every training run of a config shares: the data and the training settings."""
    train, manifest = run.train, run.manifest
    return {
        "dataset": manifest.dataset,
        "shards": len(manifest.shards),
        "model": train.model,
        "scaling": train.scaling,
        "epochs": train.epochs,
        "base_learning_rate": train.learning_rate,
    }


def log_training(
    tracker: Tracker, run_id: str, result: Any, params: dict[str, Any], said: Collection[str] = ()
) -> None:
    """A training's result in the run opened when it started: its fields, `params`, the
    epochs if they were not logged live (a cached result) and metrics.json. A tag whose
    words are among `said` (its parent's, as the study's `strategy_reason`) is not
    repeated."""
    tracker.log_result(run_id, result, said=said)
    tracker.log(run_id, params=params)
    if not tracker.client.get_metric_history(run_id, "loss"):
        tracker.log_history(run_id, result.history)
    log_evaluations(tracker, run_id, result)
    tracker.log_artifacts(run_id, [Path(result.run_dir) / METRICS])


def log_evaluations(tracker: Tracker, run_id: str, result: Any) -> None:
    """A training's held-out evaluations as the curve `heldout_accuracy_by_examples`
    (another target metric's: `heldout_auc_by_examples`; its step: the training examples
    seen), and its examples, steps and time to target where it reached it
    (`tasks.train.to_target`)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    curve = f"heldout_{result.to_target.get('metric', 'accuracy')}_by_examples"
    points = [
        Metric(curve, float(e["accuracy"]), now, int(e["examples"])) for e in result.evaluations
    ]
    points += _noise_points(result, now)
    target = result.to_target
    if target.get("reached"):
        reached = {"examples": "examples", "steps": "steps", "seconds": "time"}
        points += [
            Metric(
                f"{name}_to_target" + ("_s" if name == "time" else ""),
                rounded(float(target[key])),
                now,
                0,
            )
            for key, name in reached.items()
        ]
    tracker.log_batch(run_id, points, [], [])


def _noise_points(result: Any, now: int) -> list:
    """The gradient noise scale against step: `noise_scale` (of the raw gradient,
    averaged over the windows so far), `noise_scale_adam` (of the gradient as Adam
    preconditions it) and `noise_scale_window` (each window's own raw one: its spread
    around the average)."""
    from mlflow.entities import Metric

    from tfscale.tasks.measure.noise_trajectory import split_examples, trajectory

    path = trajectory(getattr(result, "gradient_noise", []), examples=split_examples(result))
    curves = {
        "noise_scale": path.averaged.get("raw", ()),
        "noise_scale_adam": path.averaged.get("adam", ()),
        "noise_scale_window": path.window.get("raw", ()),
    }
    return [
        Metric(name, rounded(value), now, step)
        for name, values in curves.items()
        for step, value in zip(path.end_steps, values, strict=True)
        if math.isfinite(value)
    ]


def log_study(tracker: Tracker, parent_id: str, record: StudyRecord) -> None:
    """Logs a whole study on its parent (its children were closed as their
    training ended): the summary, diagnosis, artifacts, and the registered model."""
    run = record.run
    common = study_params(run)
    _, distributed_params, _ = fields_by_type(record.distributed)
    tracker.log_result(parent_id, record.summary)
    # the diagnosis's figures; its words are the summary's bottleneck tags already
    shown = set(fields_by_type(record.summary)[2].values())
    tracker.log_result(parent_id, record.diagnosis, "diagnosis_", said=shown)
    tracker.log(
        parent_id,
        metrics={k: rounded(v) for k, v in record.forecast.items()},
        params={**common, **distributed_params},
    )
    files = [
        *(record.files[k] for k in ("speedup_chart", "confusion_matrix", "evaluation")
          if k in record.files),
        record.files["diagnosis"],
        *(path for key, path in record.files.items() if key.startswith("forecast")),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tfscale-artifacts-") as folder:  # none left
        written = [
            write_json_artifact(folder, "hardware.json", run.report.to_dict()),
            write_json_artifact(folder, "manifest.json", json.loads(run.manifest.to_json())),
            write_json_artifact(folder, "summary.json", record.summary.to_dict()),
        ]
        tracker.log_artifacts(parent_id, [*written, *files])
    feature = run.manifest.feature
    model_id = tracker.log_model(parent_id, record.distributed.model_path, feature)
    summary = record.summary
    # MLflow's names take no '/' or ':', which a user's data or model reference has
    registered = re.sub(r"[/:]+", "-", f"tfscale-{common['dataset']}-{common['model']}")
    tracker.register_model(
        registered,
        model_id,
        parent_id,
        {
            "speedup": rounded(summary.speedup),
            "scaling_efficiency": rounded(summary.scaling_efficiency),
            "test_accuracy": rounded(summary.test_accuracy),
            "strategy": summary.strategy,
            "replicas": summary.replicas,
        },
    )
    tracker.finish(parent_id)


def log_forecast(tracker: Tracker, forecast: Any, files: list[Path], source_run_dir: str) -> str:
    """A `forecast` run: the fitted constants and predictions as metrics, the links and
    scaling as params, forecast.json and the charts as artifacts. Returns its id."""
    from tfscale.tasks.report.forecast import forecast_metrics

    run_id = tracker.start_run("forecast", {"source_run_dir": str(source_run_dir)})
    params = {
        "scaling": forecast.scaling,
        **{f"link_{k}": v for k, v in forecast.links_gbit.items()},
    }
    tracker.log(run_id, metrics=forecast_metrics(forecast), params=params)
    tracker.log_artifacts(run_id, files)
    tracker.finish(run_id)
    return run_id


def log_plan(tracker: Tracker, plan: Any, path: Path) -> str:
    """A `plan` run: the fastest configuration's figures as metrics and its settings
    as params, where each figure came from as tags, plan.json as an artifact."""
    best = plan.fastest
    asdict = dataclasses.asdict
    run_id = tracker.start_run("plan", {"source_run_dir": plan.run_dir, "link": plan.link})
    tracker.log(
        run_id,
        metrics={
            k: rounded(float(v))
            for k, v in asdict(best).items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        | {"target_accuracy": plan.target},
        params={"devices": best.devices, "per_replica_batch": best.per_replica_batch},
        tags={f"source_{k.replace(' ', '_')}": v for k, v in plan.sources.items()},
    )
    tracker.log_artifacts(run_id, [path])
    tracker.finish(run_id)
    return run_id


def log_sweep(
    tracker: Tracker, parent_id: str, rows: list[Any], results: list[dict], files: dict[str, Path]
) -> None:
    """A child run per cell (each `SweepRow`'s fields by type, per-epoch metrics), then
    the table and charts on the parent."""
    for row, result in zip(rows, results, strict=True):
        child = tracker.start_run(row.run_name, {}, parent_id=parent_id)
        tracker.log_result(child, row)
        tracker.log_history(child, result["history"])
        tracker.finish(child)
    tracker.log(parent_id, metrics={"cells": len(rows)})
    tracker.log_artifacts(parent_id, list(files.values()))
    tracker.finish(parent_id)
