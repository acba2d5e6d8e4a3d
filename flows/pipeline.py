"""The tfscale pipeline as a Prefect flow: prepare, detect, select, baseline, distributed,
evaluate, track. The flow only chains tasks; each task wraps a plain function in `tasks/`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from tasks import config as config_mod
from tasks import (
    evaluation,
    hardware,
    preparation,
    process,
    runs,
    strategy,
    summary,
    tracking,
)
from tasks.manifest import shards_present
from tasks.progress import stage


def _key(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_dir(config: config_mod.Config) -> Path:
    """Where this project's cached task results live: beside the runs they point at (not
    in Prefect's home directory, where another checkout's results could be reused)."""
    return Path(config.train.runs_dir).resolve() / ".prefect-results"


def cached(task_: Any, config: config_mod.Config, files_present: bool) -> Any:
    """`task_` reading and writing the project's cache; a cached result whose files are
    gone (`files_present` false) is computed again and replaces the cached one."""
    return task_.with_options(result_storage=cache_dir(config), refresh_cache=not files_present)


def prepare_cache_key(context: Any, parameters: dict) -> str:
    """The prepare config: unchanged parameters reuse the result while the shards are there
    (`prepare` below refreshes it when they are not)."""
    config = parameters["config"]
    return _key(
        "prepare",
        config_mod.config_to_dict(config.prepare),
        config.min_shards,
        str(preparation.dataset_dir(config).resolve()),
    )


def baseline_cache_key(context: Any, parameters: dict) -> str:
    """Config + data manifest hash + hardware fingerprint + the baseline strategy, and the
    run directory the result points at."""
    config, manifest, choice = parameters["config"], parameters["manifest"], parameters["choice"]
    return _key(
        "baseline",
        config_mod.config_to_dict(config.train),
        manifest.digest,
        parameters["report"].fingerprint,
        choice.to_dict(),
        str(runs.run_dir_for(config, manifest, choice).resolve()),
    )


@task(name="check tracking store")
def check_tracking_task(tracker: tracking.Tracker):
    tracker.check_reachable()


@task(name="prepare data", cache_key_fn=prepare_cache_key, persist_result=True)
def _prepare_task(config: config_mod.Config):
    return preparation.prepare_dataset(config, progress=False)


def prepare_task(config: config_mod.Config):
    """Prepare, reusing the cached result only while its shards are still on disk."""
    present = shards_present(preparation.dataset_dir(config))
    prepared = cached(_prepare_task, config, present)(config)
    stage("prepare", preparation.format_line(prepared, reused=present))
    return prepared


@task(name="detect hardware")
def detect_task():
    report = hardware.detect_hardware()
    stage("hardware", hardware.format_line(report))
    return report


@task(name="select strategy")
def select_task(report, config: config_mod.Config):
    choice = strategy.select_strategy(report, config.train)
    process.set_up_devices(choice.logical_cpus)
    stage("strategy", f"{choice.kind}, {choice.replicas} replicas, {choice.precision}")
    return choice


@task(name="start tracking", retries=2, retry_delay_seconds=2)
def start_tracking_task(tracker: tracking.Tracker, name: str, tags: dict):
    return tracker.start_run(name, tags, system_metrics=True)


@task(name="open child run", retries=2, retry_delay_seconds=2)
def start_child_task(tracker: tracking.Tracker, parent_id: str, name: str, tags: dict):
    """A child run opened as its training starts, so MLflow shows its epochs live."""
    return tracking.EpochLog(tracker, tracker.start_run(name, tags, parent_id=parent_id))


@task(name="train baseline (one device)", cache_key_fn=baseline_cache_key, persist_result=True)
def _baseline_task(config, manifest, data_dir, choice, report, on_epoch=None):
    return runs.run_training(
        config, manifest, data_dir, choice, report, on_epoch=on_epoch, label="baseline"
    )


def baseline_task(config, manifest, data_dir, choice, report, on_epoch=None):
    """The baseline, reusing the cached result only while its run directory is intact."""
    complete = runs.is_complete(config, manifest, choice)
    result = cached(_baseline_task, config, complete)(
        config, manifest, data_dir, choice, report, on_epoch
    )
    stage("baseline", runs.format_line(result) + ("" if not complete else " (reused)"))
    return result


@task(name="train distributed and diagnose")
def distributed_task(config, manifest, data_dir, choice, report, on_epoch=None):
    """The distributed run and its bottleneck diagnosis."""
    result, diagnosis = runs.train_and_diagnose(
        config, manifest, data_dir, choice, report, on_epoch=on_epoch, label="distributed"
    )
    stage("distributed", runs.format_line(result))
    if diagnosis is not None:
        stage("diagnosis", diagnosis.bottleneck)
    return result, diagnosis


@task(name="evaluate on the test split")
def evaluate_task(model_path: str, manifest, data_dir: str, config):
    result = evaluation.evaluate_model(model_path, manifest, data_dir, config.evaluate.batch_size)
    stage("evaluate", f"test accuracy {result.test_accuracy:.4f} (loss {result.test_loss:.4f})")
    return result


@task(name="summarize")
def summarize_task(context, baseline, distributed, result, diagnosis, config, manifest):
    return summary.summarize_pipeline(
        context,
        baseline,
        distributed,
        result,
        diagnosis,
        config.train.scaling,
        config.evaluate.target_accuracy,
        manifest.feature["class_names"],
    )


@task(name="close child run", retries=2, retry_delay_seconds=2)
def close_child_task(live: tracking.EpochLog, result, context: dict):
    live.tracker.log_training(live.run_id, result, tracking.pipeline_params(context))
    live.tracker.finish(live.run_id)


@task(name="track in MLflow", retries=2, retry_delay_seconds=2)
def track_task(tracker: tracking.Tracker, parent_id: str, record):
    tracker.log_pipeline(parent_id, record)
    url = tracker.run_url(tracker.ui_base, parent_id)
    create_markdown_artifact(
        summary.format_markdown(record.summary, record.context["manifest"]["dataset"], url),
        key="scaling-summary",
        description="speedup, scaling efficiency, accuracy and bottleneck of this run",
    )
    stage("track", f"MLflow run {parent_id} in {tracker.uri}")


@task(name="mark the runs failed")
def fail_tracking_task(tracker: tracking.Tracker, parent_id: str, error: str):
    tracker.fail(parent_id, error)


@flow(name="tfscale-pipeline", log_prints=True)
def pipeline(config: config_mod.Config) -> summary.ScalingSummary:
    """Prepare, detect, select, train baseline and distributed, evaluate, track."""
    tracker = tracking.Tracker.for_config(config.track)
    check_tracking_task(tracker)
    prepared = prepare_task(config)
    manifest, data_dir = prepared.manifest, prepared.data_dir
    report = detect_task()
    choice = select_task(report, config)
    context = summary.pipeline_record(config, report, choice, manifest)
    tags = tracking.pipeline_tags(context)
    name = f"{manifest.dataset}-{choice.kind}-{choice.replicas}x"
    parent_id = start_tracking_task(tracker, name, tags)
    try:
        live = start_child_task(tracker, parent_id, "baseline", tags)
        baseline_choice = strategy.baseline_choice(choice)
        baseline = baseline_task(config, manifest, data_dir, baseline_choice, report, live)
        close_child_task(live, baseline, context)
        live = start_child_task(tracker, parent_id, "distributed", tags)
        distributed, diagnosis = distributed_task(config, manifest, data_dir, choice, report, live)
        close_child_task(live, distributed, context)
        result = evaluate_task(distributed.model_path, manifest, data_dir, config)
        record = summarize_task(context, baseline, distributed, result, diagnosis, config, manifest)
        track_task(tracker, parent_id, record)
    except BaseException as exc:
        fail_tracking_task(tracker, parent_id, repr(exc))
        raise
    return record.summary
