"""The scaling study as a Prefect flow (what `tfscale run` runs): prepare, detect, select,
baseline, distributed, evaluate, track. The flow only chains tasks; each task wraps a plain
function in `tasks/`.
"""

from __future__ import annotations

import dataclasses

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from tfscale.flows.caching import RESULTS, cached, reused
from tfscale.flows.prefect_api import named_by, quiet_run_logs
from tfscale.tasks.core import process
from tfscale.tasks.core.progress import status
from tfscale.tasks.core.user_code import model_fingerprint
from tfscale.tasks.data import preparation
from tfscale.tasks.distribute import hardware, strategy
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.execute import trainings
from tfscale.tasks.measure import autotune
from tfscale.tasks.report import summary
from tfscale.tasks.settings import config as config_mod
from tfscale.tasks.track import records, tracking
from tfscale.tasks.train import evaluation


@task(name="check tracking store")
def check_tracking_task(tracker: tracking.Tracker):
    tracker.check()


@task(name="prepare data", cache_policy=RESULTS, persist_result=True)
def _prepare_task(config: config_mod.Config, source: str = ""):
    """`source`: the user's data's fingerprint, in the cache key (a table edited in place
    is prepared again)."""
    return preparation.prepare_dataset(config, progress=False)


def prepare_task(config: config_mod.Config):
    """Prepare, reusing the cached result only while its shards are still on disk."""
    present = preparation.shards_reusable(config)  # their sha256 checked: a corrupted one named
    source = preparation.source_fingerprint(config.prepare)
    prepared = cached(_prepare_task, config, files_present=present)(config, source)
    status("prepare", preparation.prepared_line(prepared, reused=present))
    return prepared


@task(name="detect hardware")
def detect_task():
    report = hardware.detect_hardware()
    status("hardware", hardware.hardware_line(report))
    return report


@task(name="select strategy")
def select_task(report, config: config_mod.Config):
    choice = strategy.select_strategy(report, config.train)
    process.set_up_devices(choice.logical_cpus)
    status("proposed", f"{choice.kind}, {choice.shape}, {choice.precision}, from the hardware")
    return choice


@task(name="settle auto by measuring")
def settle_task(run: Run) -> Run:
    """What `auto` left open (precision, XLA) timed on the run's model and data; the
    strategy stays (the study measures the replicas against one device) unless the model
    does not fit a device's memory, when it is cut into pipeline stages. The `strategy` line
    is what trains, after the measured candidates (one page, one answer: the proposal's
    precision is not shown as the run's when `auto` kept another)."""
    proposed = run.choice.kind
    run, settled = trainings.settle_auto(run, for_study=True)
    choice = run.choice
    if settled.timed:
        status("auto", autotune.settled_line(settled))
    xla = "XLA on" if choice.jit_compile else "XLA off"
    over = " (over memory)" if choice.kind != proposed else ""  # cut into pipeline stages
    status("strategy", f"{choice.kind}, {choice.shape}, {choice.precision}, {xla}{over}")
    return run


@task(name="start tracking", retries=2, retry_delay_seconds=2)
def start_tracking_task(tracker: tracking.Tracker, name: str, tags: dict, choice):
    params = records.choice_params(choice)
    return tracker.start_run(name, tags, system_metrics=True, params=params)


@task(name="open child run", retries=2, retry_delay_seconds=2)
def start_child_task(tracker: tracking.Tracker, parent_id: str, name: str, tags: dict, choice):
    """A child run opened as its training starts, so MLflow shows its epochs live."""
    params = records.choice_params(choice)
    child = tracker.start_run(name, records.child_tags(tags), parent_id=parent_id, params=params)
    return tracking.EpochLog(tracker, child)


@task(name="train baseline (one device)", cache_policy=RESULTS, persist_result=True)
def _baseline_task(run: Run, on_epoch=None, model: str = ""):
    """`model`: the model's fingerprint, in the cache key (a user's model file changed is
    trained again)."""
    return trainings.run_training(run, on_epoch=on_epoch, label="baseline")


def baseline_task(run: Run, on_epoch=None):
    """The baseline, reusing the cached result only while its run directory is intact."""
    model = model_fingerprint(run.train.model)
    task_ = cached(_baseline_task, run.config, files_present=run.is_complete)
    state = task_(run, on_epoch, model, return_state=True)
    result = state.result()
    status("baseline", trainings.trained_line(result) + (" (reused)" if reused(state) else ""))
    return result


@task(name="train distributed and diagnose")
def distributed_task(run: Run, on_epoch=None):
    """The distributed run and its bottleneck diagnosis."""

    def trained(result) -> None:
        status("distributed", trainings.trained_line(result))

    result, diagnosis = trainings.train_and_diagnose(
        run, on_epoch=on_epoch, label="distributed", on_trained=trained
    )
    if diagnosis is not None:
        status("diagnosis", diagnosis.bottleneck)
    return result, diagnosis


@task(name="evaluate on the test split")
def evaluate_task(model_path: str, run: Run):
    result, _ = evaluation.recorded_or_evaluated(
        model_path, run.manifest, run.data_dir, run.config.evaluate.batch_size, run.train.model
    )
    status("evaluate", result.text())
    return result


@task(name="repeat to the target with more seeds")
def repeat_task(base: Run, run: Run) -> tuple[list[dict], list[dict]]:
    """Both trainings again with each further seed (`evaluate.seeds`), to the target only."""
    seeds = run.config.evaluate.seeds
    return (
        trainings.repeat_to_target(base, seeds, "baseline"),
        trainings.repeat_to_target(run, seeds, "distributed"),
    )


@task(name="summarize")
def summarize_task(run: Run, baseline, distributed, result, diagnosis, repeats):
    return summary.summarize_study(run, (baseline, distributed), result, diagnosis, repeats)


@task(name="close child run", retries=2, retry_delay_seconds=2)
def close_child_task(live: tracking.EpochLog, result, run: Run):
    said = frozenset({run.choice.reason})  # the parent's strategy_reason
    records.log_training(live.tracker, live.run_id, result, records.study_params(run), said)
    live.tracker.finish(live.run_id)


@task(name="track in MLflow", retries=2, retry_delay_seconds=2)
def track_task(tracker: tracking.Tracker, parent_id: str, record):
    records.log_study(tracker, parent_id, record)
    dataset = record.run.manifest.dataset
    # on the run's own page, a link relative to the UI showing it (any host, any port)
    table = ("the runs table", tracker.results_url(""))
    tracker.describe(parent_id, summary.format_markdown(record.summary, dataset, table))
    # elsewhere, the UI serving the store now (`tfscale ui` at any port), else its default
    this_run = ("this run", tracker.run_url(tracker.ui_base, parent_id))
    create_markdown_artifact(
        summary.format_markdown(record.summary, dataset, this_run),
        key="scaling-summary",
        description="speedup, scaling efficiency, accuracy and bottleneck of this run",
    )
    status("track", f"MLflow run {parent_id} in {tracker.uri}")


@task(name="mark the runs failed")
def fail_tracking_task(tracker: tracking.Tracker, parent_id: str, error: str, status: str):
    tracker.fail(parent_id, error, status)


@flow(
    name="tfscale-study",
    log_prints=True,
    flow_run_name=named_by(lambda parameters: config_mod.study_name(parameters["config"])),
)
def scaling_study(config: config_mod.Config) -> summary.ScalingSummary:
    """Prepare, detect, select, train baseline and distributed, evaluate, track."""
    return run_study(config)


def run_study(config: config_mod.Config) -> summary.ScalingSummary:
    """The study's tasks, in the flow run that calls it (`scaling_study`, or a deployment's
    own run: its page then shows every task and log line, none hidden in a subflow)."""
    with process.stops_noted():  # a stop Prefect's or a library's handling swallowed
        return _study(config)


def _study(config: config_mod.Config) -> summary.ScalingSummary:
    quiet_run_logs()
    tracker = tracking.Tracker.for_config(config.track)
    check_tracking_task(tracker)
    prepared = prepare_task(config)
    report = detect_task()
    choice = select_task(report, config)
    run = settle_task(Run(config, prepared.manifest, prepared.data_dir, choice, report))
    choice = run.choice
    tags = records.study_tags(run)
    parent_id = start_tracking_task(tracker, records.study_run_name(run), tags, choice)
    try:
        base = run.with_choice(strategy.baseline_choice(choice))
        live = start_child_task(tracker, parent_id, "baseline", tags, base.choice)
        baseline = baseline_task(base, live)
        close_child_task(live, baseline, run)
        live = start_child_task(tracker, parent_id, "distributed", tags, choice)
        distributed, diagnosis = distributed_task(run, live)
        close_child_task(live, distributed, run)
        result = evaluate_task(distributed.model_path, run)
        repeats = repeat_task(base, run)
        record = summarize_task(run, baseline, distributed, result, diagnosis, repeats)
        track_task(tracker, parent_id, record)
    except BaseException as exc:
        fail_tracking_task(tracker, parent_id, repr(exc), tracking.ended_as(exc))
        raise
    return dataclasses.replace(record.summary, mlflow_run_id=parent_id)
