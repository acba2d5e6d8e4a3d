"""Time to a target accuracy, the MLPerf way: the held-out split evaluated at fixed example
intervals while training, on the clock; the first crossing, or the best reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfscale.tasks.distribute.hardware import detect_hardware
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.distribute.strategy import select_strategy
from tfscale.tasks.settings.config import load_config
from tfscale.tasks.train.to_target import (
    Evaluation,
    ToTarget,
    evaluation_steps,
    interval_examples,
    to_target,
)


@pytest.mark.parametrize(
    ("every", "step", "first", "last"),
    [(718, 32, 0, 440), (718, 64, 0, 220), (718, 32, 44, 88), (100, 300, 0, 7), (64, 64, 3, 9)],
)
def test_each_evaluation_is_the_first_step_to_reach_a_multiple_of_the_interval(
    every, step, first, last
):
    steps = evaluation_steps(every, step, first, last)
    reached = {-(-k * every // step) for k in range(1, last * step // every + 1)}
    assert steps == sorted(s for s in reached if first < s <= last)
    for s in steps:  # the examples seen reach k x interval at s, not one step earlier
        k = s * step // every
        assert (s - 1) * step < k * every <= s * step


def test_both_trainings_of_digits_are_evaluated_at_nearly_the_same_examples():
    """Half an epoch of digits is 718 examples: batch 32 evaluates at 736, 1,440, ...,
    batch 64 at 768, 1,472, ...: within a step of the larger batch of each other."""
    every = interval_examples(0.5, 1437)
    assert every == 718
    small = [s * 32 for s in evaluation_steps(every, 32, 0, 440)]
    large = [s * 64 for s in evaluation_steps(every, 64, 0, 220)]
    assert small[:3] == [736, 1440, 2176] and large[:3] == [768, 1472, 2176]
    assert all(abs(a - b) < 64 for a, b in zip(small, large, strict=False))
    assert interval_examples(0, 1437) == 0 and evaluation_steps(0, 32, 0, 100) == []


def _evaluations(*accuracies: float) -> list[Evaluation]:
    return [Evaluation(10 * i, 320 * i, 0.5 * i, a) for i, a in enumerate(accuracies, 1)]


def test_the_first_crossing_is_the_answer_not_the_best_or_the_last():
    got = to_target(_evaluations(0.5, 0.93, 0.96, 0.94, 0.99), 0.95, 320, 1280)
    assert (got.reached, got.steps, got.examples, got.seconds) == (True, 30, 960, 1.5)
    assert got.epochs == 0.75
    assert got.text() == "0.95 at 960 examples (0.8 epochs, 30 steps), 1.5 s"


def test_a_target_never_reached_says_the_best_reached_and_where():
    got = to_target(_evaluations(0.5, 0.93, 0.91), 0.95, 320, 1280)
    assert not got.reached and got.examples is None and got.seconds is None
    assert (got.best_accuracy, got.best_examples) == (0.93, 640)
    assert got.text() == "0.95 not reached in 3 evaluations: best 0.9300 at 640 examples"
    assert "not evaluated" in to_target([], 0.95, 320, 1280).text()


def _configure(digits, tmp_path, **values):
    overrides, manifest, data_dir = digits
    fast = {"train.model": "mlp", "train.precision": "float32", "train.jit_compile": False}
    config = load_config(
        None, {**overrides, **fast, "train.runs_dir": str(tmp_path / "runs"), **values}
    )
    report = detect_hardware()
    return Run(config, manifest, data_dir, select_strategy(report, config.train), report)


@pytest.mark.integration  # trains, times rounds or starts a process
def test_a_mirrored_training_stops_at_the_evaluation_that_reaches_the_target(digits, tmp_path):
    """Under Mirrored over 2 logical CPUs, evaluated every half epoch: training ends at the
    first evaluation at or above the target, mid-epoch, and that evaluation is the saved
    model's own accuracy on the held-out split, evaluated apart from training."""
    from tfscale.tasks.train.evaluation import evaluate_model, recorded
    from tfscale.tasks.train.training import train_model

    run = _configure(
        digits,
        tmp_path,
        **{"train.strategy": "mirrored", "train.replicas": 2, "train.epochs": 30},
        **{"train.stop_at_target": True, "evaluate.target_accuracy": 0.9},
    )
    result = train_model(run).result
    target = ToTarget(**result.to_target)
    evaluations = [Evaluation(**e) for e in result.evaluations]
    assert target.reached and evaluations[-1].accuracy >= 0.9 > evaluations[-2].accuracy
    assert [e.steps for e in evaluations] == evaluation_steps(718, 64, 0, target.steps)
    assert target.examples == target.steps * 64 == sum(h["examples"] for h in result.history)
    seconds = [e.seconds for e in evaluations]
    assert seconds == sorted(seconds) and seconds[-1] >= sum(h["seconds"] for h in result.history)
    assert len(result.history) < 30  # it stopped
    saved = evaluate_model(result.model_path, run.manifest, run.data_dir, 256)
    assert saved.test_accuracy == pytest.approx(target.best_accuracy, abs=1e-9)
    # the final evaluation the training recorded for `tfscale evaluate` is that of the file
    kept = recorded(result.model_path, run.manifest, 256)
    assert kept.confusion_matrix == saved.confusion_matrix
    assert kept.test_loss == pytest.approx(saved.test_loss, rel=1e-5)
    assert recorded(result.model_path, run.manifest, 128) is None  # another batch size
    with open(result.model_path, "ab") as model_file:  # the model file changed since
        model_file.write(b"\0")
    assert recorded(result.model_path, run.manifest, 256) is None
    recorded = json.loads((Path(result.run_dir) / "evaluations.json").read_text())
    assert recorded == result.evaluations
    assert result.history[-1]["heldout_accuracy"] == evaluations[-1].accuracy


@pytest.mark.integration  # trains, times rounds or starts a process
def test_evaluation_off_measures_nothing_and_trains_as_before(digits, tmp_path):
    from tfscale.tasks.train.training import train_model

    values = {"train.strategy": "one_device", "train.epochs": 1, "evaluate.every_epochs": 0}
    run = _configure(digits, tmp_path, **values)
    result = train_model(run).result
    assert result.evaluations == [] and result.to_target == {}
    assert "heldout_accuracy" not in result.history[0]


@pytest.mark.parametrize(
    ("values", "mean", "low", "high"),
    [
        ([5.0, 1.0, 3.0, 4.0, 9.0], 4.0, 3.0, 5.0),  # 1 and 9 dropped
        ([5.0, None, 3.0, 4.0, 2.0], 4.0, 3.0, 5.0),  # the miss counts as the slowest
        ([5.0, None, 3.0, None, 2.0], None, None, None),  # a miss among those kept
        ([6.0, 2.0], 4.0, 2.0, 6.0),  # too few to drop any
        ([7.0], 7.0, 7.0, 7.0),
        ([None], None, None, None),
    ],
)
def test_seeds_are_scored_as_mlperf_scores_runs(values, mean, low, high):
    from tfscale.tasks.train.to_target import over_seeds

    got = over_seeds(values)
    assert (got.mean, got.low, got.high) == (mean, low, high)
    assert got.seeds == len(values) and got.missed == values.count(None)
