"""What docs/your-model.md promises of a user's model, each at the narrowest boundary that
proves it, in this process (issue 61, item 2): the `package.module:function` form and a
function of no parameter, an uncompiled model's probabilities, a compiled schedule kept as
the rate, a `.keras` file's saved weights, `auto` cutting a user's model over the device's
memory, what a cut refuses, the target metric by name, a subclassed model without
`get_config`, a user's model in a TF_CONFIG cluster task, and `study(keras.Model, ...)`.

Models are a few Dense layers on the digits' spec; nothing here trains beyond building the
model and its optimizer."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import report, train_result

from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.data.spec import Feature, FeatureSpec, Label
from tfscale.tasks.distribute.strategy import select_strategy
from tfscale.tasks.settings.config import load_config
from tfscale.tasks.train.user_models import ModelError, objective_from, user_model

DIGITS = FeatureSpec.image((8, 8, 1), tuple("0123456789"))
BINARY = FeatureSpec((Feature("x", "float32", (4,)),), Label("binary", (), ("0", "1")))
DENSE = """
import keras

def build(spec):
    inputs = keras.Input(spec.shape, dtype="uint8")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(spec.label.outputs)(x), name="{name}")
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def train_config(**values):
    return load_config(None, {f"train.{k}": v for k, v in values.items()}).train


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project folder as the working directory; its modules forgotten after."""
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith(("shop_", "mine")):
            del sys.modules[name]


@pytest.mark.unit
def test_a_model_named_as_package_module_function_is_imported_from_where_tfscale_runs(
    project,
):
    """`--model shop.models:build`: a package's module importable from the working
    directory (not on the path before), its function called with the data's spec."""
    from tfscale.tasks.train.models import model_for_data

    write(project, "shop_doc/__init__.py", "")
    write(project, "shop_doc/models.py", DENSE.format(name="from_the_package"))
    config = load_config(None, {"train.model": "shop_doc.models:build"})
    model, objective = model_for_data(config.train.model, DIGITS)
    assert model.name == "from_the_package" and objective.label.kind == "class"
    # what it is trained for travels beside it, never on it: Keras's own attributes only
    assert [name for name in vars(model) if name.startswith("tfscale")] == []
    built_in, _ = model_for_data("mlp", DIGITS)
    assert [name for name in vars(built_in) if name.startswith("tfscale")] == []
    assert model.output_shape == (None, 10)


@pytest.mark.unit
def test_a_model_function_of_no_parameter_is_called_with_nothing(project):
    """`def build():` (and one whose parameters all have defaults) is called with nothing,
    not the spec."""
    write(
        project,
        "mine.py",
        """
        import keras

        def build():
            inputs = keras.Input((8, 8, 1))
            return keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)))

        def defaults(units=10, name="kept"):
            inputs = keras.Input((8, 8, 1))
            x = keras.layers.Flatten()(inputs)
            return keras.Model(inputs, keras.layers.Dense(units)(x), name=name)
        """,
    )
    assert user_model("mine.py:build", DIGITS).model.output_shape == (None, 10)
    assert user_model("mine.py:defaults", DIGITS).model.name == "kept"


@pytest.mark.unit
@pytest.mark.parametrize(
    "spec, last, from_logits",
    [
        (DIGITS, keras.layers.Dense(10, activation="softmax"), False),
        (DIGITS, keras.layers.Dense(10), True),
        (BINARY, keras.layers.Dense(1, activation="sigmoid"), False),
        (BINARY, keras.layers.Dense(1), True),
    ],
    ids=["softmax", "class logits", "sigmoid", "binary logits"],
)
def test_an_uncompiled_model_ending_in_softmax_or_sigmoid_is_trained_on_its_probabilities(
    spec, last, from_logits
):
    """Not compiled, the label kind's default loss takes the last layer's probabilities
    after a softmax or sigmoid (logits otherwise): the loss of a batch is Keras's own
    cross-entropy of those outputs, taken as what they are."""
    inputs = keras.Input(spec.shape)
    model = keras.Model(inputs, last(keras.layers.Flatten()(inputs)))
    objective = objective_from(model, spec, "mine.py:build")
    assert objective.from_logits is from_logits
    x = np.random.default_rng(0).normal(size=(6, *spec.shape)).astype("float32")
    labels = np.arange(6) % (10 if spec is DIGITS else 2)
    outputs = model(x)
    if spec is DIGITS:
        keras_loss = keras.losses.sparse_categorical_crossentropy(
            labels, outputs, from_logits=from_logits
        )
    else:
        keras_loss = keras.losses.binary_crossentropy(
            labels[:, None].astype("float32"), outputs, from_logits=from_logits
        )
    got = np.asarray(objective.loss(labels, outputs), "float64").reshape(-1)
    want = np.asarray(keras_loss, "float64").reshape(-1)
    np.testing.assert_allclose(got.mean(), want.mean(), rtol=1e-5)


@pytest.mark.unit
def test_an_uncompiled_models_regularisers_enter_its_step_loss():
    """Not compiled, a model's step loss is the label kind's loss over the batch plus its
    `model.losses` (a kernel's L2 penalty here), as Keras's `fit` adds them: the penalty,
    0.5 x the kernel's squared sum, worked from the weights, is in the loss tfscale's
    step takes the gradient of."""
    from tfscale.tasks.train.keras_meaning import step_loss

    inputs = keras.Input(DIGITS.shape)
    dense = keras.layers.Dense(10, kernel_regularizer=keras.regularizers.L2(0.5))
    model = keras.Model(inputs, dense(keras.layers.Flatten()(inputs)))
    objective = objective_from(model, DIGITS, "mine.py:build")
    x = np.random.default_rng(0).normal(size=(6, *DIGITS.shape)).astype("float32")
    labels = np.arange(6) % 10
    outputs = model(x)
    got = float(step_loss(model, objective, (x, labels, None), outputs, 6))
    penalty = 0.5 * float(np.sum(np.square(dense.kernel.numpy())))
    plain = keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
    assert penalty > 0.1
    assert got == pytest.approx(float(np.mean(plain)) + penalty, rel=1e-5)


def _built(digits, tmp_path, model: str, **train):
    """The model with its objective, and the optimizer, a training builds
    (`_model_and_optimizer`), on one device in its strategy's scope, for `model` on the
    digits."""
    import tensorflow as tf

    from tfscale.tasks.train.training import Rate, _model_and_optimizer

    overrides, manifest, _ = digits
    values = {**overrides, "train.model": model, **{f"train.{k}": v for k, v in train.items()}}
    cfg = load_config(None, values).train
    choice = select_strategy(report(), train_config(strategy="one_device"))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    return _model_and_optimizer(cfg, manifest, choice, strategy, (32, 64), Rate("linear"), 10)


@pytest.mark.unit
def test_a_compiled_schedule_is_kept_as_the_rate_with_rule_none(digits, project):
    """A model compiled with a learning-rate schedule trains on that schedule, unscaled and
    without warm-up (rule `none`), where a compiled constant rate is scaled by the rule."""
    write(
        project,
        "mine.py",
        DENSE.format(name="scheduled")
        + """
def scheduled(spec):
    model = build(spec)
    rate = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=5, decay_rate=0.5)
    model.compile(optimizer=keras.optimizers.SGD(rate), loss="sparse_categorical_crossentropy")
    return model

def constant(spec):
    model = build(spec)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    return model
""",
    )
    _, optimizer, rate = _built(digits, project, "mine.py:scheduled", warmup_epochs=2)
    assert (rate.rule, rate.value) == ("none", pytest.approx(0.01))
    schedule = optimizer._learning_rate
    assert isinstance(schedule, keras.optimizers.schedules.ExponentialDecay)
    assert float(schedule(10)) == pytest.approx(0.01 * 0.5**2)  # the user's decay, unscaled
    _, _, scaled = _built(digits, project, "mine.py:constant")
    assert (scaled.rule, scaled.value) == ("linear", pytest.approx(0.02))  # batch 64 over 32


@pytest.mark.unit
def test_a_saved_keras_file_starts_from_its_saved_weights(digits, project):
    """`--model two_inputs.keras`: the model a training builds holds the file's weights
    (as saved, not the seed's fresh initialisation), read from the file, not a second load."""
    spec = digits[1].spec
    inputs = keras.Input(spec.shape, dtype="uint8")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    saved = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Dense(16)(x)))
    rng = np.random.default_rng(7)
    saved.set_weights([rng.normal(size=w.shape).astype("float32") for w in saved.weights])
    saved.save(project / "mine.keras")
    (model, _), _, _ = _built(digits, project, str(project / "mine.keras"), seed=3)
    for got, want in zip(model.get_weights(), saved.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.unit
def test_auto_cuts_a_users_model_over_the_device_memory_into_pipeline_stages(project):
    """`auto` cuts a user's functional model that does not fit `train.device_memory_mb`
    into the fewest pipeline stages that hold it, as it cuts the built-ins, priced by the
    user's own layers; asked for whole by name, it is refused."""
    from tfscale.tasks.train.models import model_for_data
    from tfscale.tasks.train.stage_plan import (
        MB,
        fit_to_memory,
        footprint,
        layer_costs,
        plan_stages,
    )

    write(project, "mine.py", DENSE.format(name="wide"))

    class Digits:  # what fit_to_memory reads of a manifest
        spec = DIGITS

    model = model_for_data("mine.py:build", DIGITS).model
    whole = footprint(layer_costs(model), 32).total
    heaviest = max(fp.total for fp in plan_stages(model, 2, 32).footprints)
    budget = (whole + heaviest) / 2 / MB
    cfg = train_config(model="mine.py:build", device_memory_mb=budget)
    chosen = fit_to_memory(select_strategy(report(), cfg), cfg, Digits)
    assert (chosen.kind, chosen.stages) == ("pipeline", 2), chosen.reason
    assert f"model mine.py:build needs {whole / MB:.2f} MB" in chosen.reason
    asked = train_config(model="mine.py:build", strategy="mirrored", device_memory_mb=budget)
    with pytest.raises(UsageError, match="mirrored keeps the whole model on each device"):
        fit_to_memory(select_strategy(report(), asked), asked, Digits)


OWN = """
import keras

class OwnStep(keras.Model):
    def train_step(self, data):
        return super().train_step(data)

class OwnLoss(keras.Model):
    def compute_loss(self, *args, **kwargs):
        return super().compute_loss(*args, **kwargs)

def _build(cls, spec):
    inputs = keras.Input(spec.shape)
    x = keras.layers.Dense(8)(keras.layers.Flatten()(inputs))
    return cls(inputs, keras.layers.Dense(spec.label.outputs)(x))

def own_step(spec):
    return _build(OwnStep, spec)

def own_loss(spec):
    return _build(OwnLoss, spec)
"""


@pytest.mark.unit
@pytest.mark.parametrize(
    "function, lost", [("own_step", "its own train_step"), ("own_loss", "its own compute_loss")]
)
@pytest.mark.parametrize(
    "strategy", [{"strategy": "pipeline", "stages": 2}, {"strategy": "tensor_parallel"}]
)
def test_a_cut_is_refused_where_it_would_lose_the_models_own_training(
    project, function, lost, strategy
):
    """A pipeline or column cut trains each stage on the compiled loss alone: a model with
    its own `train_step` or `compute_loss` is refused for it, naming what it would lose and
    the data-parallel strategies; the same model data-parallel is not."""
    from tfscale.tasks.train.user_models import _check_how_trained

    write(project, "own.py", OWN)
    ref = f"own.py:{function}"
    model = user_model(ref, DIGITS).model
    cut = train_config(model=ref, **strategy)
    with pytest.raises(ModelError, match=f"cut trains each stage .* without {lost}") as caught:
        _check_how_trained(ref, model, cut, select_strategy(report(), cut))
    assert "--strategy mirrored" in caught.value.fix
    whole = train_config(model=ref, strategy="mirrored")
    _check_how_trained(ref, model, whole, select_strategy(report(), whole))


@pytest.mark.unit
def test_data_of_several_features_is_refused_for_a_pipeline_cut():
    """A cut model takes one input: data of several features (each an input of its own)
    is refused for `pipeline`, naming the count and the strategies that train it whole."""
    from tfscale.tasks.train.stage_plan import fit_to_memory

    class TwoFeatures:
        spec = FeatureSpec(
            (Feature("a", "float32", (3,)), Feature("b", "float32", (2,))), DIGITS.label
        )

    cfg = train_config(strategy="pipeline", stages=2)
    with pytest.raises(UsageError, match="this data has 2 features, each an input") as caught:
        fit_to_memory(select_strategy(report(), cfg), cfg, TwoFeatures)
    assert "mirrored" in caught.value.fix


@pytest.mark.unit
def test_a_subclassed_model_without_get_config_is_refused_before_training(digits, project):
    """A subclassed model whose `__init__` takes arguments and that has no `get_config`
    cannot be read back once trained: refused when checked, naming the model and the fix
    (exit 2); with `get_config` it passes."""
    from tfscale.tasks.train.user_models import check_user_model

    _, manifest, data_dir = digits
    write(
        project,
        "mine.py",
        """
        import keras

        class Mine(keras.Model):
            def __init__(self, units, **kwargs):
                super().__init__(**kwargs)
                self.units_ = units
                self.flat = keras.layers.Flatten()
                self.out = keras.layers.Dense(units)

            def call(self, x):
                return self.out(self.flat(keras.ops.cast(x, "float32") / 255))

        class Kept(Mine):
            def get_config(self):
                return {**super().get_config(), "units": self.units_}

        def build():
            return Mine(10, name="mine")

        def kept():
            return Kept(10, name="kept")
        """,
    )
    evaluate = load_config(None, {}).evaluate
    with pytest.raises(ModelError, match=r"the model mine \(Mine\) has no get_config") as caught:
        check_user_model("mine.py:build", manifest, data_dir, evaluate)
    assert caught.value.exit_code == 2 and "get_config" in caught.value.fix
    check_user_model("mine.py:kept", manifest, data_dir, evaluate)


def _task_run(digits, tmp_path, model: str, task: dict):
    """A run of `model` as the TF_CONFIG task `task` of a chief and two workers."""
    from tfscale.tasks.distribute.hardware import cluster_from_environment
    from tfscale.tasks.distribute.run import Run

    overrides, manifest, data_dir = digits
    spec = {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]}
    cluster = cluster_from_environment({"TF_CONFIG": json.dumps({"cluster": spec, "task": task})})
    config = load_config(
        None,
        {**overrides, "train.model": model, "train.runs_dir": str(tmp_path / "runs")},
    )
    hardware = report(cluster=cluster)
    return Run(config, manifest, data_dir, select_strategy(hardware, config.train), hardware)


@pytest.mark.unit
def test_a_tf_config_task_trains_and_evaluates_the_users_model(digits, project, monkeypatch):
    """In a cluster TF_CONFIG describes, a worker task checks the user's model against the
    data before it joins (a bad one refused there), then trains that model as the cluster's
    multi-worker strategy; the evaluator task builds the same user's model."""
    from tfscale.tasks.execute import trainings

    write(project, "mine.py", DENSE.format(name="users") + "\ndef bad(spec):\n    return 42\n")
    joined = []

    def task_trains(run, probe_steps=0):
        joined.append(run)
        return train_result(run_dir=str(run.run_dir))

    monkeypatch.setattr(trainings, "train_and_probe", task_trains)
    worker = {"type": "worker", "index": 1}
    with pytest.raises(ModelError, match="returned int, not a keras.Model"):
        trainings.run_training(_task_run(digits, project, "mine.py:bad", worker))
    assert joined == []  # refused before the task joins its cluster
    trainings.run_training(_task_run(digits, project, "mine.py:build", worker))
    (run,) = joined
    assert (run.choice.kind, run.train.model) == ("multi_worker", "mine.py:build")
    assert not run.role.chief and run.role.preemptible

    import tfscale.tasks.distribute.cluster as cluster_module

    def built(build_model, evaluate, run_dir, chief_wait_s):
        return [{"model": build_model().name}]

    monkeypatch.setattr(cluster_module, "evaluate_checkpoints", built)
    evaluator = _task_run(digits, project, "mine.py:build", {"type": "evaluator", "index": 0})
    assert trainings.evaluate_as_sidecar(evaluator) == [{"model": "users"}]


@pytest.mark.unit
def test_study_takes_a_keras_model_saved_once_by_its_weights(digits, tmp_path):
    """`study(keras.Model, ...)`: the model is saved once to a `.keras` file named by its
    weights (the same model, the same file; other weights, another), which the trainings
    read back with those weights."""
    from tfscale.flows.notebook import _model_ref

    spec = digits[1].spec

    def made(seed: int):
        keras.utils.set_random_seed(seed)
        inputs = keras.Input(spec.shape, dtype="uint8")
        x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
        return keras.Model(inputs, keras.layers.Dense(10)(x), name="mine")

    model = made(1)
    ref = _model_ref(model, tmp_path)
    assert ref.endswith(".keras") and _model_ref(model, tmp_path) == ref
    assert _model_ref(made(2), tmp_path) != ref
    read = user_model(ref, spec).model
    for got, want in zip(read.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
