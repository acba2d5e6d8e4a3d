"""A training run end to end: where it executes, what is measured after it, and its outputs.

`Run.run_dir` (`runs/<dataset>/<strategy>-<replicas>x-<precision>-<key>/`) holds
checkpoints, `history.json`, `model.keras` and `metrics.json`; `runs/<dataset>/latest.json`
points at the newest completed run. A run with the same key that did not complete resumes
from its last checkpoint.

Training trains (`tasks.train.training`); measuring is the step after it, in the processes that
trained (`train_and_probe`): a worker process, the coordinator of a parameter-server
cluster, a cluster task, or this process for a run on its own devices (`tasks.measure.diagnosis`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.core.files import write_json_atomic
from tfscale.tasks.core.progress import EpochWatcher, epoch_score, status
from tfscale.tasks.core.run_layout import METRICS
from tfscale.tasks.core.run_lock import hold
from tfscale.tasks.core.user_code import model_fingerprint
from tfscale.tasks.distribute.run import Role, Run
from tfscale.tasks.execute.run_files import write_metrics
from tfscale.tasks.measure.autotune import Settled, settle
from tfscale.tasks.measure.diagnosis import (
    Diagnosis,
    diagnose_in_place,
    diagnose_run,
    format_diagnosis,
)
from tfscale.tasks.measure.in_place import InPlaceProbes, probe_in_place
from tfscale.tasks.settings.kinds import COORDINATOR, LOCAL_WORKERS
from tfscale.tasks.train.result import TrainResult, timed_epochs
from tfscale.tasks.train.to_target import ToTarget
from tfscale.tasks.train.training import train_model
from tfscale.tasks.train.user_models import (
    ModelError,
    check_user_model,
    is_user_model,
    precision_failure,
)


def train_and_probe(run: Run, probe_steps: int = 0, resolver: Any = None) -> TrainResult:
    """Trains `run`, then, with `probe_steps`, measures its steps in place on the strategy
    and model it trained (`tasks.measure.in_place`): every process of a multi-process run calls this
    with the same `probe_steps`, since the probes are collectives."""
    trained = train_model(run, resolver=resolver)
    if not probe_steps:
        return trained.result
    probes = probe_in_place(trained.setup, run, probe_steps)
    return dataclasses.replace(trained.result, probes=probes.to_dict())


def run_training(
    run: Run,
    probe_steps: int = 0,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    label: str = "",
    *,
    epoch_lines: bool = False,
    written: bool = True,
) -> TrainResult:
    """Trains where the choice says: in this process, N local workers, a local PS cluster,
    or, when a cluster manager described a cluster, as this task's role in it (chief or
    training worker; `tasks.distribute.cluster`). With `probe_steps` the processes that trained then
    measure its steps in place (`train_and_probe`). Each epoch, as the chief writes it, goes
    to the progress display (`label`; off a terminal, with `epoch_lines`, a line each) and
    to `on_epoch`. The chief writes `metrics.json`, the mark of a finished run, unless the
    caller writes it (`written` false: `train_and_diagnose`, once its probes are in)."""
    _check_link(run)
    _check_model(run)  # before any worker starts or any file is written
    run_dir = run.run_dir
    chief = run.writes_outputs
    with hold(run_dir) if chief else contextlib.nullcontext():  # a cluster's tasks share it
        if chief and (run_dir / METRICS).exists():  # completed before: train afresh
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        watch = EpochWatcher(
            run_dir, run.train.epochs, label or run.choice.kind, on_epoch, lines=epoch_lines
        )
        with watch if chief else contextlib.nullcontext():
            result = _train_where_chosen(run, probe_steps)
        if chief and written:
            write_metrics(result, run)
    return result


_checked: set[tuple] = set()  # the user's models checked: on which data, trained how


def _check_model(run: Run) -> None:
    """A user's model, checked against the run's data and target once per process
    (`tasks.train.user_models.check_user_model`)."""
    ref = run.train.model
    if not is_user_model(ref):
        return
    key = (
        ref, model_fingerprint(ref), run.manifest.digest, repr(run.config.evaluate),
        run.train.grad_accum_steps, run.choice.kind,
    )  # fmt: skip
    if key not in _checked:
        check_user_model(
            ref, run.manifest, run.data_dir, run.config.evaluate, (run.train, run.choice)
        )
        _checked.add(key)


def _check_link(run: Run) -> None:
    """An emulated link joins local worker processes; one device (a baseline) has no link
    to emulate, and any other run of several replicas cannot have one.

    Raises:
        UsageError: `train.link_gbit` set for a run of several replicas that is not local
            workers, or for a cluster task.
    """
    link, choice, cluster = run.train.link_gbit, run.choice, run.report.cluster
    several = choice.replicas > 1 or choice.workers > 1
    other = cluster is not None or choice.spec.runs != LOCAL_WORKERS
    if link is not None and several and other:
        where = " in a cluster" if cluster is not None else ""
        raise UsageError(
            f"train.link_gbit ({link:g}) emulates the links between local worker processes, "
            f"and this run is {choice.kind}{where}",
            "use --strategy multi_worker --workers 2 (or more), or set train.link_gbit: null.",
        )


def _train_where_chosen(run: Run, probe_steps: int) -> TrainResult:
    if run.report.cluster is not None:
        return _train_as_task(run, probe_steps)
    if run.choice.spec.runs == LOCAL_WORKERS:
        return _train_local_workers(run, probe_steps)
    if run.choice.spec.runs == COORDINATOR:
        from tfscale.tasks.distribute.ps_cluster import in_process_cluster

        with in_process_cluster(run.choice.workers) as resolver:
            return train_and_probe(run, probe_steps, resolver)
    return train_model(run).result


def _train_as_task(run: Run, probe_steps: int = 0) -> TrainResult:
    """This task's part of a cluster's training: preemptible, and a lost peer is named."""
    from tfscale.tasks.distribute.cluster import lost_task

    cluster = run.report.cluster
    run = run.with_role(Role(chief=cluster.is_chief, preemptible=True))
    try:
        result = train_and_probe(run, probe_steps)
    except Exception as exc:
        lost = lost_task(exc, cluster, f"it resumes from the last checkpoint in {run.run_dir}")
        if lost is None:
            raise
        raise lost from exc
    task_file = f"task-{cluster.task_type}-{cluster.task_index}.json"
    write_json_atomic(run.run_dir / task_file, result.to_dict())  # each task's own figures
    return result


def evaluate_as_sidecar(run: Run) -> list[dict[str, float]]:
    """The evaluator task: each new checkpoint of the chief's run, evaluated on the test
    split as it appears (`evaluator.json` in the run directory)."""
    from tfscale.tasks.core.process import use_precision
    from tfscale.tasks.distribute.cluster import evaluate_checkpoints
    from tfscale.tasks.train.evaluation import evaluate_keras_model
    from tfscale.tasks.train.models import model_for_data

    use_precision(run.choice.precision)
    manifest = run.manifest

    def evaluate(model) -> dict[str, float]:
        result = evaluate_keras_model(model, manifest, run.data_dir, run.config.evaluate.batch_size)
        return {"test_loss": result.test_loss, "test_accuracy": result.test_accuracy}

    cluster = run.report.cluster
    ps_tasks = len(cluster.ps) if cluster else 0
    return evaluate_checkpoints(
        lambda: model_for_data(run.train.model, manifest.spec, ps_tasks).model,
        evaluate,
        run.run_dir,
        run.config.cluster.chief_wait_s,
    )


def settle_auto(run: Run, *, for_study: bool = False) -> tuple[Run, Settled]:
    """`run` with what its config left to `auto` chosen by measuring the candidates on its
    own model and data (`tasks.measure.autotune`), or as proposed when there is one candidate."""
    from tfscale.tasks.measure.probes import time_candidates
    from tfscale.tasks.train.stage_plan import fit_to_memory

    _check_model(run)  # before anything is measured
    run = _precision_that_runs(run)
    if run.report.cluster is None:  # a model too large for a device: pipeline stages
        run = run.with_choice(fit_to_memory(run.choice, run.train, run.manifest))

    def measure(options: list) -> list:
        return time_candidates(run, options)

    settled = settle(run.choice, run.train, run.report, run.manifest, measure, for_study=for_study)
    return run.with_choice(settled.choice).with_train(settled.train), settled


def _precision_that_runs(run: Run) -> Run:
    """`run`, its user's model checked under its mixed precision: `auto`'s proposal that
    fails is dropped for float32, said in a line; one asked for is refused.

    Raises:
        ModelError: the model fails under the precision `--precision` asks for.
    """
    choice, ref = run.choice, run.train.model
    if choice.precision == "float32" or not is_user_model(ref):
        return run
    failure = precision_failure(ref, run.manifest, run.data_dir, choice.precision)
    if failure is None:
        return run
    if run.train.precision != "auto":
        raise ModelError(
            f"--model {ref} fails under --precision {choice.precision}: {failure}",
            "use --precision float32, or cast in that layer (x * ops.cast(c, x.dtype))",
        )
    status("auto", f"{choice.precision} dropped: {failure}")
    reason = f"float32 because the model fails under {choice.precision} ({failure})"
    kept = [part for part in choice.reason.split("; ") if choice.precision not in part]
    return run.with_choice(
        dataclasses.replace(choice, precision="float32", reason="; ".join([*kept, reason]))
    )


def train_and_diagnose(
    run: Run,
    probe_steps: int | None = None,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    label: str = "",
    *,
    epoch_lines: bool = False,
    on_trained: Callable[[TrainResult], None] | None = None,
) -> tuple[TrainResult, Diagnosis | None]:
    """A training run, then its bottleneck diagnosis on the same model, batch and devices,
    written beside it (`diagnosis.txt`, `diagnosis.json`). `probe_steps` is the most steps
    a block of its rounds (None: `train.measure_steps`, as `tfscale run` measures); 0 skips the
    diagnosis; a task of a cluster that is not its chief takes part in the probes and
    leaves the diagnosis to the chief.

    A run across processes (local workers, a parameter-server cluster, any cluster task)
    is probed in place by the processes that trained; a run in this process, here.
    """
    cluster, choice = run.report.cluster, run.choice
    if probe_steps is None:
        probe_steps = run.train.measure_steps
    in_place = cluster is not None or not choice.spec.runs_here
    with hold(run.run_dir) if run.writes_outputs else contextlib.nullcontext():
        result = run_training(
            run, probe_steps if in_place else 0, on_epoch, label, epoch_lines=epoch_lines,
            written=False,
        )  # fmt: skip
        if on_trained is not None:  # its line before the diagnosis's rounds begin
            on_trained(result)
        diagnosis = None
        if probe_steps and (cluster is None or cluster.is_chief):
            result, diagnosis = _diagnosed(run, result, probe_steps, in_place)
        if run.writes_outputs:  # once, with what a forecast of it fits
            write_metrics(result, run)
        return result, diagnosis


def _diagnosed(
    run: Run, result: TrainResult, probe_steps: int, in_place: bool
) -> tuple[TrainResult, Diagnosis]:
    """The trained run's diagnosis, written beside it, and the result with the probes a
    forecast fits (`tfscale forecast`) where the diagnosis measured them here."""
    cpu_flags = run.report.cpu_flags
    if in_place:
        diagnosis = diagnose_in_place(
            InPlaceProbes(**result.probes), run.train, run.manifest, run.choice, cpu_flags
        )
    else:
        diagnosis = diagnose_run(run, steps=probe_steps)
        if diagnosis.cost_probes:
            result = dataclasses.replace(result, probes=diagnosis.cost_probes)
    run_dir = Path(result.run_dir)
    (run_dir / "diagnosis.txt").write_text(format_diagnosis(diagnosis) + "\n")
    write_json_atomic(run_dir / "diagnosis.json", diagnosis.to_dict())
    return result, diagnosis


def repeat_to_target(run: Run, seeds: int, label: str) -> list[dict[str, Any]]:
    """`run`'s time to target again with each of the `seeds - 1` seeds after its own, each
    training ending at the target (`train.stop_at_target`), unmeasured: their `to_target`
    records, as MLPerf Training repeats a run to give its time with the spread of seeds."""
    records = []
    for seed in range(run.train.seed + 1, run.train.seed + seeds):
        train = dataclasses.replace(run.train, seed=seed, stop_at_target=True)
        result = run_training(run.with_train(train), label=f"{label} seed {seed}")
        status(f"seed {seed}", f"{label}: {ToTarget(**result.to_target).text()}")
        records.append(result.to_target)
    return records


def trained_line(result: TrainResult) -> str:
    """One line: speed, batch and final accuracy of a training run. Its examples/s are
    the training's own, over whole epochs after the first (which traces the step), each
    epoch's start and end included: the summary's rounds time blocks of steps alone."""
    name, score = epoch_score(result.history[-1] if result.history else {})
    timed = timed_epochs(result.history)
    left_out = len(timed) < len(result.history)
    over = (
        f"over epochs {timed[0]['epoch']}-{timed[-1]['epoch']}"
        if left_out
        else "over its one epoch"
    )
    line = (
        f"{result.examples_per_s:,.0f} examples/s {over}, {result.shape}, global batch "
        f"{result.global_batch}, train {name.replace('_', ' ')} {score:.4f}"
    )
    if result.to_target:
        line += f"; held-out {ToTarget(**result.to_target).text()}"
    return line


def _train_local_workers(run: Run, probe_steps: int = 0) -> TrainResult:
    import os

    from tfscale.tasks.distribute.launch import launch_workers

    cores = os.cpu_count() or 1
    workers, run_dir = run.choice.workers, run.run_dir
    spec = {
        "run": run.to_spec(),
        # each worker gets its share of the cores: more threads than cores slow every step
        "threads": max(cores // workers, 1),
        "probe_steps": probe_steps,
    }
    launch_workers(
        spec, workers, run_dir, pin_cores=workers <= cores, link_gbit=run.train.link_gbit
    )
    return TrainResult(**json.loads((run_dir / "worker-0-result.json").read_text()))
