"""The user's own Keras model (`--model`): the four examples of docs/your-model.md trained
for real (in this process, and one as a real `tfscale run` process in a project with its
own `tasks` module), and each bad model refused in one line before anything is written.

The data is what scikit-learn ships (breast cancer, diabetes, digits) and seeded token
sequences, written to files by each test."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tfscale.tasks.data.preparation import prepare_dataset
from tfscale.tasks.settings.config import load_config
from tfscale.tasks.train.user_models import ModelError

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def cancer_csv(folder: Path) -> Path:
    from sklearn.datasets import load_breast_cancer

    path = folder / "cancer.csv"
    load_breast_cancer(as_frame=True).frame.to_csv(path, index=False)
    return path


def config_for(tmp_path: Path, dataset: str, model: str, **extra):
    values = {
        "prepare.dataset": dataset,
        "prepare.label": "target" if dataset.endswith(".csv") else "label",
        "prepare.data_dir": str(tmp_path / "tfrecords"),
        "train.runs_dir": str(tmp_path / "runs"),
        "train.model": model,
        "train.strategy": "mirrored",
        "train.replicas": 2,
        "train.epochs": 3,
        "train.precision": "float32",
        "train.jit_compile": False,
        "train.batch_size_per_replica": 16,
        **extra,
    }
    return load_config(None, values)


def trained(config):
    """The prepared data and a training on 2 replicas of `config`, in this process."""
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.execute.trainings import run_training

    prepared = prepare_dataset(config, progress=False)
    report = detect_hardware()
    choice = select_strategy(report, config.train)
    run = Run(config, prepared.manifest, prepared.data_dir, choice, report)
    return prepared, run_training(run)


def assert_a_measured_range(result) -> None:
    """The speedup's range is a 95% interval over its rounds (or epochs): several, apart.
    That the median lies inside it holds by how a median is made; a range collapsed onto
    its point, or none, is what would be wrong."""
    low, point, high = result.speedup_low, result.speedup, result.speedup_high
    assert low is not None and high is not None, result.measured_over
    assert 0 < low < high and low <= point <= high, (low, point, high, result.measured_over)


@pytest.fixture
def examples(tmp_path, monkeypatch):
    for path in EXAMPLES.glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.integration
def test_a_table_classifier_with_adamw_and_auc_trains_to_its_auc_target(examples):
    """Its optimizer (AdamW, Keras's own update), its loss on a sigmoid's probabilities and
    its AUC as the target; evaluated with the model's own metrics."""
    from tfscale.tasks.train.evaluation import evaluate_model

    config = config_for(
        examples,
        str(cancer_csv(examples)),
        "table_classifier.py:build",
        **{"evaluate.target_metric": "auc", "evaluate.target": 0.95, "train.epochs": 4},
    )
    prepared, result = trained(config)
    assert result.optimizer == "AdamW" and result.model_parameters == 30 * 32 + 32 + 33
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0] < 1.0, losses  # probabilities, not logits, into the loss
    assert (result.to_target["metric"], result.to_target["reached"]) == ("auc", True)
    assert "heldout_auc" in result.history[-1]
    evaluation = evaluate_model(result.model_path, prepared.manifest, prepared.data_dir, 64)
    assert evaluation.metrics["auc"] > 0.95 and evaluation.test_accuracy > 0.85, evaluation


@pytest.mark.integration
def test_a_model_of_one_input_over_the_columns_trains_evaluates_and_reads_back(examples):
    """`keras.Input(shape=(30,))` over the breast-cancer table, as `model.fit` takes
    `df.values`: it trains under Mirrored, `tfscale evaluate`'s path reads the saved file
    back and feeds it the same vector, and its AUC is a classifier's."""
    from tfscale.tasks.train.evaluation import evaluate_model

    config = config_for(
        examples, str(cancer_csv(examples)), "table_one_input.py:build", **{"train.epochs": 4}
    )
    prepared, result = trained(config)
    assert result.model_parameters == 30 * 32 + 32 + 33
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0], losses
    evaluation = evaluate_model(result.model_path, prepared.manifest, prepared.data_dir, 64)
    assert evaluation.metrics["auc"] > 0.95 and evaluation.examples == 114, evaluation


@pytest.mark.integration
def test_a_regression_reaches_its_mean_absolute_error_target_from_above(examples):
    from sklearn.datasets import load_diabetes

    load_diabetes(as_frame=True).frame.to_csv(examples / "diabetes.csv", index=False)
    config = config_for(
        examples,
        "diabetes.csv",
        "table_regression.py:build",
        **{"evaluate.target": 55.0, "train.epochs": 4},
    )
    _, result = trained(config)
    target = result.to_target
    assert (target["metric"], target["lower_is_better"]) == ("mean_absolute_error", True)
    assert target["reached"] and target["best_accuracy"] <= 55.0, target
    # reached at the first evaluation at or below the target, none before it
    firsts = [e for e in result.evaluations if e["accuracy"] <= 55.0]
    assert firsts[0]["examples"] == target["examples"]


@pytest.mark.integration
def test_a_sequence_model_with_sgd_and_momentum_trains_on_a_pipeline(examples):
    """SGD with momentum, Keras's own update inside tfscale's step, with the gradient noise
    scale's raw norms recorded at its all-reduce (Adam's preconditioned ones: none)."""
    config = config_for(
        examples,
        "sequences.py:tokens",
        "sequences.py:build",
        **{
            "evaluate.target_metric": "binary_accuracy",
            "evaluate.target": 0.9,
            "train.epochs": 5,
            "train.batch_size_per_replica": 32,
            "train.noise_scale_every": 1,
        },
    )
    _, result = trained(config)
    assert result.optimizer == "SGD (momentum 0.9)"
    assert result.to_target["reached"], result.to_target
    windows = [w for w in result.gradient_noise if w["steps"]]
    assert windows and all(w["small"] > 0 and w["small_adam"] is None for w in windows)


@pytest.mark.integration
def test_a_two_input_model_saved_as_keras_trains_from_the_same_weights_each_time(
    examples, monkeypatch
):
    """Each model the training builds (under the strategy's scope, placed, seeded) starts
    from the weights saved in the .keras file, not from a fresh initialisation."""
    import keras

    import tfscale.tasks.train.training as training

    monkeypatch.syspath_prepend(str(examples))  # alone in its worker: nothing imported it
    import two_inputs

    two_inputs.arrays(str(examples / "digits2.npz"))
    saved = two_inputs.save(str(examples / "two_inputs.keras"))
    on_file = keras.models.load_model(saved).get_weights()
    starts = []
    build = training.model_for_data

    def recorded(*args, **kwargs):
        built = build(*args, **kwargs)
        starts.append([np.array(w) for w in built.model.get_weights()])
        return built

    monkeypatch.setattr(training, "model_for_data", recorded)
    config = config_for(examples, "digits2.npz", saved, **{"train.epochs": 2})
    prepared, result = trained(config)
    assert [f.name for f in prepared.manifest.spec.features] == ["pixels", "hint"]
    assert result.history[-1]["accuracy"] > 0.5
    assert starts, "the training built no model through model_for_data"
    for start in starts:
        assert all(np.array_equal(a, b) for a, b in zip(start, on_file, strict=True))


BAD = {
    "not_a_model": "def build(spec):\n    return 42\n",
    "raises": "def build(spec):\n    raise RuntimeError('no GPU here, says the user')\n",
    "wrong_inputs": textwrap.dedent(
        """
        import keras
        def build(spec):
            x = keras.Input(shape=(7,), name="colour")
            return keras.Model(x, keras.layers.Dense(2)(x))
        """
    ),
    "wrong_outputs": textwrap.dedent(
        """
        import keras
        def build(spec):
            inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
            x = keras.layers.Concatenate()(list(inputs.values()))
            return keras.Model(inputs, keras.layers.Dense(5)(x))
        """
    ),
    "wrong_loss": textwrap.dedent(
        """
        import keras
        def build(spec):
            inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
            x = keras.layers.Concatenate()(list(inputs.values()))
            model = keras.Model(inputs, keras.layers.Dense(1)(x))
            model.compile("adam", "sparse_categorical_crossentropy")
            return model
        """
    ),
    "no_config": textwrap.dedent(
        """
        import keras
        class Scale(keras.layers.Layer):
            def __init__(self, factor):
                super().__init__()
                self.factor = factor
            def call(self, x):
                return x * self.factor
        def build(spec):
            inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
            x = Scale(2.0)(keras.layers.Concatenate()(list(inputs.values())))
            return keras.Model(inputs, keras.layers.Dense(1)(x))
        """
    ),
    "two_outputs": textwrap.dedent(
        """
        import keras
        def build(spec):
            inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
            x = keras.layers.Concatenate()(list(inputs.values()))
            return keras.Model(inputs, [keras.layers.Dense(1)(x), keras.layers.Dense(1)(x)])
        """
    ),
    "raising_step": textwrap.dedent(
        """
        import keras
        class Raising(keras.Model):
            def train_step(self, data):
                raise RuntimeError("the user's own step ran")
        def build(spec):
            inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
            x = keras.layers.Concatenate()(list(inputs.values()))
            model = Raising(inputs, keras.layers.Dense(1)(x))
            model.compile(optimizer="adam", loss="binary_crossentropy")
            return model
        """
    ),
    "exits": textwrap.dedent(
        """
        import sys
        def build(spec):
            sys.exit(0)
        """
    ),
    "mc_dropout": textwrap.dedent(
        """
        import keras
        class MonteCarlo(keras.Model):  # an evaluation of 8 passes with dropout on
            def test_step(self, data):
                x, y = data
                y_pred = keras.ops.mean(
                    keras.ops.stack([self(x, training=True) for _ in range(8)]), axis=0
                )
                return self.compute_metrics(x, y, y_pred)
        def build(spec):
            inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
            x = keras.layers.Dropout(0.5)(keras.layers.Concatenate()(list(inputs.values())))
            model = MonteCarlo(inputs, keras.layers.Dense(1)(x))
            model.compile(optimizer="adam", loss="binary_crossentropy")
            return model
        """
    ),
    "gan": textwrap.dedent(
        """
        import keras
        import tensorflow as tf
        class GAN(keras.Model):  # Keras's guide: no call(), two optimizers of its own
            def __init__(self, discriminator, generator):
                super().__init__()
                self.discriminator, self.generator = discriminator, generator
            def compile(self, d_optimizer, g_optimizer, loss_fn):
                super().compile()
                self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
                self.loss_fn = loss_fn
            def train_step(self, data):
                return {}
        def build(spec):
            discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
            gan = GAN(discriminator, generator)
            gan.compile(keras.optimizers.Adam(), keras.optimizers.Adam(),
                        keras.losses.BinaryCrossentropy(from_logits=True))
            return gan
        """
    ),
    "own_optimizers": textwrap.dedent(
        """
        import keras
        import tensorflow as tf
        class TwoOptimizers(keras.Model):
            def compile(self, first, second):
                super().compile()
                self.first, self.second = first, second
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = keras.ops.mean(keras.ops.square(self(x, training=True)))
                grads = tape.gradient(loss, self.trainable_variables)
                self.first.apply(grads, self.trainable_variables)
                return {"loss": loss}
        def build(spec):
            inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
            x = keras.layers.Concatenate()(list(inputs.values()))
            model = TwoOptimizers(inputs, keras.layers.Dense(1)(x))
            model.compile(keras.optimizers.Adam(), keras.optimizers.SGD())
            return model
        """
    ),
    "overflowing": textwrap.dedent(
        """
        import keras
        def build(spec):
            inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
            x = keras.layers.Concatenate()(list(inputs.values()))
            huge = keras.initializers.Constant(1e38)
            return keras.Model(inputs, keras.layers.Dense(1, kernel_initializer=huge)(x))
        """
    ),
    "regularised": textwrap.dedent(
        """
        import keras
        def build(spec):
            inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
            x = keras.layers.Concatenate()(list(inputs.values()))
            x = keras.layers.Dense(8, kernel_regularizer=keras.regularizers.L2(0.1))(x)
            return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(x)))
        """
    ),
}


@pytest.mark.unit
@pytest.mark.parametrize(
    "model, flags, expected, exit_code",
    [
        ("nowhere.py:build", [], r"nowhere.py: no such file", 2),
        ("broken.py:build", [], r"did not import: SyntaxError", 2),
        ("bad.py:missing", [], r"has no function 'missing'.*defines", 2),
        ("bad.py:not_a_model", [], r"returned int, not a keras.Model", 2),
        ("bad.py:raises", [], r"raised RuntimeError: no GPU here, says the user", 1),
        ("bad.py:wrong_inputs", [], r"does not take this data's features.*colour.*mean", 2),
        ("bad.py:wrong_outputs", [], r"gives 5 output\(s\).*needs 1", 2),
        (
            "bad.py:wrong_loss",
            [],
            r"loss \(sparse_categorical_crossentropy\) does not fit the label.s kind \(binary\)",
            2,
        ),
        (
            "bad.py:no_config",
            [],
            r"(?s)layer scale \(Scale\) does not rebuild from its config.*get_config",
            2,
        ),
        ("table_classifier.py:build", ["--target-metric", "f1"], r"does not report it", 2),
        ("bad.py:two_outputs", [], r"gives 2 outputs; tfscale's data has one label", 2),
        ("bad.py:raising_step", [], r"train_step raised RuntimeError: the user's own step", 1),
        (
            "bad.py:raising_step",
            ["--grad-accum-steps", "2"],
            r"(?s)own train_step applies each batch's gradients itself.*--grad-accum-steps 1",
            2,
        ),
        (
            "bad.py:own_optimizers",
            [],
            r"train_step does not update through model.optimizer but through first, second",
            2,
        ),
        (
            "bad.py:regularised",
            ["--strategy", "pipeline", "--stages", "2"],
            r"a pipeline cut trains each stage on the compiled loss alone, without 1 regular",
            2,
        ),
        ("bad.py:overflowing", [], r"outputs on a first batch, before any training, are not", 2),
        ("damaged.keras", [], r"damaged.keras did not load", 2),
        ("empty.keras", [], r"empty.keras is empty \(0 bytes\)", 2),
        ("bad.py:mc_dropout", [], r"overrides test_step, its own evaluation", 2),
        ("bad.py:exits", [], r"exited \(sys.exit\(0\)\) instead of returning a model", 1),
        ("args.py:build", [], r"exited while tfscale imported it \(sys.exit\(2\)\)", 2),
        ("bad.py:gan", [], r"through model.optimizer but through d_optimizer, g_optimizer", 2),
        (
            "bad.py:gan",
            ["--loop", "fit"],
            r"through model.optimizer but through d_optimizer, g_optimizer",
            2,
        ),
        ("model.h5", [], r"train.model: expected mlp, cnn", 2),
    ],
)
def test_a_bad_model_is_refused_in_one_line_before_anything_is_written(
    model, flags, expected, exit_code, examples, tmp_path
):
    import re

    from helpers import run_main, tiny_params

    (tmp_path / "bad.py").write_text(_bad_module())
    (tmp_path / "broken.py").write_text("def build(:\n")
    (tmp_path / "args.py").write_text(  # a training script, its flags parsed at import
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--lr')\n"
        "parser.add_argument('rest')\nargs = parser.parse_args()\ndef build(spec): ...\n"
    )
    (tmp_path / "damaged.keras").write_bytes(b"PK\x03\x04 not a zip")
    (tmp_path / "empty.keras").write_bytes(b"")
    cancer_csv(tmp_path)
    params = ["--params", str(tiny_params(tmp_path, **{"track.store_dir": "mlflow"}))]
    data = ["--dataset", "cancer.csv", "--label", "target"]
    assert run_main([*params, "prepare", *data], tmp_path)[0] == 0
    argv = [*params, "train", *data, "--model", model, "--no-diagnose", *flags]
    code, out, err = run_main(argv, tmp_path)
    assert code == exit_code, (out, err[-2000:])
    assert re.search(expected, err), err[-2000:]
    assert "Traceback" not in err and "\x1b[" not in err
    assert "model.fit" not in err or "own evaluation" in err  # no fix tfscale refuses too
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))
    store = tmp_path / "mlflow" / "mlflow.db"
    if store.exists():  # no MLflow run left RUNNING
        with sqlite3.connect(store) as conn:
            running = conn.execute("select name from runs where status = 'RUNNING'").fetchall()
        assert not running, running


@pytest.mark.unit
def test_a_function_that_raises_or_returns_no_model_is_refused_as_its_own_kind(tmp_path):
    """In process, the function called as training would call it: one that raises is
    `ModelRaised` (exit code 1, the user's error in one line), one returning no model
    `ModelError` (exit code 2), before the data's spec is looked at."""
    from tfscale.tasks.train.user_models import ModelRaised, user_model

    (tmp_path / "bad.py").write_text(_bad_module())
    with pytest.raises(ModelRaised, match="raised RuntimeError: no GPU here") as raised:
        user_model(f"{tmp_path / 'bad.py'}:raises", None)
    assert raised.value.exit_code == 1 and not isinstance(raised.value, ModelError)
    with pytest.raises(ModelError, match="returned int, not a keras.Model") as none:
        user_model(f"{tmp_path / 'bad.py'}:not_a_model", None)
    assert none.value.exit_code == 2


def _bad_module() -> str:
    """Each of `BAD`'s functions under its own name, in one module."""
    parts = []
    for name, text in BAD.items():
        parts.append(text.replace("def build(spec)", f"def {name}(spec)"))
    return "\n".join(parts)


@pytest.mark.integration
@pytest.mark.cluster(alone=False)  # local processes; the answer's speedup not asserted
def test_the_study_on_a_users_model_in_a_project_with_its_own_tasks_and_flows(tmp_path):
    """`tfscale run` as a user types it, in a project whose own `tasks` module the model
    imports and which has a `flows` package too: the baseline here and 2 worker processes
    build the model, and the answer speaks of its AUC target, with intervals; MLflow names
    the model's source, its parameters and optimizer, and registers it."""
    from helpers import console_row, tfscale, tiny_params

    import mlflow

    cancer_csv(tmp_path)
    (tmp_path / "tasks.py").write_text("WIDTH = 24  # the project's own tasks module\n")
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "__init__.py").write_text('"""The project\'s own flows."""\n')
    source = (EXAMPLES / "table_classifier.py").read_text()
    mine = source.replace("import keras\n", "import keras\nfrom tasks import WIDTH\n", 1)
    (tmp_path / "mine.py").write_text(mine.replace("Dense(32,", "Dense(WIDTH,"))
    # the workers' rounds in blocks of 10 steps: their interval is asserted, not its width;
    # plain steps: no claim reads the gradient noise scale
    least = {"train.measure_steps": 10, "train.noise_scale": False}
    params = tiny_params(tmp_path, **{"track.store_dir": "mlflow", **least})
    argv = ["--params", str(params), "run", "--dataset", "cancer.csv", "--label", "target"]
    argv += ["--model", "mine.py:build", "--target-metric", "auc", "--target", "0.95"]
    argv += ["--strategy", "multi_worker", "--workers", "2", "--epochs", "4"]
    out = tfscale(argv, tmp_path).stdout
    answer = console_row(out, "answer")
    assert answer.startswith("2 replicas: examples/s "), answer
    assert console_row(out, "strategy").startswith("multi_worker, 2 replicas, float32")
    assert re.search(r", to held-out AUC 0.95 \d\.\d\dx \(\d\.\d\d-\d\.\d\d\): ", answer), answer
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    runs = client.search_runs(client.search_experiments()[0].experiment_id)
    parent = next(r for r in runs if "target_metric" in r.data.params)
    params_seen = parent.data.params
    assert params_seen["model"] == "mine.py:build" and params_seen["target_metric"] == "auc"
    assert params_seen["model_parameters"] == str(30 * 24 + 24 + 25)
    assert params_seen["optimizer"] == "AdamW"
    names = [m.name for m in client.search_registered_models()]
    assert names == ["tfscale-cancer.csv-mine.py-build"]
    # the whole answer heads the run's page: what ran, on what
    said = parent.data.tags["mlflow.note.content"]
    assert "(multi_worker, float32; mine.py:build on cancer.csv)" in said, said


@pytest.mark.unit
def test_a_models_cache_key_is_its_files_contents(tmp_path, monkeypatch):
    """A changed model file is a new key (the baseline trains again); the same file, the
    same key; a built-in's, its name."""
    from tfscale.tasks.core.user_code import model_fingerprint

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("def build():\n    pass\n")
    first = model_fingerprint("mine.py:build")
    assert model_fingerprint("mine.py:build") == first
    (tmp_path / "mine.py").write_text("def build():\n    return None\n")
    assert model_fingerprint("mine.py:build") != first
    assert model_fingerprint("cnn") == "cnn"


@pytest.mark.unit
def test_dvcs_stages_depend_on_the_users_files_and_refuse_one_outside_them(tmp_path):
    """dvc.yaml's stages that prepare, train or sweep depend on `prepare.files` or
    `train.files`, which DVC hashes itself; run by a stage (DVC_STAGE set), a command whose
    dataset or model file is not among them is refused, naming the file and the key, and
    so is a named file that does not exist. Outside DVC neither is looked at."""
    import yaml
    from helpers import run_main

    stages = yaml.safe_load((EXAMPLES.parents[1] / "dvc.yaml").read_text())["stages"]
    assert "${prepare.files}" in stages["prepare"]["deps"]
    for stage in ("baseline", "train", "sweep"):
        assert "${train.files}" in stages[stage]["deps"]
    assert not any(stage.get("always_changed") for stage in stages.values())

    cancer_csv(tmp_path)
    (tmp_path / "mine.py").write_text("def build():\n    pass\n")
    (tmp_path / "models").mkdir()
    dvc = {"DVC_STAGE": "prepare"}

    def refused(argv: list[str], env: dict) -> str:
        code, _, err = run_main(argv, tmp_path, env)
        assert code == 2, err
        return err

    # the defaults name the built-ins' modules, which a user's folder does not have
    err = refused(["prepare", "--dataset", "cancer.csv"], dvc)
    assert "error: prepare.files: tasks/data/datasets.py does not exist" in err
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"prepare": {"files": "mine.py"}, "train": {"files": "models"}})
    )
    err = refused(["prepare", "--dataset", "cancer.csv"], dvc)
    assert "prepare.dataset cancer.csv reads cancer.csv, which is not in prepare.files" in err
    assert "fix: set prepare.files: cancer.csv" in err
    for command in ("train", "sweep"):
        err = refused([command, "--model", "mine.py:build"], {"DVC_STAGE": command})
        assert f"{command}.model mine.py:build reads mine.py, which is not in train.files" in err
    from tfscale.tasks.core.user_code import check_dvc_dep

    # a file itself, or in a folder named; a built-in's name reads no file
    (tmp_path / "models" / "net.py").write_text("def build():\n    pass\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        check_dvc_dep("cancer.csv", "prepare.dataset", "cancer.csv", "prepare.files")
        check_dvc_dep("models/net.py:build", "train.model", "models", "train.files")
        check_dvc_dep("cnn", "train.model", "models", "train.files")


@pytest.mark.integration
def test_one_call_in_a_notebook_gives_the_study_of_a_function_on_a_dataset(tmp_path, monkeypatch):
    """`study(build, dataset)` as a notebook calls it: a function defined here and a
    tf.data.Dataset, both handed over in this process; the answer, the interval, the time
    to the AUC target and the MLflow run it was tracked in."""
    import keras
    import tensorflow as tf
    from helpers import tiny_params

    import mlflow
    from tfscale.flows.notebook import study

    def build(spec):  # as a notebook's cell defines it
        x = keras.Input(shape=spec.features[0].shape)
        hidden = keras.layers.Dense(16, activation="relu")(x)
        model = keras.Model(x, keras.layers.Dense(1)(hidden))
        model.compile(
            keras.optimizers.SGD(0.05, momentum=0.9),
            keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[keras.metrics.AUC(from_logits=True, name="auc")],
        )
        return model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    monkeypatch.chdir(tmp_path)
    params = tiny_params(tmp_path, **{"track.store_dir": "mlflow"})
    result = study(
        build,
        tf.data.Dataset.from_tensor_slices((x, y)),
        params,
        strategy="mirrored",
        epochs=3,
        target_metric="auc",
        target=0.9,
    )
    assert "mirrored" in result.answer and "reached held-out AUC 0.9" in result.answer
    assert_a_measured_range(result)
    assert result.time_to_target_speedup is not None
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    tracked = client.get_run(result.mlflow_run_id)
    assert tracked.data.params["model"] == "tfscale_notebook:model_build"
    assert tracked.data.params["optimizer"] == "SGD (momentum 0.9)"


@pytest.mark.unit
def test_a_notebooks_function_is_refused_for_worker_processes_and_arrays_kept_once(tmp_path):
    from tfscale.flows.notebook import _dataset_ref, study
    from tfscale.tasks.core.errors import UsageError

    with pytest.raises(UsageError, match=r"lives in this process only.*workers 2"):
        study(lambda: None, "digits", None, workers=2, strategy="multi_worker")
    with pytest.raises(UsageError, match=r"study\(\.\.\., epoch=\.\.\.\): no such setting"):
        study(lambda: None, "digits", None, epoch=2)
    x, y = np.arange(12.0).reshape(6, 2), np.arange(6) % 2
    first = _dataset_ref((x, y), tmp_path, "label")
    assert _dataset_ref((x, y), tmp_path, "label") == first and Path(first).is_file()
    assert _dataset_ref((x + 1, y), tmp_path, "label") != first


def cancer_frame(rows: int | None = None):
    """The breast-cancer table as a DataFrame with a text column (`clinic`, seeded), as a
    notebook holds it: 30 numeric columns, the text one and `target`."""
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame.head(rows)
    clinics = np.random.default_rng(0).choice(["north", "south", "west"], len(frame))
    frame.insert(2, "clinic", clinics)
    return frame


@pytest.mark.integration
def test_one_call_in_a_notebook_takes_a_dataframe_with_a_text_column(tmp_path, monkeypatch):
    """`study(build, frame, label="target")`: the DataFrame as the table it is, its text
    column left out of a model of one input and named; an error at prepare said of the
    DataFrame, never of the file written for it; the cell gets the stage lines and the
    answer, and no library's log; the caller's log handlers are as they were after each
    call (two here). The cell is a stream of the test's own, as a notebook's is."""
    import io
    import logging
    import sys

    import keras
    from helpers import tiny_params

    # imported before sys.stderr is the cell (as run_main does): MLflow and Prefect set up
    # their logging once, closing every handler, and absl's handler closes its stream (the
    # session's stderr) unless it is sys.stderr then
    import tfscale.flows.study  # noqa: F401
    import tfscale.tasks.track.tracking  # noqa: F401
    from tfscale.flows.notebook import study
    from tfscale.tasks.data.datasets import DatasetError

    def build(spec):  # one input over the numeric columns, as model.fit takes df.values
        x = keras.Input(shape=(len(spec.numbers),))
        model = keras.Model(x, keras.layers.Dense(1)(keras.layers.BatchNormalization()(x)))
        model.compile(
            "adam", keras.losses.BinaryCrossentropy(from_logits=True), metrics=["accuracy"]
        )
        return model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stderr", cell := io.StringIO())
    params = tiny_params(tmp_path, **{"track.store_dir": "mlflow"})
    frame, handlers = cancer_frame(), logging.getLogger().handlers[:]
    with pytest.raises(DatasetError) as caught:  # at prepare, before any training
        study(build, frame, params, label="diagnosis", strategy="mirrored")
    said = str(caught.value)
    assert said.startswith("the DataFrame has no column 'diagnosis' to take the label from")
    assert "parquet" not in said and "label=... (prepare.label)" in caught.value.fix
    assert logging.getLogger().handlers == handlers

    result = study(build, frame, params, label="target", strategy="mirrored", epochs=2)
    assert_a_measured_range(result)
    assert result.mlflow_run_id and logging.getLogger().handlers == handlers
    said = cell.getvalue()
    for stage in ("prepare", "strategy", "baseline", "distributed", "evaluate", "answer"):
        assert re.search(rf"^{stage} +\S", said, re.MULTILINE), stage
    assert "455 train examples" in said and "label target: binary" in said
    assert "left out: clinic (not one number each)" in said
    assert "INFO" not in said and "prefect" not in said and "retracing" not in said
    assert len(list((tmp_path / "notebook").glob("*.parquet"))) == 1  # written once


@pytest.mark.unit
def test_a_notebooks_dataframe_is_written_once_and_its_errors_said_of_it(tmp_path):
    """(DataFrame, Series) as one table, the labels under `label` (by position, not index),
    named by its contents; what cannot be a table, said of the DataFrame or the Series."""
    import pyarrow.parquet as pq

    from tfscale.flows.notebook import _dataset_ref, _passed, _restated, study
    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.data.datasets import DatasetError
    from tfscale.tasks.data.preparation import user_source

    frame = cancer_frame(40)
    x, y = frame.drop(columns="target"), frame["target"].set_axis(range(100, 140))
    path = _dataset_ref((x, y), tmp_path, "label")
    assert _dataset_ref((x, y), tmp_path, "label") == path
    table = pq.read_table(path)
    assert table.column("clinic").to_pylist() == list(frame.clinic)
    assert table.column("label").to_pylist() == list(frame.target)
    assert _dataset_ref(frame, tmp_path, "target") not in (path, _dataset_ref(x, tmp_path, "a"))

    mixed = frame.assign(clinic=[1 if i % 2 else "north" for i in range(40)])
    with pytest.raises(DatasetError, match="the DataFrame's column 'clinic' holds values of"):
        study(lambda: None, mixed, None, label="target")
    with pytest.raises(UsageError, match="the DataFrame has a column 'target', the name"):
        study(lambda: None, (frame, y), None, label="target")
    with pytest.raises(DatasetError, match="the DataFrame has 40 rows and its labels 39"):
        study(lambda: None, (x, y[1:]), None)

    gaps = y.astype(float).where(y.index != 103)  # one empty label
    written = _dataset_ref((x, gaps), tmp_path, "label")
    cfg = load_config(None, {"prepare.dataset": written}).prepare
    with pytest.raises(DatasetError) as caught:
        user_source(cfg)
    said = _restated(caught.value, _passed((x, gaps), "label"), Path(written).name)
    assert said.message.startswith("the Series of labels has 1 empty value(s)")
    assert Path(written).name not in str(said)


CHAINS = textwrap.dedent(
    """
    import keras

    def sequential(spec):
        return keras.Sequential(
            [
                keras.Input(shape=spec.features[0].shape),
                keras.layers.Flatten(),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(spec.label.outputs),
            ]
        )

    @keras.saving.register_keras_serializable(package="mine")
    class Mine(keras.Model):
        def __init__(self, outputs, **kwargs):
            super().__init__(**kwargs)
            self.outputs_ = outputs
            self.hidden = keras.layers.Dense(32, activation="relu")
            self.out = keras.layers.Dense(outputs)

        def call(self, x):
            return self.out(self.hidden(keras.layers.Flatten()(x)))

        def get_config(self):
            return {**super().get_config(), "outputs": self.outputs_}

    def subclassed(spec):
        return Mine(spec.label.outputs)
    """
)


@pytest.mark.integration
def test_a_sequential_is_cut_into_stages_and_a_subclassed_model_trains_whole(examples):
    """A user's chain of layers is cut into pipeline stages as the built-ins are, each
    stage's weights on its own device; a subclassed model (built on its first call) trains
    whole, and asking to cut it names why it cannot be and what would work."""
    from tfscale.tasks.core.errors import UsageError

    (examples / "chains.py").write_text(CHAINS)
    staged = config_for(
        examples,
        "digits",
        "chains.py:sequential",
        **{"train.strategy": "pipeline", "train.stages": 2, "train.epochs": 2},
    )
    _, result = trained(staged)
    assert result.stages == 2 and len(result.device_bytes) == 2, result.device_bytes
    assert result.history[-1]["accuracy"] > 0.5
    whole = config_for(examples, "digits", "chains.py:subclassed", **{"train.epochs": 2})
    _, result = trained(whole)
    assert result.replicas == 2 and result.history[-1]["accuracy"] > 0.5
    cut = config_for(examples, "digits", "chains.py:subclassed", **{"train.strategy": "pipeline"})
    with pytest.raises(UsageError, match=r"subclassed keras.Model.*cannot be cut"):
        trained(cut)


def table_sweep(examples: Path, **settings):
    """A sweep over the user's own breast-cancer table (`dataset_sizes: [0]`), its outputs
    under `examples`, with `settings` (dotted keys) on top."""
    cancer_csv(examples)
    values = {
        "prepare.dataset": "cancer.csv",
        "prepare.label": "target",
        "prepare.data_dir": str(examples / "data"),
        "train.runs_dir": str(examples / "runs"),
        "sweep.dataset_sizes": [0],
        "sweep.out_dir": str(examples / "out"),
        "track.store_dir": str(examples / "mlflow"),
    }
    return load_config(None, {**values, **settings})


@pytest.mark.integration  # a Prefect flow
def test_a_sweep_takes_a_users_model_as_a_built_in(examples):
    """`sweep.model` a user's function, over the user's own table (`dataset_sizes: [0]`):
    each cell trains it, one device and 2 replicas. Nothing here reads a cell's figures:
    each trains at `helpers.LEAST_WORK` (one short measuring round, plain steps, no held-out
    evaluation while training)."""
    from helpers import LEAST_WORK

    from tfscale.flows.sweep import sweep_flow

    config = table_sweep(
        examples,
        **LEAST_WORK,
        **{"sweep.model": "table_classifier.py:build", "sweep.replicas": [1, 2]},
        **{"sweep.epochs": 1, "sweep.precision": ["float32"]},
    )
    rows = sweep_flow(config)
    assert [(r.replicas, r.strategy) for r in rows] == [(1, "one_device"), (2, "mirrored")]
    for row in rows:
        metrics = json.loads((Path(row.run_dir) / "metrics.json").read_text())
        assert (metrics["model"], metrics["optimizer"]) == ("table_classifier.py:build", "AdamW")


@pytest.mark.integration
def test_a_sweep_whose_cell_is_refused_ends_with_the_cells_error_and_its_run_failed(examples):
    """A sweep cell refused before it trains (the built-in CNN on a table) ends the sweep
    with that cell's own error, and the sweep's MLflow run is marked FAILED, not left
    running (it once ended in Prefect's ParameterBindError, the run still RUNNING)."""
    import sqlite3

    from tfscale.flows.sweep import sweep_flow
    from tfscale.tasks.core.errors import UsageError

    config = table_sweep(examples, **{"sweep.model": "cnn", "sweep.replicas": [1]})
    with pytest.raises(UsageError, match="The cnn model needs images"):
        sweep_flow(config)
    with sqlite3.connect(examples / "mlflow" / "mlflow.db") as store:
        statuses = store.execute("select status from runs").fetchall()
    assert statuses == [("FAILED",)], statuses


@pytest.mark.unit
def test_a_subclassed_models_logged_signature_comes_from_the_datas_spec():
    """A subclassed model declares no inputs: the example MLflow infers its signature from
    is one of the data's features, as the manifest records them."""
    import keras

    from tfscale.tasks.data.spec import Feature, FeatureSpec, Label
    from tfscale.tasks.track.tracking import _example_input

    class Whole(keras.Model):
        def __init__(self):
            super().__init__()
            self.out = keras.layers.Dense(3)

        def call(self, features):
            return self.out(keras.ops.concatenate([features["a"], features["b"]], axis=-1))

    spec = FeatureSpec(
        (Feature("a", "float32", (2,)), Feature("b", "float32", (4,))),
        Label("class", (), ("x", "y", "z")),
    )
    example = _example_input(Whole(), spec.to_dict())
    assert {k: v.shape for k, v in example.items()} == {"a": (1, 2), "b": (1, 4)}
    with pytest.raises((AttributeError, ValueError)):
        _example_input(Whole())


CUSTOM_LAYER = textwrap.dedent(
    """
    import keras
    import tensorflow as tf

    class Scale(keras.layers.Layer):  # registered with nothing
        def __init__(self, factor=2.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor
        def call(self, x):
            return x * self.factor
        def get_config(self):
            return {**super().get_config(), "factor": self.factor}

    def build(spec):
        inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
        x = Scale(0.5)(keras.layers.Concatenate()(list(inputs.values())))
        return keras.Model(inputs, keras.layers.Dense(1)(x))

    class OwnStep(keras.Model):  # the guide's train_step, with SGD
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(y=y, y_pred=self(x, training=True))
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables))
            return {"loss": loss}

    def own_step(spec):
        inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
        x = Scale(0.5)(keras.layers.Concatenate()(list(inputs.values())))
        model = OwnStep(inputs, keras.layers.Dense(1)(x))
        model.compile(keras.optimizers.SGD(1e-3, momentum=0.9), "binary_crossentropy")
        return model

    def weighted_bce(y_true, y_pred):  # a loss as the Keras guide writes one: a function
        y_true = keras.ops.cast(y_true, y_pred.dtype)
        each = keras.losses.binary_crossentropy(y_true, y_pred, from_logits=True)
        return each * (1.0 + keras.ops.squeeze(y_true, -1))

    def own_loss(spec):  # its loss a function, its step the guide's, returning the loss
        inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
        x = Scale(0.5)(keras.layers.Concatenate()(list(inputs.values())))
        model = OwnStep(inputs, keras.layers.Dense(1)(x))
        model.compile(optimizer="adam", loss=weighted_bce)
        return model
    """
)


@pytest.mark.integration
@pytest.mark.parametrize(
    "function, loop",
    [("build", "tfscale"), ("own_step", "tfscale"), ("own_loss", "fit")],
)
def test_a_model_with_a_custom_layer_is_evaluated_at_another_batch_size(tmp_path, function, loop):
    """`tfscale evaluate --batch-size` reads the trained file back (the training recorded
    its evaluation at another batch size): the model's own module is imported first, so
    its unregistered layer and its loss written as a function load; under `--loop fit` a
    `train_step` returning its loss alone trains too (its score then NaN)."""
    from helpers import run_main, tiny_params

    cancer_csv(tmp_path)
    (tmp_path / "scaled.py").write_text(CUSTOM_LAYER)
    params = ["--params", str(tiny_params(tmp_path, **{"track.store_dir": "mlflow"}))]
    data = ["--dataset", "cancer.csv", "--label", "target"]
    assert run_main([*params, "prepare", *data], tmp_path)[0] == 0
    train = [*params, "train", *data, "--model", f"scaled.py:{function}", "--no-diagnose"]
    train += ["--strategy", "one_device", "--loop", loop]
    code, out, err = run_main(train, tmp_path)
    assert code == 0, err[-2000:]
    code, out, err = run_main([*params, "evaluate", *data, "--batch-size", "7"], tmp_path)
    assert code == 0, err[-2000:]
    assert "as its training evaluated it" not in out  # read back and run, not the record
    found = re.search(r"test accuracy (0\.\d+).*\((\d+) examples\)", out)
    assert found, out
    recorded = json.loads(next((tmp_path / "runs").rglob("final_eval.json")).read_text())
    assert float(found[1]) == pytest.approx(recorded["result"]["test_accuracy"], abs=1e-4)


MIXES_DTYPES = textwrap.dedent(
    """
    import keras
    import tensorflow as tf

    class Temperature(keras.layers.Layer):  # float32 whatever the policy
        def call(self, x):
            return x * tf.constant(0.5, tf.float32)

    def build(spec):
        inputs = {f.name: keras.Input(shape=(1,), name=f.name) for f in spec.features}
        x = keras.layers.Dense(8, activation="relu")(
            keras.layers.Concatenate()(list(inputs.values()))
        )
        return keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(Temperature()(x)))
    """
)


def _mixes_dtypes(tmp_path: Path) -> tuple[list[str], list[str]]:
    """The project of a model that works in float32 only, prepared: (params, data flags)."""
    from helpers import run_main, tiny_params

    cancer_csv(tmp_path)
    (tmp_path / "temperature.py").write_text(MIXES_DTYPES)
    params = ["--params", str(tiny_params(tmp_path, **{"track.store_dir": "mlflow"}))]
    data = ["--dataset", "cancer.csv", "--label", "target"]
    assert run_main([*params, "prepare", *data], tmp_path)[0] == 0
    return params, [*data, "--model", "temperature.py:build", "--strategy", "one_device"]


@pytest.mark.unit
def test_a_precision_asked_for_that_the_model_fails_under_is_refused_naming_the_layer(tmp_path):
    from helpers import run_main

    params, flags = _mixes_dtypes(tmp_path)
    argv = [*params, "train", *flags, "--precision", "mixed_bfloat16", "--no-diagnose"]
    code, out, err = run_main(argv, tmp_path)
    assert code == 2, err[-2000:]
    assert "fails under --precision mixed_bfloat16: Temperature.call: Input 'y' of 'Mul'" in err
    assert "use --precision float32" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))


@pytest.mark.integration
def test_autos_mixed_precision_is_dropped_where_the_model_fails_under_it(tmp_path, monkeypatch):
    """A CPU with avx512_bf16 (its flags faked: this machine's may lack it) makes `auto`
    propose mixed_bfloat16; the model fails under it, so float32 trains, said in a line."""
    from helpers import run_main

    from tfscale.tasks.distribute import hardware

    read_cpu = hardware.read_cpu
    monkeypatch.setattr(hardware, "read_cpu", lambda: (read_cpu()[0], ["avx512f", "avx512_bf16"]))
    params, flags = _mixes_dtypes(tmp_path)
    argv = [*params, "train", *flags, "--precision", "auto", "--no-diagnose"]
    code, out, err = run_main(argv, tmp_path)
    assert code == 0, err[-2000:]
    assert re.search(r"auto +mixed_bfloat16 dropped: Temperature.call: Input 'y'", out + err)
    metrics = json.loads(next((tmp_path / "runs").rglob("metrics.json")).read_text())
    assert metrics["precision"] == "float32"
    assert "float32 because the model fails under mixed_bfloat16" in metrics["reason"]


def _readme_model(folder: Path) -> str:
    """README's `mine.py`, as a user copies it."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (code,) = re.findall(r"```python\n# mine.py\n(.*?)```", readme, re.S)
    (folder / "mine.py").write_text(code)
    return "mine.py:build"


def _docs_tables(folder: Path) -> dict[str, tuple[Path, str]]:
    """Every table the docs name, and one with text, dates and blanks: path, label."""
    import pandas as pd
    from sklearn import datasets

    tables = {}
    for name, load in (("wine", datasets.load_wine), ("iris", datasets.load_iris)):
        tables[name] = load(as_frame=True).frame
    tables["cancer"] = datasets.load_breast_cancer(as_frame=True).frame
    tables["diabetes"] = datasets.load_diabetes(as_frame=True, scaled=False).frame
    rng = np.random.default_rng(0)
    mixed = pd.DataFrame({
        "when": pd.date_range("2024-01-01", periods=120).strftime("%Y-%m-%d"),
        "city": rng.choice(["paris", "lyon", "nice"], 120),
        "amount": np.where(np.arange(120) % 17 == 3, np.nan, rng.normal(size=120)),
        "target": np.arange(120) % 2,
    })  # fmt: skip
    tables["mixed"] = mixed
    out = {}
    for name, frame in tables.items():
        frame.to_csv(folder / f"{name}.csv", index=False)
        out[name] = (folder / f"{name}.csv", "target")
    return out


@pytest.mark.unit
def test_the_readme_model_takes_every_docs_table_and_one_of_text_dates_and_blanks(
    tmp_path, monkeypatch
):
    """README's model (one input over `spec.numbers`) builds and runs on each table the docs
    name (wine's `od280/od315_of_diluted_wines` too) and on one of text, dates and blanks
    (filled with `--missing mean`); on the binary ones it passes every check before
    training, on the others it is refused for its one sigmoid unit, `--label-kind` named."""
    from tfscale.tasks.data.inputs import build_dataset
    from tfscale.tasks.train.model_inputs import as_model_takes
    from tfscale.tasks.train.user_models import check_user_model, user_model

    monkeypatch.chdir(tmp_path)
    ref = _readme_model(tmp_path)
    for name, (path, label) in _docs_tables(tmp_path).items():
        values = {
            "prepare.dataset": str(path),
            "prepare.label": label,
            "prepare.missing": "mean",
            "prepare.data_dir": str(tmp_path / "tfrecords"),
        }
        config = load_config(None, values)
        prepared = prepare_dataset(config, progress=False)
        model = user_model(ref, prepared.manifest.spec).model
        taken = as_model_takes(prepared.manifest, model)
        assert len(taken.spec.packed) == len(prepared.manifest.spec.numbers), name
        x, _ = next(iter(build_dataset(taken, prepared.data_dir, "test", 8, training=False)))
        assert model(x).shape == (8, 1), name
        kind = prepared.manifest.spec.label.kind
        args = (ref, prepared.manifest, prepared.data_dir, config.evaluate)
        if kind == "binary":
            check_user_model(*args)
        else:
            with pytest.raises(ModelError) as refused:
                check_user_model(*args)
            assert refused.value.fix.startswith("if the label is not"), (name, refused.value)


@pytest.mark.unit
def test_a_model_file_edited_is_taken_as_it_is_now_and_a_run_keeps_its_folder(
    digits, tmp_path, monkeypatch
):
    """A long-lived process (a notebook's) imports a model file again once it changed;
    a run's folder is fixed as the run is made, in its workers' spec too, so an edit
    while it trains cannot move it."""
    from helpers import report

    from tfscale.tasks.core.user_code import load_function
    from tfscale.tasks.distribute.run import Role, Run
    from tfscale.tasks.distribute.strategy import select_strategy

    monkeypatch.chdir(tmp_path)
    source = textwrap.dedent(
        """
        import keras

        def build():
            return keras.Sequential([keras.Input((4,)), keras.layers.Dense(UNITS)])
        """
    )
    (tmp_path / "net.py").write_text(source.replace("UNITS", "8"))
    overrides, manifest, data_dir = digits
    config = load_config(None, {**overrides, "train.model": "net.py:build"})
    run = Run(config, manifest, data_dir, select_strategy(report(), config.train), report())
    folder = run.run_dir
    assert load_function("net.py:build", "model")[0]().count_params() == 40
    (tmp_path / "net.py").write_text(source.replace("UNITS", "64"))
    assert load_function("net.py:build", "model")[0]().count_params() == 320
    assert run.run_dir == folder == run.with_choice(run.choice).run_dir
    assert Run.from_spec(json.loads(json.dumps(run.to_spec())), Role()).run_dir == folder
    again = Run(config, manifest, data_dir, run.choice, run.report)
    assert again.run_dir != folder  # a run made now takes the file as it is now


GUIDE_STEP = textwrap.dedent(
    """
    import keras
    import tensorflow as tf

    class GuideStep(keras.Model):  # "Customizing what happens in fit()", its first step
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}
    """
)


@pytest.mark.unit
@pytest.mark.parametrize(
    "kind, loss, metric", [("class", "sparse_categorical_crossentropy", "accuracy"),
                           ("regression", "mse", "mae")],
)  # fmt: skip
def test_a_guide_style_train_steps_nested_logs_give_its_score_as_keras_flattens_them(
    tmp_path, kind, loss, metric
):
    """The guide's step returns `{m.name: m.result() for m in self.metrics}`, its compiled
    metrics nested under `compile_metrics`: the train score is read from them, by Keras's
    name for it (`mae` for the mean absolute error), never NaN."""
    import importlib.util

    import keras
    import numpy as np
    import tensorflow as tf

    from tfscale.tasks.data.spec import Label
    from tfscale.tasks.train.keras_meaning import run_own_train_step
    from tfscale.tasks.train.objectives import Objective

    (tmp_path / "guide.py").write_text(GUIDE_STEP)
    spec = importlib.util.spec_from_file_location("guide_step", tmp_path / "guide.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    keras.utils.set_random_seed(0)
    units = 3 if kind == "class" else 1
    inputs = keras.Input((4,))
    model = module.GuideStep(
        inputs, keras.layers.Dense(units, activation="softmax" if units > 1 else None)(inputs)
    )
    model.compile(optimizer="sgd", loss=loss, metrics=[metric])
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    labels = np.arange(8) % 3 if kind == "class" else x[:, :1]
    label = Label(kind, (), ("0", "1", "2")) if kind == "class" else Label(kind, (1,))
    objective = Objective(label, from_logits=False)
    _, score = run_own_train_step(model, objective, tf.constant(x), tf.constant(labels))
    logged = model.get_metrics_result()[metric]
    assert float(score) == pytest.approx(float(logged) * 8, rel=1e-5)


STRING_LOOKUP = textwrap.dedent(
    """
    import keras

    def build(spec):  # keras-io's structured data example: a StringLookup on a text input
        inputs = {
            f.keras_name: keras.Input((1,), name=f.keras_name, dtype=f.dtype)
            for f in spec.features
        }
        thal = keras.layers.StringLookup(
            vocabulary=["fixed", "normal", "reversible"], output_mode="one_hot"
        )(inputs["thal"])
        age = keras.layers.Normalization(mean=50.0, variance=100.0)(inputs["age"])
        x = keras.layers.Concatenate()([thal, age])
        model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
        return model
    """
)


@pytest.mark.unit
def test_a_compiled_model_with_a_string_input_is_readied_for_tfscales_step():
    """A compiled model taking text (a `StringLookup`) is built for a batch of the data's
    features before its first step, as `fit` builds it: the text as a string tensor (a
    numpy object array is no dtype Keras takes)."""
    import keras
    import numpy as np

    from tfscale.tasks.data.spec import Feature, FeatureSpec, Label
    from tfscale.tasks.train.keras_meaning import attach
    from tfscale.tasks.train.objectives import Built
    from tfscale.tasks.train.user_models import example_batch, example_labels, objective_from

    features = (Feature("thal", "string", ()), Feature("age", "float32", ()))
    spec = FeatureSpec(features, Label("binary", (), ("0", "1")))
    scope: dict = {}
    exec(STRING_LOOKUP, scope)
    model = scope["build"](spec)
    attach(Built(model, objective_from(model, spec)), keras.optimizers.Adam(),
           example_batch(spec), example_labels(spec))  # fmt: skip
    text = np.array([["normal"], ["fixed"]], dtype=object)
    assert model({"thal": text, "age": np.ones((2, 1), "float32")}).shape == (2, 1)


@pytest.mark.unit
def test_text_under_kerass_fit_over_replicas_is_refused_before_training():
    """Keras's `fit` under Mirrored fails on a text input as it distributes the batch:
    `--loop fit` over 2 replicas is refused with the loops and strategies that train it."""
    from helpers import report

    from tfscale.tasks.data.spec import Feature, FeatureSpec, Label
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.train.user_models import _check_fit_takes

    features = (Feature("thal", "string", ()), Feature("age", "float32", ()))
    spec = FeatureSpec(features, Label("binary", (), ("0", "1")))
    for strategy, refused in (("mirrored", True), ("one_device", False)):
        train = load_config(None, {"train.loop": "fit", "train.strategy": strategy}).train
        choice = select_strategy(report(), train)
        if not refused:
            _check_fit_takes("lookup.py:build", spec, train, choice)
            continue
        with pytest.raises(ModelError, match=r"takes text \(thal\).*fit under mirrored") as e:
            _check_fit_takes("lookup.py:build", spec, train, choice)
        assert "--loop tfscale" in e.value.fix and "--strategy one_device" in e.value.fix


@pytest.mark.unit
def test_the_notebook_refuses_a_params_file_that_is_not_there(tmp_path, monkeypatch):
    """`study(..., params="typo.yml")` stops as the CLI's `--params typo.yml` does, before
    anything runs on settings nobody chose."""
    from tfscale.flows.notebook import study
    from tfscale.tasks.settings.config import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"typo.yml: no such file"):
        study("mlp", "digits", params="typo.yml")
    assert not list(tmp_path.iterdir())


@pytest.mark.unit
def test_a_dict_of_inputs_keyed_by_kerass_names_gets_its_columns_without_a_warning(tmp_path):
    """The docs' pattern, keyed by `keras_name` (`mean radius` as `mean_radius`, `a/b` as
    `a_b`): the batches are keyed so, each input gets its own column, and Keras warns of
    nothing as the model is checked and called."""
    import warnings

    import pandas as pd

    from tfscale.tasks.data.inputs import build_dataset
    from tfscale.tasks.train.model_inputs import as_model_takes
    from tfscale.tasks.train.user_models import user_model

    frame = pd.DataFrame({"mean radius": np.arange(30.0), "a/b": -np.arange(30.0)})
    frame["target"] = np.arange(30) % 2
    frame.to_csv(tmp_path / "t.csv", index=False)
    result = prepare_dataset(config_for(tmp_path, str(tmp_path / "t.csv"), "mlp"), progress=False)
    shutil.copy(EXAMPLES / "table_classifier.py", tmp_path / "table_classifier.py")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a UserWarning of Keras's fails the test
        model, _ = user_model(f"{tmp_path / 'table_classifier.py'}:build", result.manifest.spec)
        taken = as_model_takes(result.manifest, model)
        x, _ = next(iter(build_dataset(taken, result.data_dir, "train", 8, training=False)))
        model(x)
    assert sorted(x) == ["a_b", "mean_radius"]
    assert (x["mean_radius"].numpy() == -x["a_b"].numpy()).all()
