"""Benchmark: does tfscale train what Keras's own `fit` trains? The same user model, seed,
shards and order of examples, trained by tfscale's loop and by `model.fit`, on one device
and under Mirrored over 2 logical CPUs at the same global batch; deterministic ops.

Each case is a model function as a user writes it (`CASES`: regularisers with Dropout and
BatchNormalization, `add_loss`, a `compute_loss` override, the `train_step` overrides of
Keras's guide "Customizing what happens in fit()", SGD with momentum and `clipnorm`, a
learning-rate schedule). For each the table gives the largest relative difference of the
loss after each of the first `--steps` steps, and of each of `--epochs` epochs' mean loss.

    uv run python benchmarks/fidelity.py [--steps 20] [--epochs 5] [--case l2_dropout_bn]

Each case runs under tfscale's loop and under `--loop fit` (`--loop` to pick one): the
`fit` rows train whole epochs at `train.steps_per_call` 8, which divides no epoch here,
so they show that an epoch trains exactly the examples the user's `fit` trains (fit logs
an execution's steps as one: their step column is `-`). Three cases are on a
table: an uncompiled model ending in a sigmoid, one input over the packed numeric
columns, and keras-io's `StringLookup` on a text column. Two train with class weights
(`CLASS_WEIGHTS`; the user's fit is given the same `class_weight`): pairs on a compiled
model, `balanced` on an uncompiled one. One trains on arrays that weigh each example
(`WEIGHTED_CASES`; the user's fit takes the weights as its dataset's third part), and one
on arrays of three 0/1 labels an example (`MULTI_LABEL_CASES`). One,
`callbacks`, gives ReduceLROnPlateau, EarlyStopping and CSVLogger beside the model and is
trained whole by tfscale's training run and by the user's `fit(validation_data=)`: the
row says after how many epochs each stopped and whether the rates were the same.

Target: steps within 1e-3 relative, epochs within 2%, the examples an epoch equal, every
case, both strategies, both loops.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FEATURES, CLASSES, ROWS, PER_REPLICA = 12, 3, 800, 32

MODELS = '''
import keras
from keras import layers, ops


def _body(spec, regularizer=None):
    inputs = keras.Input(shape=spec.features[0].shape, name=spec.features[0].name)
    hidden = layers.Dense(32, activation="relu", kernel_regularizer=regularizer)(inputs)
    return inputs, hidden


def l2_dropout_bn(spec):
    inputs, hidden = _body(spec, keras.regularizers.L2(0.05))
    hidden = layers.BatchNormalization()(hidden)
    hidden = layers.Dropout(0.3)(hidden)
    outputs = layers.Dense(spec.label.outputs, kernel_regularizer=keras.regularizers.L2(0.05))(
        hidden
    )
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@keras.saving.register_keras_serializable(package="fidelity")
class ActivityPenalty(layers.Layer):
    def call(self, x):
        self.add_loss(0.01 * ops.mean(ops.square(x)))
        return x


def add_loss(spec):
    inputs, hidden = _body(spec)
    outputs = layers.Dense(spec.label.outputs)(ActivityPenalty()(hidden))
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@keras.saving.register_keras_serializable(package="fidelity")
class ScaledLoss(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return 3.0 * super().compute_loss(x, y, y_pred, sample_weight, training)


def compute_loss(spec):
    inputs, hidden = _body(spec)
    model = ScaledLoss(inputs, layers.Dense(spec.label.outputs)(hidden))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@keras.saving.register_keras_serializable(package="fidelity")
class GuideStep(keras.Model):
    """The guide's first train_step: compute_loss, the optimizer, self.metrics."""

    def train_step(self, data):
        x, y = data
        import tensorflow as tf

        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def train_step(spec):
    inputs, hidden = _body(spec, keras.regularizers.L2(0.01))
    model = GuideStep(inputs, layers.Dense(spec.label.outputs)(layers.Dropout(0.2)(hidden)))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@keras.saving.register_keras_serializable(package="fidelity")
class OwnLoss(keras.Model):
    """The guide's second: a loss and metrics of its own, compiled with an optimizer only."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def train_step(self, data):
        x, y = data
        import tensorflow as tf

        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True)
            loss = ops.mean(loss)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


def own_loss(spec):
    inputs, hidden = _body(spec)
    model = OwnLoss(inputs, layers.Dense(spec.label.outputs)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    return model


def sgd_clipnorm(spec):
    inputs, hidden = _body(spec)
    model = keras.Model(inputs, layers.Dense(spec.label.outputs)(hidden))
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9, clipnorm=0.5)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def schedule(spec):
    inputs, hidden = _body(spec)
    model = keras.Model(inputs, layers.Dense(spec.label.outputs)(hidden))
    rate = keras.optimizers.schedules.ExponentialDecay(2e-2, decay_steps=10, decay_rate=0.8)
    model.compile(
        keras.optimizers.Adam(rate), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def uncompiled_sigmoid(spec):
    """Not compiled, ending in a sigmoid: the label kind's loss on its probabilities."""
    inputs = keras.Input(shape=(len(spec.numbers),), name="numbers")
    hidden = layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, layers.Dense(1, activation="sigmoid")(hidden))


def packed(spec):
    """One input over the table's numeric columns, compiled on logits."""
    inputs = keras.Input(shape=(len(spec.numbers),), name="numbers")
    hidden = layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, layers.Dense(1)(hidden))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def string_lookup(spec):
    """keras-io's structured data: a StringLookup on the text column, the numbers beside."""
    inputs = {
        f.keras_name: keras.Input(shape=(1,), name=f.keras_name, dtype=f.dtype)
        for f in spec.features
    }
    colour = layers.StringLookup(vocabulary=COLOURS, output_mode="one_hot")(inputs["colour"])
    numbers = [inputs[f.keras_name] for f in spec.features if f.name != "colour"]
    hidden = layers.Dense(16, activation="relu")(layers.Concatenate()([colour, *numbers]))
    model = keras.Model(inputs, layers.Dense(1)(hidden))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return model


def class_weight(spec):
    """Compiled on logits, trained with class weights (`CLASS_WEIGHTS`)."""
    inputs, hidden = _body(spec)
    model = keras.Model(inputs, layers.Dense(spec.label.outputs)(hidden))
    model.compile(
        keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def sample_weight(spec):
    """Compiled on logits, trained on arrays that weigh each example (`sample_weight`)."""
    return class_weight(spec)


def multi_label(spec):
    """Compiled on logits of several 0/1 labels at once (binary cross-entropy over each)."""
    inputs, hidden = _body(spec)
    model = keras.Model(inputs, layers.Dense(spec.label.outputs)(hidden))
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def callbacks(spec):
    """Compiled on logits, with the callbacks users' fit calls carry: the rate halved when
    the training loss stalls, the training stopped when the held-out loss does, and each
    epoch's logs written where `CALLBACKS_CSV` says."""
    import os

    return class_weight(spec), [
        keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=0.03),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.01),
        keras.callbacks.CSVLogger(os.environ["CALLBACKS_CSV"]),
    ]


def balanced(spec):
    """Not compiled (the label kind's loss on its logits), with balanced class weights
    (`CLASS_WEIGHTS`)."""
    inputs, hidden = _body(spec)
    return keras.Model(inputs, layers.Dense(spec.label.outputs)(hidden))


COLOURS = ["red", "green", "blue"]
'''

CASES = (
    "l2_dropout_bn", "add_loss", "compute_loss", "train_step", "own_loss", "sgd_clipnorm",
    "schedule", "uncompiled_sigmoid", "packed", "string_lookup", "class_weight", "balanced",
    "sample_weight", "multi_label",
)  # fmt: skip
# the case trained whole, its callbacks called (`compare_callbacks`): not step by step
CALLBACK_CASES = ("callbacks",)
# the cases on a table of 4 numeric columns, a text column and a binary label (the others:
# an .npz of one 12-wide array and 3 classes)
TABLE_CASES = ("uncompiled_sigmoid", "packed", "string_lookup")
# `train.class_weight` of the cases trained with class weights (the user's fit: the same as
# `fit(class_weight=)`); both on the arrays, whose 3 classes are far from even
CLASS_WEIGHTS = {"class_weight": "0=1,1=3,2=0.5", "balanced": "balanced"}
# the cases on the arrays with each example's weight (`weighted.npz`: the user's fit takes
# the same weights as the dataset's third part)
WEIGHTED_CASES = ("sample_weight",)
# the cases on arrays of several 0/1 labels an example (`labels.npz`: a multi-label target)
MULTI_LABEL_CASES = ("multi_label",)
TEXT_CASES = ("string_lookup",)
STRATEGIES = {"one_device": 1, "mirrored": 2}
# how far tfscale's loop may be from fit's (docs/your-model.md): the relative difference of
# each of the first steps' loss, of each epoch's mean loss, and, after the first steps, of
# each weight's change from the start and of each optimizer variable
BOUNDS = {"steps": 1e-4, "epochs": 2e-3, "weights": 1e-3, "slots": 1e-3}
LOOPS = ("tfscale", "fit")  # `fit`: tfscale's `--loop fit` against the user's own fit


@dataclass(frozen=True)
class Fidelity:
    """How far tfscale's training of a case is from `fit`'s: the largest relative
    difference of the loss after each of the first steps, and of each epoch's mean loss."""

    case: str
    strategy: str
    steps: int
    step_difference: float  # NaN under `--loop fit`: fit logs an execution's steps as one
    epoch_difference: float
    loop: str = "tfscale"
    examples: tuple[int, int] = (0, 0)  # trained per epoch: tfscale's, the user's fit's
    # after the first steps, the largest relative difference of a weight's change from the
    # start (`weights`) and of an optimizer variable (`slots`: Adam's moments, SGD's
    # momentum), each over its own size: where a doubled gradient shows under Adam, whose
    # steps it leaves as they were (NaN under `--loop fit`)
    weight_difference: float = math.nan
    slot_difference: float = math.nan
    # with `noise`: the noise scale's mean norms over the training (`GradientNoise.read`)
    noise: dict[str, Any] | None = None


def write_case_files(folder: Path) -> None:
    """The models (`models.py`), seeded arrays (`table.npz`: 3 classes) and a seeded table
    (`mixed.csv`: 4 numeric columns, a text one, a binary `target`) in `folder`."""
    import numpy as np
    import pandas as pd

    (folder / "models.py").write_text(MODELS)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    y = (x[:, :3].sum(1) > 0).astype("int64") + (x[:, 3] > 0.8).astype("int64")
    np.savez(folder / "table.npz", x=x, y=y)
    weights = rng.uniform(0.0, 3.0, ROWS).astype("float32") * (1 + (y == 2))  # far from even
    np.savez(folder / "weighted.npz", x=x, y=y, sample_weight=weights)
    several = np.stack([x[:, 0] > 0, x[:, 1] + x[:, 2] > 0.5, x[:, 3] < -0.3], axis=1)
    np.savez(folder / "labels.npz", x=x, y=several.astype("int64"))
    colour = rng.choice(["red", "green", "blue"], ROWS)
    table = pd.DataFrame(x[:, :4], columns=["a", "b", "c", "d"]).round(4)
    table["colour"] = colour
    table["target"] = ((x[:, 0] - x[:, 1] > 0) ^ (colour == "blue")).astype(int)
    table.to_csv(folder / "mixed.csv", index=False)


class StartsApart(AssertionError):
    """fit's model did not start from tfscale's weights."""


def compare(
    folder: Path,
    case: str,
    strategy: str,
    steps: int = 20,
    epochs: int = 5,
    noise: bool = False,
    loop: str = "tfscale",
) -> Fidelity:
    """`compare_once`, once more where the two models did not start alike: Keras draws a
    model's initial seeds from Python's global `random` (`make_default_seed`), which a
    thread left by other work in the process (a client's jittered retry, in a test
    session) may draw from between a seed and a build. A start that differs twice is
    not that, and fails."""
    try:
        return compare_once(folder, case, strategy, steps, epochs, noise, loop)
    except StartsApart:
        return compare_once(folder, case, strategy, steps, epochs, noise, loop)


def compare_once(
    folder: Path,
    case: str,
    strategy: str,
    steps: int = 20,
    epochs: int = 5,
    noise: bool = False,
    loop: str = "tfscale",
) -> Fidelity:
    """Trains `case` from `folder` (`write_case_files`) with tfscale's loop (or with `loop`
    fit, tfscale's `--loop fit`: whole epochs, `train.steps_per_call` 8, which divides no
    epoch here) and with the user's own `model.fit` (under `loop` fit: on the same
    pipeline, one step an execution), each from the same seeded start on the same
    examples in the same order, and measures how far apart their losses
    are, and the examples each trained an epoch. With `noise`, the loop (either) records the
    gradient noise scale at every step, as a training that measures it does."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import with_class_weights
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.settings.config import load_config
    from tfscale.tasks.train.fit_loop import NoiseRecording, fit_epochs
    from tfscale.tasks.train.models import model_for_data
    from tfscale.tasks.train.training import (
        _gradient_noise,
        set_up_training,
        train_dataset_fn,
        weights_digest,
    )

    values = _values(folder, case, strategy)
    values.update({"train.noise_scale": noise, "train.noise_scale_every": 1})
    values.update({"train.loop": loop, "train.steps_per_call": 8})  # dividing no epoch
    config = load_config(None, values)
    prepared = prepare_dataset(config, progress=False)
    manifest, data_dir = prepared.manifest, prepared.data_dir
    config = with_class_weights(config, manifest, data_dir)  # balanced: the data's weights
    choice = select_strategy(detect_hardware(), config.train)
    setup = set_up_training(config.train, manifest, choice)
    start = weights_digest(setup.model)
    initial = _state(setup.model, setup.optimizer)[0]
    recorder = _gradient_noise(setup, choice, config.train) if noise else None
    if noise and recorder is None:
        raise AssertionError(f"{case}: no gradient noise scale recorded on {strategy}")
    # the features as the model takes them (one packed vector, say); `--loop fit` reads
    # global batches, as its training does
    batch = setup.global_batch if loop == "fit" else setup.per_replica
    dataset_fn = train_dataset_fn(config.train, setup.manifest, data_dir, batch)
    if loop == "fit":  # one fit call, as `--loop fit` trains (`training._train_with_fit`)
        keras.utils.set_random_seed(config.train.seed)  # as `_same_examples` reads them
        recording = [NoiseRecording(recorder)] if recorder is not None else []
        train = dataclasses.replace(config.train, epochs=epochs)
        history = fit_epochs(setup, dataset_fn, train, (recording, None))
        ours = np.array(history.history["loss"])
        trained = int(setup.optimizer.iterations.numpy()) // epochs
    else:
        run_epoch = setup.epoch_runner(choice, dataset_fn)
        ours = np.array([run_epoch(1)[0] for _ in range(steps)])
        after_steps = _state(setup.model, setup.optimizer)
        rest = [run_epoch(1)[0] for _ in range(epochs * setup.steps - steps)]
        ours = np.concatenate([ours, rest])
        trained = setup.steps

    keras.utils.set_random_seed(config.train.seed)
    # Keras's fit takes no text over replicas (an AddN of strings as it distributes the
    # batch): the user's fit then runs outside the strategy at the same global batch, the
    # same arithmetic for a model without BatchNormalization
    apart = case in TEXT_CASES and setup.replicas > 1
    scope = tf.distribute.get_strategy() if apart else setup.strategy
    with scope.scope():
        built = model_for_data(config.train.model, manifest.spec)
        fitted = built.model
        if not fitted.compiled:  # the user compiles it for fit: the kind's loss, the rate
            rate = setup.learning_rate
            fitted.compile(keras.optimizers.Adam(rate), built.objective.keras_loss())
    if weights_digest(fitted) != start:
        raise StartsApart(f"{case}: fit's model does not start from tfscale's weights")
    train = _users_input(config.train, setup, data_dir, epochs, loop)
    losses = StepLosses(snapshot_at=steps)
    fitted.fit(
        train,
        epochs=epochs,
        steps_per_epoch=setup.steps,
        verbose=0,
        shuffle=False,
        callbacks=[losses],
        class_weight=setup.objective.keras_class_weight,  # as the user passes it to fit
    )
    theirs = np.array(losses.losses)
    by_epoch = (epochs, setup.steps)
    examples = (trained * setup.global_batch, setup.steps * setup.global_batch)
    norms = recorder.read() if recorder is not None else None
    if loop == "fit":
        theirs_by_epoch = theirs.reshape(by_epoch).mean(1)
        epoch_difference = _relative(ours, theirs_by_epoch)
        return Fidelity(
            case, strategy, steps, math.nan, epoch_difference, loop, examples, noise=norms
        )
    moved = _moved(initial, after_steps, losses.state)
    return Fidelity(
        case,
        strategy,
        steps,
        _relative(ours[:steps], theirs[:steps]),
        _relative(ours.reshape(by_epoch).mean(1), theirs.reshape(by_epoch).mean(1)),
        loop,
        examples,
        *moved,
        noise=norms,
    )


def _state(model, optimizer) -> tuple[list, list]:
    """The model's weights and the optimizer's variables (not its step count or rate) as
    arrays, in the order both builds make them."""
    import numpy as np

    slots = [
        v for v in optimizer.variables if len(v.shape) and "iteration" not in v.path
    ]  # fmt: skip
    return [np.asarray(w.numpy()) for w in model.weights], [np.asarray(v.numpy()) for v in slots]


def _moved(initial: list, ours: tuple[list, list], theirs: tuple[list, list]) -> tuple:
    """The largest difference of a weight's change from `initial`, and of an optimizer
    variable, between tfscale's and fit's, each over the size of fit's (a variable that
    did not move in fit, a frozen one, must not move in tfscale's either)."""
    import numpy as np

    def worst(pairs) -> float:
        return max(
            (float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)) for a, b in pairs),
            default=0.0,
        )

    if len(ours[0]) != len(theirs[0]) or len(ours[1]) != len(theirs[1]):
        raise AssertionError(f"the two trainings hold different variables: {ours}, {theirs}")
    weights = worst((a - s, b - s) for a, b, s in zip(ours[0], theirs[0], initial, strict=True))
    return weights, worst(zip(ours[1], theirs[1], strict=True))


@dataclass(frozen=True)
class Called:
    """What the user's callbacks did in a training: each epoch's logs as their CSVLogger
    wrote them (`epoch`, `loss`, `learning_rate` as ReduceLROnPlateau logged it before
    changing it, `val_loss`), the last epoch trained."""

    rows: tuple[dict[str, float], ...]

    @property
    def epochs(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> list[float]:
        return [row[name] for row in self.rows]


def compare_callbacks(
    folder: Path, strategy: str, epochs: int = 12, loop: str = "tfscale"
) -> tuple[Called, Called]:
    """The `callbacks` case trained by tfscale's training run (`train_model`: its loop
    calling the callbacks, or under `loop` fit, its `fit` call given them) and by the
    user's own `fit(validation_data=)` on the same examples in the same order: what each
    training's callbacks logged, (tfscale's, fit's)."""
    import csv

    import keras

    from tfscale.tasks.data.inputs import build_dataset
    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.settings.config import load_config
    from tfscale.tasks.train.callbacks import of
    from tfscale.tasks.train.models import model_for_data
    from tfscale.tasks.train.training import train_model

    logged = folder / "callbacks.csv"
    os.environ["CALLBACKS_CSV"] = str(logged)
    values = _values(folder, "callbacks", strategy)
    values.update({"train.epochs": epochs, "train.noise_scale": False})
    values.update({"train.runs_dir": str(folder / "runs"), "evaluate.every_epochs": 0})
    values.update({"train.loop": loop, "train.steps_per_call": 8})  # dividing no epoch
    config = load_config(None, values)
    prepared = prepare_dataset(config, progress=False)
    manifest, data_dir = prepared.manifest, prepared.data_dir
    report = detect_hardware()
    run = Run(config, manifest, data_dir, select_strategy(report, config.train), report)
    setup = train_model(run).setup

    def read() -> Called:
        with logged.open() as f:
            rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
        logged.unlink()
        return Called(tuple(rows))

    ours = read()
    keras.utils.set_random_seed(config.train.seed)
    with setup.strategy.scope():
        fitted = model_for_data(config.train.model, manifest.spec).model
    train = _users_input(config.train, setup, data_dir, epochs, loop)
    held_out = build_dataset(setup.manifest, data_dir, "test", 256, training=False)
    fitted.fit(
        train,
        epochs=epochs,
        steps_per_epoch=setup.steps,
        verbose=0,
        shuffle=False,
        callbacks=list(of(fitted)),  # what the model's function gave beside it
        validation_data=held_out,
    )
    return ours, read()


def _users_input(train: Any, setup: Any, data_dir: str, epochs: int, loop: str) -> Any:
    """The input the user's own `fit` takes, beside tfscale's training of `setup` (its
    `train` config): under `loop` fit, the same pipeline as tfscale's `fit` call reads
    (global batches, reseeded, labels as the model's loss takes them, any weights third);
    else the examples tfscale's replicas read, in their order (`_same_examples`)."""
    import keras

    from tfscale.tasks.train.training import train_dataset_fn

    if loop == "fit":
        dataset_fn = train_dataset_fn(train, setup.manifest, data_dir, setup.global_batch)
        keras.utils.set_random_seed(train.seed)
        labels = setup.objective.keras_labels  # the batches as the user hands them to fit
        return dataset_fn(None).map(lambda x, y, *w: (x, labels(y), *w))
    dataset_fn = train_dataset_fn(train, setup.manifest, data_dir, setup.per_replica)
    batches = epochs * setup.steps * setup.replicas
    return _same_examples(dataset_fn, train.seed, batches, setup.global_batch).repeat()


def _same_examples(dataset_fn, seed: int, batches: int, global_batch: int):
    """The examples tfscale's replicas read, in their order, as `fit`'s global batches:
    the first `batches` batches of the training input (made after the same seeding, so
    its shuffle is the same), each global batch its replicas' batches in turn (as `fit`
    under a strategy splits it). Held in memory, so that the batch `fit` takes to build
    its model under a strategy does not reshuffle the order it trains on."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    taken = list(dataset_fn(None).take(batches))  # (features, labels, and any weights)
    joined = tf.nest.map_structure(lambda *t: tf.concat(t, 0), *taken)
    return tf.data.Dataset.from_tensor_slices(joined).batch(global_batch)


def _values(folder: Path, case: str, strategy: str) -> dict:
    table = case in TABLE_CASES
    arrays = "weighted.npz" if case in WEIGHTED_CASES else "table.npz"
    arrays = "labels.npz" if case in MULTI_LABEL_CASES else arrays
    return {
        "prepare.dataset": str(folder / ("mixed.csv" if table else arrays)),
        "prepare.label": "target" if table else "label",
        "prepare.data_dir": str(folder / "data"),
        "train.model": f"{folder / 'models.py'}:{case}",
        "train.strategy": strategy,
        "train.replicas": STRATEGIES[strategy],
        "train.precision": "float32",
        "train.jit_compile": False,
        "train.batch_size_per_replica": PER_REPLICA,
        "train.lr_scaling": "none",  # fit knows no rule: its rate as compiled
        "train.warmup_epochs": 0,
        "train.class_weight": CLASS_WEIGHTS.get(case, "none"),
    }


def _relative(ours, theirs) -> float:
    import numpy as np

    return float(np.max(np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-12)))


class StepLosses:
    """A Keras callback keeping each step's own loss, from `fit`'s running mean, and the
    model's and optimizer's state after step `snapshot_at` (`_state`)."""

    def __new__(cls, snapshot_at: int = 0):
        import keras

        class Losses(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                self.losses, self.mean = [], 0.0  # the running mean restarts each epoch
                self.state = ([], [])

            def on_train_batch_end(self, batch, logs=None):
                k = batch + 1
                self.losses.append(k * logs["loss"] - (k - 1) * self.mean)
                self.mean = logs["loss"]
                if len(self.losses) == snapshot_at:
                    self.state = _state(self.model, self.model.optimizer)

        return Losses()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--case", action="append", choices=CASES + CALLBACK_CASES)
    parser.add_argument("--loop", action="append", choices=LOOPS, help="both by default")
    args = parser.parse_args()
    os.environ.setdefault("TF_DETERMINISTIC_OPS", "1")
    from tfscale.tasks.core.process import set_up_devices

    set_up_devices(2)
    rows = []
    print(
        f"{'case':<19} {'strategy':<11} {'loop':<8} {'steps':>8} {'epochs':>8} {'weights':>8} "
        f"{'slots':>8}  examples/epoch"
    )
    with tempfile.TemporaryDirectory() as tmp:
        write_case_files(Path(tmp))
        for case in args.case or CASES:
            if case in CALLBACK_CASES:
                continue  # trained whole, below
            for strategy in STRATEGIES:
                for loop in args.loop or LOOPS:
                    if case in TEXT_CASES and loop == "fit" and strategy != "one_device":
                        print(f"{case:<19} {strategy:<11} {loop:<8} refused before training")
                        continue
                    r = compare(Path(tmp), case, strategy, args.steps, args.epochs, loop=loop)
                    rows.append(r)
                    first, weights, slots = (
                        "-" if math.isnan(v) else f"{v:.1e}"
                        for v in (r.step_difference, r.weight_difference, r.slot_difference)
                    )
                    print(
                        f"{r.case:<19} {r.strategy:<11} {r.loop:<8} {first:>8} "
                        f"{r.epoch_difference:>8.1e} {weights:>8} {slots:>8}  "
                        f"{r.examples[0]:,} (fit {r.examples[1]:,})",
                        flush=True,
                    )
        if not args.case or "callbacks" in args.case:
            rows += _callback_rows(Path(tmp), args.loop or LOOPS)
    fields = {"steps": "step", "epochs": "epoch", "weights": "weight", "slots": "slot"}
    worst = {
        name: max(
            (getattr(r, f"{field}_difference") for r in rows),
            key=lambda v: -1.0 if math.isnan(v) else v,
            default=0.0,
        )
        for name, field in fields.items()
    }
    apart = [r for r in rows if r.examples[0] != r.examples[1]]
    print(
        "largest: "
        + ", ".join(f"{name} {worst[name]:.1e} (bound {BOUNDS[name]:.0e})" for name in BOUNDS)
        + f"; {len(apart)} of {len(rows)} train other examples an epoch than fit, or stop at "
        "another epoch, or set other rates (target 0)"
    )
    within = all(not worst[name] > BOUNDS[name] for name in BOUNDS)  # NaN: not measured
    return 0 if within and not apart else 1


def _callback_rows(folder: Path, loops: tuple[str, ...]) -> list[Fidelity]:
    """The `callbacks` case on each strategy and loop (`compare_callbacks`): printed with
    the epochs each training ran before EarlyStopping stopped it and whether
    ReduceLROnPlateau set the same rates; as rows whose examples differ where either
    does not match `fit`."""
    import numpy as np

    rows = []
    for strategy in STRATEGIES:
        for loop in loops:
            ours, theirs = compare_callbacks(folder, strategy, loop=loop)
            n = min(ours.epochs, theirs.epochs)
            a, b = np.array(ours.column("loss")[:n]), np.array(theirs.column("loss")[:n])
            same = ours.column("learning_rate") == theirs.column("learning_rate")
            rates = sorted(set(ours.column("learning_rate")), reverse=True)
            print(
                f"{'callbacks':<19} {strategy:<11} {loop:<8} {'-':>8} "
                f"{_relative(a, b):>8.1e}  stopped after {ours.epochs} epochs (fit "
                f"{theirs.epochs}); rates {', '.join(f'{r:g}' for r in rates)} "
                f"({'as' if same else 'NOT as'} fit's)",
                flush=True,
            )
            alike = ours.epochs == theirs.epochs and same
            rows.append(
                Fidelity("callbacks", strategy, 0, float("nan"), _relative(a, b), loop,
                         (ours.epochs, ours.epochs if alike else -1))
            )  # fmt: skip
    return rows


if __name__ == "__main__":
    sys.exit(main())
