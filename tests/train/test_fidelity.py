"""tfscale trains what Keras's own `fit` trains: the same user model, seed and examples in
the same order, trained by tfscale's loop and by `model.fit` (`benchmarks/fidelity.py`),
agree on the loss after each of the first 20 steps within 1e-4 relative, on each of 5
epochs' mean loss within 2e-3, and after the 20th step on each weight's change from the
start and each of the optimizer's variables within 1e-3 (docs/your-model.md's bounds), on
one device and under Mirrored over 2 logical CPUs. The optimizer's variables are where a
wrong gradient shows under Adam, whose steps a gradient scaled by a constant leaves as they
were: a gradient doubled under Mirrored moved no step loss past 3e-4 in the Adam cases and
put their second moments 3.0 apart."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import fidelity  # noqa: E402

STEPS, EPOCHS = 20, 5


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fidelity")
    fidelity.write_case_files(folder)
    return folder


def _agrees(found: fidelity.Fidelity) -> None:
    assert found.step_difference < fidelity.BOUNDS["steps"], found
    assert found.epoch_difference < fidelity.BOUNDS["epochs"], found
    assert found.weight_difference < fidelity.BOUNDS["weights"], found
    assert found.slot_difference < fidelity.BOUNDS["slots"], found


@pytest.mark.unit
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_regularisers_dropout_and_batch_norm_train_as_fit_trains_them(cases, strategy):
    _agrees(fidelity.compare(cases, "l2_dropout_bn", strategy, STEPS, EPOCHS))


@pytest.mark.unit
def test_a_models_own_train_step_runs_per_replica_as_fit_runs_it(cases):
    _agrees(fidelity.compare(cases, "train_step", "mirrored", STEPS, EPOCHS))


@pytest.mark.unit
def test_recording_the_noise_scale_on_one_device_does_not_change_what_is_trained(cases):
    """A lone replica's noise scale takes a half batch's gradient from the whole batch's
    forward pass: BatchNormalization and Dropout see the batch `fit` gives them."""
    _agrees(fidelity.compare(cases, "l2_dropout_bn", "one_device", STEPS, EPOCHS, noise=True))


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_recording_the_noise_scale_under_fit_does_not_change_what_is_trained(cases, strategy):
    """`--loop fit` recording the noise scale at every execution (Keras's step with a half
    batch's gradient beside the whole's, on one device) trains as the user's `fit`; every
    step is recorded."""
    found = fidelity.compare(cases, "l2_dropout_bn", strategy, STEPS, 2, noise=True, loop="fit")
    assert found.epoch_difference < fidelity.BOUNDS["epochs"], found
    assert found.noise["steps"] * found.noise["big_batch"] == 2 * found.examples[1], found
    assert found.noise["small"] > found.noise["big"] > 0, found


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
@pytest.mark.parametrize(
    "case", ["add_loss", "compute_loss", "own_loss", "sgd_clipnorm", "schedule", "train_step"]
)
def test_each_keras_feature_trains_as_fit_trains_it(cases, case, strategy):
    _agrees(fidelity.compare(cases, case, strategy, STEPS, EPOCHS))


@pytest.mark.unit
def test_the_held_out_loss_is_kerass_evaluate_loss_with_the_models_own_losses(digits):
    """A regularised model's held-out loss, from `tfscale evaluate` and from the held-out
    clock, is what `model.evaluate` reports: the compiled loss plus `model.losses`."""
    import keras

    from tfscale.tasks.data.inputs import build_dataset
    from tfscale.tasks.train.evaluation import evaluate_keras_model
    from tfscale.tasks.train.model_inputs import as_model_takes
    from tfscale.tasks.train.objectives import Built
    from tfscale.tasks.train.to_target import HeldOut
    from tfscale.tasks.train.user_models import objective_from

    _, manifest, data_dir = digits
    keras.utils.set_random_seed(3)
    inputs = keras.Input(manifest.spec.shape)
    hidden = keras.layers.Dense(16, kernel_regularizer=keras.regularizers.L2(0.5))(
        keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))  # uint8, as stored
    )
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer="adam", loss=loss)
    test = build_dataset(as_model_takes(manifest, model), data_dir, "test", 64, training=False)
    expected = model.evaluate(test, verbose=0)
    assert sum(float(term) for term in model.losses) > 0.1 * expected  # the L2 term counts
    ours = evaluate_keras_model(model, manifest, data_dir, 64).test_loss
    built = Built(model, objective_from(model, manifest.spec))
    clocked = HeldOut(built, manifest, data_dir, 64, "loss").accuracy()
    assert ours == pytest.approx(expected, rel=1e-5)
    assert clocked == pytest.approx(expected, rel=1e-5)


@pytest.mark.unit
def test_a_start_apart_once_is_compared_again_and_twice_fails(monkeypatch):
    """Keras draws a model's initial seeds from Python's global random, which a thread left
    by other work may draw from between a seed and a build: `compare` runs again once
    where the starts differ, and a start that differs twice fails."""
    calls = []

    def once(*args):
        calls.append(args)
        if len(calls) <= apart:
            raise fidelity.StartsApart("train_step: fit's model does not start from ...")
        return "compared"

    monkeypatch.setattr(fidelity, "compare_once", once)
    apart = 1
    assert fidelity.compare(Path("cases"), "train_step", "mirrored") == "compared"
    assert len(calls) == 2
    calls.clear()
    apart = 2
    with pytest.raises(fidelity.StartsApart):
        fidelity.compare(Path("cases"), "train_step", "mirrored")
    assert len(calls) == 2


@pytest.mark.unit
@pytest.mark.parametrize("ending", ["dense_sigmoid", "activation_layer"])
def test_a_model_saved_uncompiled_is_evaluated_on_the_probabilities_it_outputs(tmp_path, ending):
    """A binary model ending in a sigmoid, saved without a compile and read back by
    `tfscale evaluate`: its outputs are probabilities, so its accuracy is Keras's
    `binary_accuracy` at 0.5 and its loss `binary_crossentropy` on them, not on logits."""
    import keras
    import numpy as np

    from tfscale.tasks.data.inputs import build_dataset
    from tfscale.tasks.train.evaluation import evaluate_model
    from tfscale.tasks.train.model_inputs import as_model_takes

    result = _binary_table(tmp_path)
    keras.utils.set_random_seed(1)
    inputs = {name: keras.Input((), name=name) for name in ("a", "b", "c")}
    joined = keras.layers.Concatenate()([keras.layers.Reshape((1,))(v) for v in inputs.values()])
    if ending == "dense_sigmoid":
        outputs = keras.layers.Dense(1, activation="sigmoid")(joined)
    else:
        outputs = keras.layers.Activation("sigmoid")(keras.layers.Dense(1)(joined))
    model = keras.Model(inputs, outputs)
    model.save(tmp_path / "model.keras")
    test = build_dataset(
        as_model_takes(result.manifest, model), result.data_dir, "test", 64, training=False
    )
    truth = np.concatenate([labels.numpy() for _, labels in test])
    probabilities = model.predict(test, verbose=0).reshape(-1)
    found = evaluate_model(str(tmp_path / "model.keras"), result.manifest, result.data_dir, 64)
    expected = float(np.mean((probabilities > 0.5) == truth))
    assert found.test_accuracy == pytest.approx(expected, abs=1e-9)
    assert abs(expected - truth.mean()) > 0.05  # not the positive rate by another route
    loss = keras.losses.BinaryCrossentropy()(truth.reshape(-1, 1), probabilities.reshape(-1, 1))
    assert found.test_loss == pytest.approx(float(loss), rel=1e-4)


def _binary_table(tmp_path, weighted=False):
    """A prepared table of 300 rows, three columns and a binary label `y` (`weighted`: and
    each row's weight, far from even, in a `w` column)."""
    import numpy as np
    import pandas as pd

    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.settings.config import load_config

    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, 3))
    y = (x @ [1.5, -1.0, 0.5] + rng.normal(size=300) > 0.4).astype(int)
    table = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": y})
    if weighted:
        table["w"] = np.where(y == 1, 4.0, 0.5) * rng.uniform(0.2, 2.0, size=300)
    table.to_csv(tmp_path / "t.csv", index=False)
    values = {"prepare.dataset": str(tmp_path / "t.csv"), "prepare.label": "y"}
    if weighted:
        values["prepare.sample_weight"] = "w"
    values["prepare.data_dir"] = str(tmp_path / "tfrecords")
    return prepare_dataset(load_config(None, values), progress=False)


@pytest.mark.unit
def test_weighted_metrics_count_each_held_out_example_by_its_weight_as_evaluate_does(tmp_path):
    """A table with a weight column and a model compiled with `weighted_metrics`: on the
    held-out split, `tfscale evaluate` and the to-target clock report each weighted metric
    under Keras's name, with Keras's value for `evaluate(x, y, sample_weight)`; the
    metrics compiled unweighted stay unweighted."""
    import keras

    from tfscale.tasks.data.inputs import Reading, build_dataset
    from tfscale.tasks.train.evaluation import evaluate_keras_model
    from tfscale.tasks.train.model_inputs import as_model_takes
    from tfscale.tasks.train.objectives import Built
    from tfscale.tasks.train.to_target import HeldOut
    from tfscale.tasks.train.user_models import objective_from

    result = _binary_table(tmp_path, weighted=True)
    manifest, data_dir = result.manifest, result.data_dir
    keras.utils.set_random_seed(4)
    inputs = {name: keras.Input((), name=name) for name in ("a", "b", "c")}
    joined = keras.layers.Concatenate()([keras.layers.Reshape((1,))(v) for v in inputs.values()])
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(joined))
    weighted = ["accuracy", keras.metrics.AUC(name="auc"), "mse"]
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"], weighted_metrics=weighted)
    model.optimizer.learning_rate.assign(0.1)
    taken = as_model_takes(manifest, model)
    train = build_dataset(taken, data_dir, "train", 64, True, Reading(weighted=True))
    model.fit(train, epochs=3, verbose=0)
    test = build_dataset(taken, data_dir, "test", 64, False, Reading(weighted=True))
    expected = model.evaluate(test, verbose=0, return_dict=True)
    assert abs(expected["weighted_accuracy"] - expected["accuracy"]) > 0.02  # weights count
    found = evaluate_keras_model(model, manifest, data_dir, 64)
    built = Built(model, objective_from(model, manifest.spec))
    for name in ("weighted_accuracy", "auc", "mse"):
        assert found.metrics[name] == pytest.approx(expected[name], rel=1e-5), name
        clocked = HeldOut(built, manifest, data_dir, 64, name).accuracy()
        assert clocked == pytest.approx(expected[name], rel=1e-5), name
    assert found.test_accuracy == pytest.approx(expected["accuracy"], rel=1e-5)


@pytest.mark.unit
def test_a_one_output_model_compiled_with_a_dict_loss_is_read_as_keras_reads_it(tmp_path):
    """`compile(loss={"diagnosis": ...})` on a model of one output named `diagnosis`:
    Keras trains it with that loss, and so does tfscale (its held-out loss is Keras's)."""
    import keras

    from tfscale.tasks.data.inputs import build_dataset
    from tfscale.tasks.train.evaluation import evaluate_keras_model
    from tfscale.tasks.train.model_inputs import as_model_takes

    result = _binary_table(tmp_path)
    keras.utils.set_random_seed(2)
    inputs = {name: keras.Input((), name=name) for name in ("a", "b", "c")}
    joined = keras.layers.Concatenate()([keras.layers.Reshape((1,))(v) for v in inputs.values()])
    outputs = keras.layers.Dense(1, activation="sigmoid", name="diagnosis")(joined)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss={"diagnosis": "binary_crossentropy"})
    taken = as_model_takes(result.manifest, model)
    test = build_dataset(taken, result.data_dir, "test", 64, training=False)
    expected = model.evaluate(test, verbose=0)
    found = evaluate_keras_model(model, result.manifest, result.data_dir, 64)
    assert found.test_loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
@pytest.mark.parametrize("case", ["class_weight", "balanced"])
def test_class_weights_train_as_fits_class_weight_trains_them(cases, case, strategy):
    """`train.class_weight`: given pairs on a compiled model (3 classes weighted 1, 3 and
    0.5), and `balanced` on an uncompiled one (the kind's loss): each example's loss
    weighed as `fit(class_weight=)` weighs it, under a strategy too."""
    _agrees(fidelity.compare(cases, case, strategy, STEPS, EPOCHS))


def test_class_weights_reach_kerass_own_fit_under_the_fit_loop(cases):
    """`--loop fit --class-weight ...`: tfscale's fit call is given the weights."""
    found = fidelity.compare(cases, "class_weight", "mirrored", STEPS, EPOCHS, loop="fit")
    assert found.epoch_difference < fidelity.BOUNDS["epochs"], found
    assert found.examples[0] == found.examples[1], found


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_multi_label_model_trains_as_fit_trains_it(cases, strategy):
    """Three 0/1 labels an example (an .npz's (n, 3) array, read as multi-label), a model
    of three logits compiled with binary cross-entropy: each step's loss as fit's."""
    _agrees(fidelity.compare(cases, "multi_label", strategy, STEPS, EPOCHS))


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_sample_weights_train_as_fits_sample_weight_trains_them(cases, strategy):
    """Arrays with a `sample_weight` array (far from even: 0 to 6): each example's loss
    weighed as `fit` weighs a dataset's (x, y, w), on one device and under Mirrored."""
    _agrees(fidelity.compare(cases, "sample_weight", strategy, STEPS, EPOCHS))


def test_sample_weights_reach_kerass_own_fit_under_the_fit_loop(cases):
    """`--loop fit` on weighted data: tfscale's fit call reads (x, y, w)."""
    found = fidelity.compare(cases, "sample_weight", "mirrored", STEPS, EPOCHS, loop="fit")
    assert found.epoch_difference < fidelity.BOUNDS["epochs"], found
    assert found.examples[0] == found.examples[1], found


@pytest.mark.integration
@pytest.mark.parametrize(
    "strategy, loop", [("one_device", "tfscale"), ("mirrored", "tfscale"), ("mirrored", "fit")]
)
def test_callbacks_stop_the_training_and_set_its_rate_as_fit_calls_them(cases, strategy, loop):
    """A model given with ReduceLROnPlateau (on the training loss), EarlyStopping (on the
    held-out loss) and CSVLogger, trained by tfscale's training run and by the user's own
    `fit(validation_data=)` on the same examples: the same epochs trained before the stop,
    the same rates (halved at least once), the same logs within the fidelity bounds."""
    ours, theirs = fidelity.compare_callbacks(cases, strategy, loop=loop)
    assert ours.epochs == theirs.epochs < 12, (ours.epochs, theirs.epochs)
    assert ours.column("learning_rate") == theirs.column("learning_rate")
    assert min(ours.column("learning_rate")) < max(ours.column("learning_rate"))
    for key in ("loss", "val_loss"):
        found = np.array(ours.column(key))
        expected = np.array(theirs.column(key))
        assert np.allclose(found, expected, rtol=2e-3, atol=0), (key, found, expected)
