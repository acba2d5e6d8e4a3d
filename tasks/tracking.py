"""Everything MLflow: the only module that talks to the tracking server.

Per pipeline run: a parent run with child runs `baseline` and `distributed`; params, tags,
per-epoch metrics (batched), summary metrics (speedup, scaling efficiency, time to
accuracy, test results), artifacts and system metrics.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

EXPERIMENT = "tfscale"
STORE_DIR = Path("mlflow")
_monitors: dict[str, Any] = {}


class TrackingError(RuntimeError):
    """The tracking server cannot be reached or refused what was logged."""


def tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI`, or the embedded SQLite store under `mlflow/`."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{STORE_DIR.resolve()}/mlflow.db"


def artifact_root() -> str:
    return (STORE_DIR / "artifacts").resolve().as_uri()


def check_reachable(uri: str | None = None, attempts: int = 3, backoff_s: float = 1.0) -> None:
    """Fails fast, after a few retries, when a remote tracking server does not answer.

    Raises:
        TrackingError: naming the URI and how to fix it.
    """
    uri = uri or tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return
    import requests

    for attempt in range(attempts):
        try:
            requests.get(uri.rstrip("/") + "/health", timeout=5).raise_for_status()
            return
        except requests.RequestException as exc:
            error = exc
            time.sleep(backoff_s * 2**attempt)
    raise TrackingError(
        f"MLflow tracking server {uri} is unreachable after {attempts} attempts ({error}). "
        f"Start it, or unset MLFLOW_TRACKING_URI to use the embedded store under mlflow/."
    )


def _client():
    return _client_for(tracking_uri())


@functools.lru_cache(maxsize=4)
def _client_for(uri: str):
    from mlflow import MlflowClient

    if uri.startswith("sqlite:///"):
        STORE_DIR.mkdir(exist_ok=True)
    check_reachable(uri)
    client = MlflowClient(uri)
    if client.get_experiment_by_name(EXPERIMENT) is None:
        local = uri.startswith("sqlite:///")
        client.create_experiment(EXPERIMENT, artifact_location=artifact_root() if local else None)
    return client


def start_parent_run(name: str, tags: dict[str, str]) -> str:
    """Opens the parent run (with system metrics sampled until it ends); returns its id."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    client = _client()
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    run = client.create_run(experiment, run_name=name, tags=tags)
    monitor = SystemMetricsMonitor(
        run.info.run_id, sampling_interval=2, tracking_uri=tracking_uri()
    )
    monitor.start()
    _monitors[run.info.run_id] = monitor
    return run.info.run_id


def log_child(
    parent_id: str,
    name: str,
    params: dict,
    history: list[dict],
    tags: dict,
    artifacts: list[Path] = (),
    model_path: str | None = None,
) -> str:
    """A child run with its params, per-epoch metrics (one batch call) and artifacts."""
    from mlflow.entities import Metric, Param

    client = _client()
    parent = client.get_run(parent_id)
    run = client.create_run(
        parent.info.experiment_id, run_name=name, tags={"mlflow.parentRunId": parent_id, **tags}
    )
    now = int(time.time() * 1000)
    metrics = [
        Metric(key, float(h[key]), now, int(h["epoch"]))
        for h in history
        for key in ("loss", "accuracy", "examples_per_s", "seconds")
    ]
    params_list = [Param(k, str(v)) for k, v in params.items()]
    for start in range(0, max(len(metrics), 1), 900):
        client.log_batch(
            run.info.run_id,
            metrics=metrics[start : start + 900],
            params=params_list if start == 0 else [],
        )
    for path in artifacts:
        client.log_artifact(run.info.run_id, str(path))
    if model_path:
        _log_model(run.info.run_id, model_path)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def finish_parent_run(
    parent_id: str,
    metrics: dict[str, float],
    artifacts: list[Path] = (),
    tags: dict[str, str] | None = None,
    params: dict | None = None,
    status: str = "FINISHED",
) -> None:
    """Logs the summary on the parent run, stops its system metrics and closes it."""
    from mlflow.entities import Metric, Param, RunTag

    client = _client()
    now = int(time.time() * 1000)
    client.log_batch(
        parent_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None],
        params=[Param(k, str(v)) for k, v in (params or {}).items()],
        tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
    )
    for path in artifacts:
        client.log_artifact(parent_id, str(path))
    monitor = _monitors.pop(parent_id, None)
    if monitor is not None:
        monitor.finish()
    client.set_terminated(parent_id, status=status)


def write_json_artifact(name: str, value: Any) -> Path:
    path = Path(tempfile.mkdtemp(prefix="tfscale-")) / name
    path.write_text(json.dumps(value, indent=2, default=str))
    return path


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _model_requirements() -> list[str]:
    """What loading the model needs, pinned to what trained it. Given rather than inferred:
    MLflow's inference reloads the model in a subprocess, about 10 s per run."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("tensorflow", "keras", "mlflow")]


def _log_model(run_id: str, model_path: str) -> None:
    import keras

    import mlflow
    from tasks.steps import WarmupSchedule

    model = keras.models.load_model(
        model_path, compile=False, custom_objects={"WarmupSchedule": WarmupSchedule}
    )
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri())  # the fluent API below needs it; it sets the env
    try:
        with mlflow.start_run(run_id=run_id):
            mlflow.keras.log_model(model, name="model", pip_requirements=_model_requirements())
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous


def pipeline_tags(record: dict[str, Any]) -> dict[str, str]:
    """Hardware fingerprint, the strategy decision and its reason, git commit, manifest hash."""
    return {
        "hardware_fingerprint": record["hardware_fingerprint"],
        "strategy": record["choice"]["kind"],
        "strategy_reason": record["choice"]["reason"],
        "precision": record["choice"]["precision"],
        "git_commit": git_commit(),
        "manifest_hash": record["manifest_digest"],
    }


def log_pipeline(parent_id: str, record: dict[str, Any], files: dict[str, Path]) -> None:
    """Logs a whole pipeline run: both children, then the summary on the parent.

    Args:
        parent_id: from `start_parent_run`.
        record: `config`, `hardware`, `choice`, `manifest`, `baseline`, `distributed`,
            `evaluation` and `summary`, each a JSON-ready dict.
        files: `speedup_chart`, `confusion_matrix`, `evaluation`, `baseline_metrics`,
            `distributed_metrics` paths on disk.
    """
    config, manifest = record["config"], record["manifest"]
    tags = pipeline_tags(record)
    common = {
        "dataset": manifest["dataset"],
        "shards": len(manifest["shards"]),
        "model": config["train"]["model"],
        "scaling": config["train"]["scaling"],
        "epochs": config["train"]["epochs"],
        "base_learning_rate": config["train"]["learning_rate"],
    }
    params = {}
    for name in ("baseline", "distributed"):
        result = record[name]
        params = dict(
            common,
            **{
                k: result[k]
                for k in (
                    "strategy",
                    "replicas",
                    "workers",
                    "precision",
                    "per_replica_batch",
                    "global_batch",
                    "learning_rate",
                    "grad_accum_steps",
                )
            },
        )
        log_child(
            parent_id,
            name,
            params,
            result["history"],
            tags,
            artifacts=[files[f"{name}_metrics"]],
            model_path=result["model_path"] if name == "distributed" else None,
        )
    summary = record["summary"]
    metrics = {
        k: summary[k]
        for k in (
            "speedup",
            "scaling_efficiency",
            "test_accuracy",
            "test_loss",
            "baseline_examples_per_s",
            "distributed_examples_per_s",
        )
    }
    diagnosis = record["diagnosis"]
    for key in (
        "input_examples_per_s",
        "compute_examples_per_s",
        "end_to_end_examples_per_s",
        "compute_1_replica_examples_per_s",
        "step_seconds",
    ):
        metrics[f"diagnosis_{key}"] = diagnosis[key]
    tags["bottleneck"] = diagnosis["bottleneck"]
    metrics["time_to_accuracy_s_baseline"] = summary["baseline_time_to_accuracy_s"]
    metrics["time_to_accuracy_s_distributed"] = summary["distributed_time_to_accuracy_s"]
    artifacts = [
        write_json_artifact("hardware.json", record["hardware"]),
        write_json_artifact("manifest.json", manifest),
        write_json_artifact("summary.json", summary),
        files["speedup_chart"],
        files["confusion_matrix"],
        files["evaluation"],
        files["diagnosis"],
    ]
    finish_parent_run(parent_id, metrics, artifacts, tags, params)


def log_sweep(parent_id: str, rows: list[dict], results: list[dict], files: dict[str, Path]):
    """A child run per cell (params, per-epoch metrics, speedup), then the table and charts."""
    from mlflow.entities import Metric

    client = _client()
    for row, result in zip(rows, results, strict=True):
        params = {
            k: row[k] for k in ("size", "batch", "scaling", "precision", "replicas", "strategy")
        }
        child = log_child(
            parent_id,
            f"cell-{row['size']}-b{row['batch']}-r{row['replicas']}",
            params,
            result["history"],
            {"bottleneck": row["bottleneck"]},
        )
        now = int(time.time() * 1000)
        client.log_batch(
            child,
            metrics=[
                Metric(k, float(row[k]), now, 0)
                for k in ("examples_per_s", "speedup", "efficiency")
            ],
        )
    finish_parent_run(
        parent_id,
        {"cells": len(rows)},
        [files[k] for k in ("table", "json", "speedup", "efficiency")],
    )
