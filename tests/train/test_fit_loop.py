"""`train.loop: fit`: the user's training as they run it today, Keras's own `model.fit`
under the run's strategy, timed and evaluated on the held-out clock as tfscale's loop is,
with tfscale's loop timed beside it in the same rounds."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.settings.config import load_config


@pytest.mark.unit
@pytest.mark.parametrize(
    "values, expected",
    [
        ({"train.strategy": "multi_worker"}, r"does not train under multi_worker.*#20585"),
        ({"train.strategy": "parameter_server"}, r"does not train under parameter_server"),
        ({"train.strategy": "pipeline"}, r"does not train under pipeline"),
        ({"train.strategy": "mirrored", "train.grad_accum_steps": 2}, r"does not accumulate"),
    ],
)
def test_the_fit_loop_is_refused_where_kerass_fit_cannot_train(values, expected):
    from helpers import report

    from tfscale.tasks.distribute.strategy import select_strategy

    cfg = load_config(None, {"train.loop": "fit", **values}).train
    with pytest.raises(UsageError, match=expected) as caught:
        select_strategy(report(), cfg)
    assert "--loop tfscale" in caught.value.fix or "--grad-accum-steps 1" in caught.value.fix


@pytest.mark.integration
def test_the_fit_loop_trains_with_kerass_fit_and_records_its_epochs(digits, tmp_path, monkeypatch):
    """One `fit` call trains every epoch (Keras's own, counted here), and the run's files
    hold its epochs, held-out evaluations and gradient noise scale windows (one at each
    evaluation, as tfscale's loop reads them) as tfscale's loop writes them."""
    import keras
    from helpers import run_main, tiny_params

    calls = []
    fit = keras.Model.fit

    def counted(self, *args, **kwargs):
        calls.append(kwargs.get("epochs"))
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", counted)
    overrides, _, _ = digits
    noise = {"train.noise_scale": True, "train.noise_scale_every": 2}
    params = tiny_params(tmp_path, **{"prepare.data_dir": overrides["prepare.data_dir"]}, **noise)
    argv = ["--params", str(params), "train", "--loop", "fit", "--strategy", "mirrored"]
    code, out, err = run_main([*argv, "--epochs", "2", "--no-diagnose"], tmp_path)
    assert code == 0, err[-2000:]
    assert calls == [2]
    run_dir = next((tmp_path / "runs").rglob("metrics.json")).parent
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["loop"] == "fit" and metrics["replicas"] == 2
    history = json.loads((run_dir / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2]
    assert all(h["examples_per_s"] > 0 and 0 < h["accuracy"] <= 1 for h in history)
    assert history[1]["loss"] < history[0]["loss"]
    evaluations = json.loads((run_dir / "evaluations.json").read_text())
    assert evaluations  # the held-out clock ran
    windows = metrics["gradient_noise"]
    assert [w["end_step"] for w in windows] == [e["steps"] for e in evaluations]
    assert sum(w["steps"] for w in windows) > 0
    assert all(w["small"] > w["big"] > 0 for w in windows if w["steps"])
    assert windows[0]["big_batch"] == 2 * windows[0]["small_batch"]  # each replica's, both's
    # --no-diagnose: no bottleneck diagnosis after it, printed, written or measured for
    assert "bottleneck:" not in out and not list(run_dir.glob("diagnosis.*"))
    assert not metrics["probes"]
    # the saved model reads back (evaluated again at another batch size), as the loop's own
    code, out, err = run_main(["--params", str(params), "evaluate", "--batch-size", "7"], tmp_path)
    assert code == 0, err[-2000:]
    assert "as its training evaluated it" not in out and "test accuracy" in out


@pytest.mark.integration
def test_the_rounds_time_tfscales_loop_beside_the_users_fit(digits):
    from helpers import run_of

    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.measure.probes import TFSCALE_LOOP, measure_rounds

    overrides, manifest, data_dir = digits
    values = {**overrides, "train.loop": "fit", "train.strategy": "one_device"}
    config = load_config(None, values)
    cfg = dataclasses.replace(config.train, batch_size_per_replica=32)
    cfg = dataclasses.replace(cfg, model="mlp", precision="float32", jit_compile=False)
    choice = select_strategy(detect_hardware(), cfg)
    run = run_of(dataclasses.replace(config, train=cfg), manifest, data_dir, choice)
    rates = measure_rounds(run, steps=20, rounds=3)
    assert len(rates.rates[TFSCALE_LOOP]) == len(rates.rates["end_to_end"]) == 3
    ours = rates.tfscale_over_fit
    assert ours is not None and ours.median > 0 and ours.low <= ours.median <= ours.high


@pytest.mark.integration
def test_the_fit_loop_trains_exactly_the_steps_it_counts(digits, tmp_path):
    """Keras's `fit` runs whole executions of `steps_per_execution` steps (44 steps an
    epoch at 10 a call would run 50): each epoch trains exactly the configured steps, its
    record and the held-out clock count them, and a measuring block of 23 steps is 23."""
    from helpers import run_of

    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.train.fit_loop import make_fit_runner
    from tfscale.tasks.train.training import train_dataset_fn, train_model

    overrides, manifest, data_dir = digits
    values = {**overrides, "train.runs_dir": str(tmp_path / "runs"), "train.loop": "fit"}
    values.update({"train.strategy": "one_device", "train.model": "mlp", "train.epochs": 2})
    values.update({"train.batch_size_per_replica": 32, "train.steps_per_call": 10})
    config = load_config(None, values)
    run = run_of(config, manifest, data_dir, select_strategy(detect_hardware(), config.train))
    trained = train_model(run)
    setup = trained.setup
    assert setup.steps % 10 != 0  # 1,437 examples: 44 steps of 32
    assert int(setup.optimizer.iterations.numpy()) == 2 * setup.steps
    history = json.loads((run.run_dir / "history.json").read_text())
    assert [h["examples"] for h in history] == [setup.steps * 32] * 2
    evaluations = json.loads((run.run_dir / "evaluations.json").read_text())
    assert evaluations and all(e["examples"] == e["steps"] * 32 for e in evaluations)
    assert max(e["steps"] for e in evaluations) <= 2 * setup.steps
    dataset_fn = train_dataset_fn(config.train, setup.manifest, data_dir, setup.per_replica)
    run_epoch = make_fit_runner(setup, dataset_fn)
    before = int(setup.optimizer.iterations.numpy())
    run_epoch(23)
    run_epoch(23)  # the remainder's execution, traced once, taken again
    assert int(setup.optimizer.iterations.numpy()) - before == 46


@pytest.mark.integration
def test_a_fit_training_stopped_by_sigterm_goes_on_from_its_last_finished_epoch(
    digits, tmp_path, monkeypatch
):
    """`tfscale train --loop fit` sent SIGTERM after its first epoch (as `timeout`, Slurm
    and Kubernetes stop a job; the signal, not an exception raised for it) and run again:
    the first ends 143 saying so, the rerun says where it resumes, trains only the two
    epochs left (on the restored model and optimizer: 3 epochs' optimizer steps in all) and
    keeps the first epoch's record."""
    import os
    import signal

    import tensorflow as tf
    from helpers import run_main, tiny_params

    from tfscale.tasks.train import fit_loop

    overrides, manifest, _ = digits
    params = tiny_params(tmp_path, **{"prepare.data_dir": overrides["prepare.data_dir"]})
    argv = ["--params", str(params), "train", "--loop", "fit", "--model", "mlp", "--epochs", "3"]
    argv += ["--strategy", "one_device", "--batch-size-per-replica", "32", "--no-diagnose"]
    records = fit_loop.EpochRecords
    epoch_begin, epoch_end = records.on_epoch_begin, records.on_epoch_end

    def stopped_after_the_first(self, epoch, logs=None):
        epoch_end(self, epoch, logs)
        if epoch == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises in this, the main thread

    monkeypatch.setattr(records, "on_epoch_end", stopped_after_the_first)
    code, _, err = run_main(argv, tmp_path)
    assert code == 128 + signal.SIGTERM and "stopped by signal" in err, err[-2000:]
    (history_file,) = (tmp_path / "runs").rglob("history.json")
    first = json.loads(history_file.read_text())
    assert [h["epoch"] for h in first] == [1]
    begun = []

    def counted(self, epoch, logs=None):
        begun.append(epoch)
        epoch_begin(self, epoch, logs)

    monkeypatch.setattr(records, "on_epoch_end", epoch_end)
    monkeypatch.setattr(records, "on_epoch_begin", counted)
    code, _, err = run_main(argv, tmp_path)
    assert code == 0, err[-2000:]
    steps = manifest.splits["train"] // 32
    assert f"from step {steps} (the start of epoch 2)" in err, err[-2000:]
    assert begun == [1, 2]  # Keras's epochs 2 and 3 (0-based): the two left, not three
    history = json.loads(history_file.read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3] and history[0] == first[0]
    latest = tf.train.latest_checkpoint(history_file.parent / "checkpoints")
    saved = tf.train.load_checkpoint(latest)
    assert saved.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 3 * steps
