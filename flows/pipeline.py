"""The tfscale pipeline as a Prefect flow: prepare, detect, select, baseline, distributed,
evaluate, track. The flow only chains tasks; each task wraps a plain function in `tasks/`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from prefect import flow, task

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


@task(name="check-tracking")
def check_tracking_task(tracker: tracking.Tracker):
    tracker.check_reachable()


@task(name="prepare", cache_key_fn=prepare_cache_key, persist_result=True)
def _prepare_task(config: config_mod.Config):
    return preparation.prepare_dataset(config, progress=False)


def prepare_task(config: config_mod.Config):
    """Prepare, reusing the cached result only while its shards are still on disk."""
    present = shards_present(preparation.dataset_dir(config))
    return cached(_prepare_task, config, present)(config)


@task(name="detect-hardware")
def detect_task():
    return hardware.detect_hardware()


@task(name="select-strategy")
def select_task(report, config: config_mod.Config):
    choice = strategy.select_strategy(report, config.train)
    process.set_up_devices(choice.logical_cpus)
    return choice


@task(name="start-tracking", retries=2, retry_delay_seconds=2)
def start_tracking_task(tracker: tracking.Tracker, name: str, tags: dict):
    return tracker.start_run(name, tags, system_metrics=True)


@task(name="train-baseline", cache_key_fn=baseline_cache_key, persist_result=True)
def _baseline_task(config, manifest, data_dir, choice, report):
    return runs.run_training(config, manifest, data_dir, choice, report)


def baseline_task(config, manifest, data_dir, choice, report):
    """The baseline, reusing the cached result only while its run directory is intact."""
    complete = runs.is_complete(config, manifest, choice)
    return cached(_baseline_task, config, complete)(config, manifest, data_dir, choice, report)


@task(name="train-distributed")
def distributed_task(config, manifest, data_dir, choice, report):
    """The distributed run and its bottleneck diagnosis."""
    return runs.train_and_diagnose(config, manifest, data_dir, choice, report)


@task(name="evaluate")
def evaluate_task(model_path: str, manifest, data_dir: str, config):
    return evaluation.evaluate_model(model_path, manifest, data_dir, config.evaluate.batch_size)


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


@task(name="track", retries=2, retry_delay_seconds=2)
def track_task(tracker: tracking.Tracker, parent_id: str, record: summary.PipelineRecord):
    tracker.log_pipeline(parent_id, record)


@task(name="fail-tracking")
def fail_tracking_task(tracker: tracking.Tracker, parent_id: str, error: str):
    tracker.log(parent_id, tags={"error": error[:4000]})
    tracker.finish(parent_id, status="FAILED")


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
    parent_id = start_tracking_task(
        tracker,
        f"{manifest.dataset}-{choice.kind}-{choice.replicas}x",
        tracking.pipeline_tags(context),
    )
    try:
        baseline = baseline_task(
            config, manifest, data_dir, strategy.baseline_choice(choice), report
        )
        distributed, diagnosis = distributed_task(config, manifest, data_dir, choice, report)
        result = evaluate_task(distributed.model_path, manifest, data_dir, config)
        record = summarize_task(context, baseline, distributed, result, diagnosis, config, manifest)
    except BaseException as exc:
        fail_tracking_task(tracker, parent_id, repr(exc))
        raise
    track_task(tracker, parent_id, record)
    return record.summary
