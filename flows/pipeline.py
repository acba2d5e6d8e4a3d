"""The tfscale pipeline as a Prefect flow: prepare, detect, select, baseline, distributed,
evaluate, track. The flow only chains tasks; each task wraps a plain function in `tasks/`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from prefect import flow, task  # noqa: E402

from tasks import config as config_mod  # noqa: E402
from tasks import (  # noqa: E402
    evaluation,
    hardware,
    preparation,
    probes,
    runs,
    scaling,
    strategy,
    tracking,
)
from tasks.manifest import shards_present  # noqa: E402


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
def check_tracking_task():
    tracking.check_reachable()


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
    if choice.kind == "mirrored" and choice.devices == "cpu":
        strategy.ensure_logical_cpus(choice.replicas)
    return choice


@task(name="start-tracking", retries=2, retry_delay_seconds=2)
def start_tracking_task(name: str, tags: dict):
    return tracking.start_parent_run(name, tags)


@task(name="train-baseline", cache_key_fn=baseline_cache_key, persist_result=True)
def _baseline_task(config, manifest, data_dir, choice, report):
    return runs.run_training(config, manifest, data_dir, choice, report)


def baseline_task(config, manifest, data_dir, choice, report):
    """The baseline, reusing the cached result only while its run directory is intact."""
    complete = runs.is_complete(config, manifest, choice)
    return cached(_baseline_task, config, complete)(config, manifest, data_dir, choice, report)


@task(name="train-distributed")
def distributed_task(config, manifest, data_dir, choice, report):
    return runs.run_training(config, manifest, data_dir, choice, report)


@task(name="diagnose")
def diagnose_task(config, manifest, data_dir, choice, report, distributed):
    return probes.diagnose_run(
        config.train,
        manifest,
        data_dir,
        choice,
        report.cpu_flags,
        end_to_end=distributed.examples_per_s,
    )


@task(name="evaluate")
def evaluate_task(model_path: str, manifest, data_dir: str, config):
    return evaluation.evaluate_model(model_path, manifest, data_dir, config.evaluate.batch_size)


@task(name="summarize")
def summarize_task(record, baseline, distributed, result, diagnosis, config, manifest):
    return scaling.summarize_pipeline(
        record,
        baseline,
        distributed,
        result,
        diagnosis,
        config.train.scaling,
        config.evaluate.target_accuracy,
        manifest.feature["class_names"],
    )


@task(name="track", retries=2, retry_delay_seconds=2)
def track_task(parent_id: str, record: dict, files: dict):
    tracking.log_pipeline(parent_id, record, files)


@task(name="fail-tracking")
def fail_tracking_task(parent_id: str, error: str):
    tracking.finish_parent_run(parent_id, {}, tags={"error": error[:4000]}, status="FAILED")


@flow(name="tfscale-pipeline", log_prints=True)
def pipeline(config: config_mod.Config) -> scaling.ScalingSummary:
    """Prepare, detect, select, train baseline and distributed, evaluate, track."""
    check_tracking_task()
    prepared = prepare_task(config)
    manifest, data_dir = prepared.manifest, prepared.data_dir
    report = detect_task()
    choice = select_task(report, config)
    record = scaling.pipeline_record(config, report, choice, manifest)
    parent_id = start_tracking_task(
        f"{manifest.dataset}-{choice.kind}-{choice.replicas}x", tracking.pipeline_tags(record)
    )
    try:
        baseline = baseline_task(
            config, manifest, data_dir, strategy.baseline_choice(choice), report
        )
        distributed = distributed_task(config, manifest, data_dir, choice, report)
        diagnosis = diagnose_task(config, manifest, data_dir, choice, report, distributed)
        result = evaluate_task(distributed.model_path, manifest, data_dir, config)
        summary, record, files = summarize_task(
            record, baseline, distributed, result, diagnosis, config, manifest
        )
    except BaseException as exc:
        fail_tracking_task(parent_id, repr(exc))
        raise
    track_task(parent_id, record, files)
    return summary
