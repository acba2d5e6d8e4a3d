"""Any metric as the target (docs/your-model.md, "Any metric as the target"), each claim at
the narrowest boundary that proves it, in this process (issue 61, item 2): `loss`, a
compiled `mae` and one of Keras's metrics by name measured on the held-out split, a loss or
an error reached from above; `--stop-at-target`, `--seeds`, `tfscale plan` and the
forecast on a run whose target is a user's metric."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from helpers import train_result

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.data.inputs import build_dataset
from tfscale.tasks.data.preparation import prepare_dataset
from tfscale.tasks.settings.config import load_config
from tfscale.tasks.train.objectives import Built
from tfscale.tasks.train.to_target import HeldOut, TargetClock, ToTarget, target_of
from tfscale.tasks.train.user_models import objective_from


def held_out(manifest, data_dir, model):
    """The test split as numpy, as `model` takes it: (features, labels)."""
    from tfscale.tasks.train.model_inputs import as_model_takes

    xs, ys = [], []
    for x, y in build_dataset(as_model_takes(manifest, model), data_dir, "test", 64, False):
        xs.append(x.numpy())
        ys.append(y.numpy())
    return np.concatenate(xs), np.concatenate(ys)


def user(model, spec):
    """`model` as a user's model is set up for training: with its objective from its
    compile."""
    return Built(model, objective_from(model, spec, "mine.py:build"))


@pytest.mark.unit
def test_the_target_metric_loss_or_one_of_keras_by_name_is_measured_on_the_held_out_split(
    digits,
):
    """`--target-metric loss` is the held-out mean loss as Keras's own cross-entropy gives
    it; a metric of Keras's by name the model was not compiled with
    (`sparse_top_k_categorical_accuracy`) is Keras's value over the held-out split; a loss
    is reached from above, an accuracy from below."""
    _, manifest, data_dir = digits
    spec = manifest.spec
    keras.utils.set_random_seed(0)
    inputs = keras.Input(spec.shape, dtype="uint8")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    built = user(keras.Model(inputs, keras.layers.Dense(10)(x)), spec)
    x_test, y_test = held_out(manifest, data_dir, built.model)
    logits = built.model(x_test, training=False)
    loss = keras.losses.sparse_categorical_crossentropy(y_test, logits, from_logits=True)
    measured = HeldOut(built, manifest, data_dir, 64, "loss").accuracy()
    assert measured == pytest.approx(float(np.mean(loss)), rel=1e-4)
    top5 = keras.metrics.SparseTopKCategoricalAccuracy(k=5)
    top5.update_state(y_test, logits)
    name = "sparse_top_k_categorical_accuracy"
    assert HeldOut(built, manifest, data_dir, 64, name).accuracy() == pytest.approx(
        float(top5.result()), abs=1e-6
    )
    loss_target = target_of(_evaluate(target_metric="loss", target=1.0), spec.label)
    assert loss_target.lower_is_better and loss_target.met(0.9) and not loss_target.met(1.1)
    top = target_of(_evaluate(target_metric=name, target=0.9), spec.label)
    assert not top.lower_is_better and top.met(0.95) and not top.met(0.5)


def _evaluate(**values):
    return load_config(None, {f"evaluate.{k}": v for k, v in values.items()}).evaluate


@pytest.mark.unit
def test_a_compiled_mae_is_the_held_out_mean_absolute_error_reached_from_above(tmp_path):
    """A regression compiled with `metrics=["mae"]`: `--target-metric mae` is the held-out
    mean absolute error of the model's outputs (in the label's units), and a target of it
    is reached from above."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 4)).astype("float32")
    np.savez(tmp_path / "r.npz", x=x, y=(x.sum(1) * 10 + 50).astype("float32"))
    values = {"prepare.dataset": str(tmp_path / "r.npz"), "prepare.data_dir": str(tmp_path / "tf")}
    prepared = prepare_dataset(load_config(None, values), progress=False)
    manifest, data_dir, spec = prepared.manifest, prepared.data_dir, prepared.manifest.spec
    assert spec.label.kind == "regression"
    keras.utils.set_random_seed(0)
    inputs = keras.Input(spec.shape)
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    built = user(model, spec)
    x_test, y_test = held_out(manifest, data_dir, model)
    outputs = np.asarray(model(x_test, training=False))
    want = np.mean(np.abs(built.objective.targets(y_test, outputs) - outputs))
    assert HeldOut(built, manifest, data_dir, 64, "mae").accuracy() == pytest.approx(
        float(want), rel=1e-5
    )
    target = target_of(_evaluate(target_metric="mae", target=5.0), spec.label)
    assert target.lower_is_better and target.met(4.0) and not target.met(6.0)


class Values:
    """A held-out split whose metric reads these values, one an evaluation."""

    def __init__(self, *values: float):
        self.values = list(values)

    def accuracy(self) -> float:
        return self.values.pop(0)


@pytest.mark.unit
def test_stop_at_target_ends_a_training_at_the_first_evaluation_reaching_a_users_metric():
    """`--stop-at-target true` with `--target-metric mae --target 40`: the training (Keras's
    fit loop's callback here) goes on while the error is above 40 and stops at the first
    evaluation at or below it, whose record names the metric (`heldout_mae`)."""
    from tfscale.tasks.train.fit_loop import SCORE, EpochRecords

    target = target_of(_evaluate(target_metric="mae", target=40.0), None)
    clock = TargetClock(Values(60.0, 45.0, 38.0), target, 32, 32, 3200)
    records = EpochRecords(clock, 100, 32, True, lambda record: None)
    records.set_model(keras.Sequential())
    records.model.stop_training = False
    records.on_epoch_begin(0)
    for batch in range(100):
        records.on_train_batch_end(batch)
        if records.model.stop_training:
            break
    assert [e.accuracy for e in clock.evaluations] == [60.0, 45.0, 38.0]
    assert records.model.stop_training and clock.result().reached
    records.on_epoch_end(0, {"loss": 1.0, SCORE: 50.0})
    assert records.history[-1]["heldout_mae"] == 38.0


@pytest.mark.unit
@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_a_fit_loop_epoch_whose_loss_is_not_a_number_stops_the_training_naming_its_step(loss):
    """`--loop fit`: an epoch ending on a NaN or infinite loss stops the training with the
    epoch, the step and the learning rate to lower, its record not written."""
    from tfscale.tasks.core.errors import UserError
    from tfscale.tasks.train.fit_loop import SCORE, EpochRecords
    from tfscale.tasks.train.training import finite_loss

    target = target_of(_evaluate(target_metric="mae", target=40.0), None)
    clock = TargetClock(Values(), target, 0, 32, 3200)
    written = []

    def checked(loss: float, epoch: int, step: int) -> None:
        finite_loss(loss, epoch, step, 0.25)

    records = EpochRecords(clock, 100, 32, False, written.append, "mae", checked)
    records.set_model(keras.Sequential())
    records.on_epoch_begin(1)
    for batch in range(100):
        records.on_train_batch_end(batch)
    with pytest.raises(UserError, match=rf"loss became {loss} in epoch 2, by step 200") as e:
        records.on_epoch_end(1, {"loss": loss, SCORE: 50.0})
    assert "--learning-rate; this training's was 0.25" in e.value.fix
    assert not written and not records.history
    records.on_epoch_end(1, {"loss": 2.0, SCORE: 50.0})  # a finite one is recorded
    assert written and records.history[-1]["loss"] == 2.0


@pytest.mark.unit
def test_seeds_repeat_each_training_to_a_users_metric_and_say_it(monkeypatch):
    """`--seeds 3`: each side trains again with the next two seeds, each ending at the
    target (`stop_at_target`), and each seed's line names the user's metric."""
    from tfscale.tasks.execute import trainings

    reached = {"reached": True, "target": 0.97, "metric": "auc", "examples": 640}
    reached |= {"steps": 20, "epochs": 2.0, "seconds": 1.5, "every_examples": 320}
    reached |= {"evaluations": 2}
    seen, said = [], []

    def trains(run, label=""):
        seen.append((run.train.seed, run.train.stop_at_target, label))
        return train_result(to_target=reached)

    monkeypatch.setattr(trainings, "run_training", trains)
    monkeypatch.setattr(trainings, "status", lambda head, text: said.append(text))
    run = _StubRun(load_config(None, {"train.seed": 5, "evaluate.seeds": 3}).train)
    records = trainings.repeat_to_target(run, 3, "baseline")
    assert seen == [(6, True, "baseline seed 6"), (7, True, "baseline seed 7")]
    assert records == [reached, reached]
    assert said == ["baseline: AUC 0.97 at 640 examples (2.0 epochs, 20 steps), 1.5 s"] * 2
    assert ToTarget(**reached).text().startswith("AUC 0.97")


class _StubRun:
    """What `repeat_to_target` reads of a run: its training config, and another."""

    def __init__(self, train):
        self.train = train

    def with_train(self, train):
        return _StubRun(train)


C0, C1, ALPHA, BANDWIDTH, SYNC, GRADIENTS, BATCH = 0.001, 5e-6, 100e-6, 1.25e8, 5e-4, 204_800, 32


def _cost_model():
    from tfscale.tasks.report.forecast import CostModel

    return CostModel(C0, C1, 0.0, ALPHA, BANDWIDTH, 0.0, SYNC, 50_000.0, GRADIENTS, BATCH, 2)


def _user_metric_run() -> dict:
    """The metrics.json of a 2-worker run at global batch 64 measured from known constants
    (as tests/report/test_forecast.py builds one) that aimed at a mean absolute error of 45
    and reached it from above at step 100, its noise scale a constant 64."""
    model = _cost_model()

    def comm(size: float) -> float:
        return 2 * ALPHA + size / BANDWIDTH

    probes = {
        "workers": 2, "replica_examples": BATCH, "gradient_bytes": GRADIENTS,
        "local_step_s_by_batch": [[b, model.compute_s(b)] for b in (16, 32, 64)],
        "comm_s_by_bytes": [[s, comm(s)] for s in (GRADIENTS / 4, GRADIENTS, 4 * GRADIENTS)],
        "step_s": model.compute_s(BATCH) + comm(GRADIENTS) + SYNC,
        "local_step_s": model.compute_s(BATCH), "comm_s": comm(GRADIENTS),
        "input_examples_per_s": [50_000.0, 60_000.0],
    }  # fmt: skip
    window = {"end_step": 50, "steps": 10, "small_batch": BATCH, "big_batch": 2 * BATCH}
    window |= {"small": 1 + 64 / BATCH, "big": 1 + 64 / (2 * BATCH)}
    target = {"target": 45.0, "metric": "mean_absolute_error", "lower_is_better": True}
    return {
        "run_dir": "runs/x", "probes": probes, "global_batch": 2 * BATCH,
        "learning_rate": 0.002, "lr_scaling": "linear", "gradient_noise": [window],
        "to_target": {**target, "reached": True, "steps": 100},
        "evaluations": [
            {"steps": 60, "accuracy": 60.0},
            {"steps": 100, "accuracy": 44.0},
            {"steps": 140, "accuracy": 41.0},
        ],
    }  # fmt: skip


@pytest.mark.unit
def test_plan_and_forecast_price_a_run_whose_target_is_a_users_metric():
    """`tfscale plan` on a run that aimed at a mean absolute error: its steps to the target
    are those of the first evaluation at or below it (from above), its first line names the
    metric, a target it never reached is refused naming the metric; the forecast prices
    its time to that target."""
    from tfscale.tasks.report.console_plan import format_plan
    from tfscale.tasks.report.forecast import predict_speedups
    from tfscale.tasks.report.forecast_report import with_time_to_target
    from tfscale.tasks.report.plan import _steps_to, make_plan

    metrics = _user_metric_run()
    assert _steps_to(metrics, None) == (45.0, 100)
    plan = make_plan(metrics, 4, "ethernet-10g", 10.0)
    assert plan.metric == "mean_absolute_error"
    assert "the fastest way to held-out mean absolute error 45 on" in format_plan(plan)
    with pytest.raises(UsageError, match=r"did not reach held-out mean absolute error 30 "):
        make_plan(metrics, 4, "ethernet-10g", 10.0, target=30.0)
    predicted = predict_speedups(_cost_model(), {"ethernet-10g": 10.0}, [1, 2])
    predicted = with_time_to_target(predicted, metrics)
    assert all(p.time_to_target_speedup for p in predicted.predictions["ethernet-10g"])
