"""The callbacks a model's function gives beside the model (`return model, [...]`), called
by tfscale's loop as Keras's `fit` calls them (`tasks.train.callbacks`), or refused before
anything is measured. That EarlyStopping and ReduceLROnPlateau stop and set the rate as in
`fit`: tests/train/test_fidelity.py."""

from __future__ import annotations

import csv
import json
import re

import pytest

from tfscale.tasks.settings.config import load_config

MODELS = '''
import json

import keras


def _model(spec):
    inputs = keras.Input(shape=spec.features[0].shape, name=spec.features[0].name)
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(spec.label.outputs)(hidden))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def backup(spec):
    return _model(spec), [keras.callbacks.BackupAndRestore("backup")]


def monitors_auc(spec):
    return _model(spec), [keras.callbacks.EarlyStopping(monitor="val_auc")]


def plateau(spec):
    return _model(spec), [keras.callbacks.ReduceLROnPlateau(monitor="loss")]


def not_callbacks(spec):
    return _model(spec), ["early stopping, please"]


def raising(spec):
    def fail(epoch, logs):
        raise RuntimeError("the report server is down")

    return _model(spec), [keras.callbacks.LambdaCallback(on_epoch_end=fail)]


def swallows_a_stop(spec):
    """SIGTERM at the first epoch's end, its exception caught as code that catches
    everything catches it."""
    import os, signal, time

    def stop(epoch, logs):
        if epoch == 0:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except BaseException:
                pass

    return _model(spec), [keras.callbacks.LambdaCallback(on_epoch_end=stop)]


def logging():
    return [keras.callbacks.CSVLogger("epochs.csv"), keras.callbacks.EarlyStopping("loss")]


def not_a_list():
    return keras.callbacks.CSVLogger("epochs.csv")


def carried(spec):
    """What users' fit calls carry, each leaving something to look at."""
    def batch_end(batch, logs):
        with open("batches.jsonl", "a") as f:
            f.write(json.dumps([batch, sorted(logs), logs["loss"]]) + "\\n")

    return _model(spec), [
        keras.callbacks.LambdaCallback(on_train_batch_end=batch_end),
        keras.callbacks.ModelCheckpoint("best.keras", monitor="val_loss", save_best_only=True),
        keras.callbacks.CSVLogger("epochs.csv"),
        keras.callbacks.TensorBoard("tensorboard"),
    ]
'''


def _checked(tmp_path, digits, function: str, **train):
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.train.user_models import check_user_model

    (tmp_path / "models.py").write_text(MODELS)
    overrides, manifest, data_dir = digits
    values = {**overrides, "train.model": f"{tmp_path / 'models.py'}:{function}"}
    values.update({f"train.{k}": v for k, v in train.items()})
    config = load_config(None, values)
    choice = select_strategy(detect_hardware(), config.train)
    check_user_model(
        config.train.model, manifest, data_dir, config.evaluate, (config.train, choice)
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "function, train, said, fix",
    [
        ("backup", {}, "BackupAndRestore: tfscale checkpoints every epoch itself", "drop"),
        (
            "monitors_auc",
            {},
            "EarlyStopping monitors 'val_auc', which tfscale's loop does not log (it logs "
            "loss, accuracy, val_loss, val_accuracy)",
            "--loop fit",
        ),
        (
            "plateau",
            {"warmup_epochs": 1},
            "ReduceLROnPlateau sets the learning rate, which tfscale's warm-up over 1 epoch",
            "--warmup-epochs 0",
        ),
    ],
)
def test_a_callback_tfscale_cannot_call_as_fit_does_is_refused_before_measuring(
    tmp_path, digits, function, train, said, fix
):
    from tfscale.tasks.train.user_models import ModelError

    with pytest.raises(ModelError, match=re.escape(f"its callback {said}")) as refused:
        _checked(tmp_path, digits, function, **train)
    assert fix in refused.value.fix


@pytest.mark.unit
def test_a_rate_setting_callback_is_taken_where_the_rate_is_its_alone(tmp_path, digits):
    """No warm-up and a rule that does not adapt: ReduceLROnPlateau's rate is the only one."""
    _checked(tmp_path, digits, "plateau", warmup_epochs=0, lr_scaling="linear")


@pytest.mark.unit
def test_a_function_returning_a_model_and_no_callbacks_says_what_it_may_return(tmp_path, digits):
    from tfscale.tasks.train.user_models import ModelError

    with pytest.raises(ModelError, match="returned tuple, not a keras.Model") as refused:
        _checked(tmp_path, digits, "not_callbacks")
    assert "return model, [callback, ...]" in refused.value.fix


@pytest.mark.integration
def test_the_callbacks_users_fit_calls_carry_run_in_tfscales_loop(tmp_path, digits):
    """A LambdaCallback's batch hook (once per graph call, with the epoch's running loss),
    ModelCheckpoint on the held-out loss, CSVLogger and TensorBoard: each does its work
    in a Mirrored training, in the folder the training ran in."""
    from helpers import run_main, tiny_params

    (tmp_path / "models.py").write_text(MODELS)
    overrides, manifest, _ = digits
    params = tiny_params(tmp_path, **{"prepare.data_dir": overrides["prepare.data_dir"]})
    argv = ["--params", str(params), "train", "--model", "models.py:carried"]
    argv += ["--strategy", "mirrored", "--epochs", "2", "--steps-per-call", "5", "--no-diagnose"]
    code, out, err = run_main(argv, tmp_path)
    assert code == 0, err[-2000:]
    run_dir = next((tmp_path / "runs").rglob("metrics.json")).parent
    metrics = json.loads((run_dir / "metrics.json").read_text())
    steps = metrics["steps_per_epoch"]
    with (tmp_path / "epochs.csv").open() as f:
        rows = list(csv.DictReader(f))
    history = json.loads((run_dir / "history.json").read_text())
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert [float(r["loss"]) for r in rows] == pytest.approx([h["loss"] for h in history])
    assert {"val_loss", "val_accuracy", "accuracy"} <= rows[0].keys()
    assert (tmp_path / "best.keras").is_file()
    assert list((tmp_path / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert list((tmp_path / "tensorboard" / "validation").glob("events.out.tfevents.*"))
    seen = [json.loads(line) for line in (tmp_path / "batches.jsonl").read_text().splitlines()]
    assert all(keys == ["accuracy", "loss"] for _, keys, _ in seen)
    assert max(batch for batch, _, _ in seen) == steps - 1
    assert len(seen) >= 2 * -(-steps // 5)  # a call of up to 5 steps at a time


@pytest.mark.integration
def test_a_callback_that_raises_stops_the_training_naming_it(tmp_path, digits):
    from helpers import run_main, tiny_params

    (tmp_path / "models.py").write_text(MODELS)
    overrides, _, _ = digits
    params = tiny_params(tmp_path, **{"prepare.data_dir": overrides["prepare.data_dir"]})
    argv = ["--params", str(params), "train", "--model", "models.py:raising", "--no-diagnose"]
    from tfscale.tasks.train.callbacks import CallbackRaised

    errors = []
    argv += ["--strategy", "one_device", "--epochs", "1"]
    code, out, err = run_main(argv, tmp_path, on_error=errors.append)
    assert code == 1, (out, err[-2000:])
    assert [type(e) for e in errors] == [CallbackRaised]
    said = (
        "the model's callback LambdaCallback raised RuntimeError in on_epoch_end: the report "
        "server is down"
    )
    assert said in err and "this is a bug in tfscale" not in err


@pytest.mark.unit
@pytest.mark.parametrize(
    "ref, said",
    [
        ("models.py:not_a_list", "returned CSVLogger, not a list of Keras callbacks"),
        ("early_stopping", "train.callbacks 'early_stopping': expected package.module:function"),
    ],
)
def test_callbacks_named_by_the_config_that_are_none_are_refused(tmp_path, digits, ref, said):
    from tfscale.tasks.train.callbacks import CallbackRefused, configured
    from tfscale.tasks.train.models import model_for_data

    (tmp_path / "models.py").write_text(MODELS)
    _, manifest, _ = digits
    model = model_for_data("mlp", manifest.spec).model
    with pytest.raises(CallbackRefused, match=re.escape(said)):
        configured(model, ref.replace("models.py", str(tmp_path / "models.py")))


@pytest.mark.integration
def test_a_built_in_model_trains_with_the_callbacks_the_config_names(tmp_path, digits):
    """`--callbacks file.py:function` beside a built-in model: its CSVLogger writes every
    epoch the training ran, as the run's history records them."""
    from helpers import run_main, tiny_params

    (tmp_path / "models.py").write_text(MODELS)
    overrides, _, _ = digits
    params = tiny_params(tmp_path, **{"prepare.data_dir": overrides["prepare.data_dir"]})
    argv = ["--params", str(params), "train", "--model", "mlp", "--callbacks", "models.py:logging"]
    code, out, err = run_main([*argv, "--strategy", "one_device", "--no-diagnose"], tmp_path)
    assert code == 0, err[-2000:]
    history = json.loads(next((tmp_path / "runs").rglob("history.json")).read_text())
    with (tmp_path / "epochs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["loss"]) for r in rows] == pytest.approx([h["loss"] for h in history])


@pytest.mark.integration
def test_a_stop_a_callback_swallowed_ends_the_training_at_its_next_call(tmp_path, digits):
    """SIGTERM lands inside a callback's `except BaseException`: the training still stops
    at its next graph call, with the first epoch recorded and the shell's 143, not trained
    on to its end."""
    from helpers import run_main, tiny_params

    (tmp_path / "models.py").write_text(MODELS)
    overrides, _, _ = digits
    params = tiny_params(tmp_path, **{"prepare.data_dir": overrides["prepare.data_dir"]})
    argv = ["--params", str(params), "train", "--model", "models.py:swallows_a_stop"]
    argv += ["--strategy", "one_device", "--epochs", "3", "--no-diagnose"]
    code, out, err = run_main(argv, tmp_path)
    assert code == 143, (out, err[-2000:])
    assert "stopped by signal" in err
    (history,) = (tmp_path / "runs").rglob("history.json")
    assert len(json.loads(history.read_text())) == 1
