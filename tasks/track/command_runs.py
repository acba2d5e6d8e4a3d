"""The MLflow runs of the `tfscale train` and `tfscale evaluate` commands, as the DVC stages
run them: a baseline opens the study run its comparison nests under, the training
compared with it joins that run (found beside the baseline's exported model), and the
evaluation with `--baseline` closes it with the speedup summary. `flows/commands.py` only
calls these in order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfscale.tasks.core.files import write_json_atomic
from tfscale.tasks.execute.run_files import TRACKED_AS, study_of, trained_by
from tfscale.tasks.settings.config import Config
from tfscale.tasks.track import records
from tfscale.tasks.track.tracking import Tracker, run_tags


def command_tracker(config: Config, **tags: str) -> tuple[Tracker, dict]:
    """The tracker a training or evaluating command logs to, checked before any work, and
    its run's tags (the DVC stage among them)."""
    tracker = Tracker.for_config(config.track)
    tracker.check()
    return tracker, run_tags(**tags)


SETUP = ("dataset", "model", "strategy", "replicas", "precision")


def split_setup(trained: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """What the files beside a model say of its training (`run_files.trained_by`), split
    into how it was set up (params of the evaluation's run, as the runs table shows a
    training's) and the rest (tags: its run directory and MLflow run)."""
    setup = {k: v for k, v in trained.items() if k in SETUP}
    return setup, {k: v for k, v in trained.items() if k not in SETUP}


def study_run(
    tracker: Tracker | None,
    compared: Any,
    tags: dict,
    params: dict,
    *,
    baseline: bool,
    against: Path | None,
) -> str | None:
    """The MLflow run a compared study's stages nest under: opened by its `baseline`,
    found by the run compared with it beside the baseline's model (`against`); None for a
    training that is neither, or is not tracked."""
    if tracker is None or not (baseline or against):
        return None
    choice, name = compared.choice, records.study_run_name(compared)
    # the runs table's columns, as params (never also as tags: one value, one name)
    table = {**records.choice_params(choice), "replicas": choice.replicas, **params}
    if baseline:
        return tracker.open_study(name, tags, table)
    link = {
        k.replace("training_", "baseline_"): v
        for k, v in trained_by(against).items()
        if k in ("training_run_id", "training_run_url")
    }
    return tracker.join_study(study_of(against), name, {**tags, **link}, table)


def training_run(tracker: Tracker | None, name: str, tags: dict, study: str | None):
    """The training's MLflow run (its id), nested under `study` when there is one; an
    empty id when not tracked."""
    if tracker is None:
        return _no_run()
    return tracker.run(name, tags, nested_under=study)


@contextlib.contextmanager
def _no_run() -> Iterator[str]:
    yield ""


def log_trained(
    tracker: Tracker,
    run_id: str,
    result: Any,
    diagnosis: Any,
    params: dict,
    study: str | None,
) -> None:
    """A training's figures, params and diagnosis on its run, and beside its model the
    link `evaluate` follows back to this run (and its study)."""
    records.log_training(tracker, run_id, result, params)
    link = {"run_id": run_id, "url": tracker.run_url(tracker.ui_base, run_id)}
    if study:
        link["study_run_id"] = study
    write_json_atomic(Path(result.run_dir) / TRACKED_AS, link)  # for `evaluate`
    if diagnosis is not None:
        tracker.log_result(run_id, diagnosis, prefix="diagnosis_")
        tracker.log(run_id, tags={"bottleneck": diagnosis.bottleneck})


def describe_evaluation(tracker: Tracker, run_id: str, trained: dict, dataset: str) -> None:
    """The evaluation's description links the training run it evaluates."""
    if "training_run_url" in trained:
        tracker.describe(
            run_id,
            f"Evaluates the model of training run [{trained['training_run_id']}]"
            f"({trained['training_run_url']}) on the held-out split of {dataset}.",
        )


def log_comparison(
    tracker: Tracker, run_id: str, study: str | None, result: Any, summary: Any, dataset: str
) -> None:
    """The speedup summary on the evaluation's run and on its study's row, with the
    study's description saying what it found."""
    for on in (run_id, study) if study else (run_id,):  # the table's row too
        tracker.log_result(on, summary)
        tracker.log(on, tags={"bottleneck": summary.bottleneck})
    if not study:
        return
    tracker.log_result(study, result)
    tracker.describe(
        study,
        f"{dataset}: {summary.speedup_text} on {summary.shape} "
        f"({summary.strategy}, {summary.precision}), efficiency "
        f"{summary.scaling_efficiency:.2f}, {result.text()}; "
        f"bottleneck: {summary.bottleneck}. The stages are its child runs: the "
        "single-device baseline, the training compared with it, the evaluation.",
    )
