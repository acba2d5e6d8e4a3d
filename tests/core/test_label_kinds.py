"""A label's kind, read as Keras users hold their labels (`tasks.core.label_kinds`), and
every prepare saying what it read and how to change it."""

from __future__ import annotations

import numpy as np
import pytest

from tfscale.tasks.core.label_kinds import read_kind

pytestmark = pytest.mark.unit

rng = np.random.default_rng(0)


@pytest.mark.parametrize(
    "values, kind",
    [
        (rng.integers(0, 2, 100).astype(float), "binary"),  # 0./1. floats, as pandas reads them
        (rng.integers(0, 2, 100), "binary"),
        (np.array(["yes", "no"] * 50), "binary"),
        (rng.integers(0, 10, 1000), "class"),
        (rng.integers(0, 3, 9).astype(float), "class"),  # whole floats: classes
        (rng.integers(25, 346, 442), "regression"),  # diabetes: 214-ish values in 442 rows
        (rng.integers(0, 300, 100_000), "regression"),  # more values than 256
        (rng.integers(0, 100, 100_000), "class"),  # 100 classes, 1,000 rows each
        (rng.normal(size=100), "regression"),
        (np.array(["a", "b", "c"] * 10), "class"),
        (np.eye(4, dtype=np.float32)[rng.integers(0, 4, 50)], "class"),  # one-hot rows
        (rng.integers(0, 2, (50, 3)), "multi_label"),
        (rng.normal(size=(50, 2)), "regression"),
    ],
)
def test_each_kind_is_read_as_a_keras_user_means_it(values, kind):
    assert read_kind(values)[0] == kind


def _prepare(tmp_path, name, **keys):
    from tfscale.tasks.data.preparation import prepare_dataset, prepared_line
    from tfscale.tasks.settings.config import load_config

    values = {"prepare.dataset": str(tmp_path / name), "prepare.data_dir": str(tmp_path / "d")}
    values.update({f"prepare.{k}": v for k, v in keys.items()})
    result = prepare_dataset(load_config(None, values), progress=False)
    return result, prepared_line(result)


def test_one_hot_rows_are_classes_a_categorical_loss_gets_back_one_hot(tmp_path):
    from tfscale.tasks.data.inputs import build_dataset
    from tfscale.tasks.train.objectives import Objective

    y = np.eye(3, dtype=np.float32)[np.arange(60) % 3]
    np.savez(tmp_path / "a.npz", x=rng.normal(size=(60, 4)).astype(np.float32), y=y)
    result, line = _prepare(tmp_path, "a.npz")
    label = result.manifest.spec.label
    assert (label.kind, label.class_names) == ("class", ("0", "1", "2"))
    assert "; label: class (one-hot rows of 3); --label-kind" in line
    x, ids = next(iter(build_dataset(result.manifest, result.data_dir, "train", 64, False)))
    import keras

    one_hot = Objective(label, loss_fn=keras.losses.categorical_crossentropy).keras_labels(ids)
    rows = {tuple(r) for r in y.tolist()}
    assert {tuple(r) for r in one_hot.numpy().tolist()} <= rows and one_hot.shape[1] == 3


def test_the_prepare_line_says_the_kind_and_a_model_of_another_kind_names_label_kind(
    tmp_path,
):
    """Float 0./1. labels are binary, said on the line; a model ending in 2 units (as for
    two classes) is refused with `--label-kind` named first, then the model's fix."""
    from helpers import run_main, tiny_params

    rows = ["a,b,target"] + [f"{i},{i % 7},{float(i % 2)}" for i in range(80)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    params = ["--params", str(tiny_params(tmp_path, **{"track.store_dir": "mlflow"}))]
    data = ["--dataset", "t.csv", "--label", "target"]
    code, out, err = run_main([*params, "prepare", *data], tmp_path)
    assert code == 0, err[-2000:]
    assert "label      target: binary (0/1); --label-kind (prepare.label_kind) to change" in out
    (tmp_path / "two.py").write_text(
        "import keras\n\n\ndef build(spec):\n"
        "    i = {f.name: keras.Input((1,), name=f.keras_name) for f in spec.features}\n"
        "    x = keras.layers.Concatenate()(list(i.values()))\n"
        "    return keras.Model(i, keras.layers.Dense(2)(x))\n"
    )
    argv = [*params, "train", *data, "--model", "two.py:build", "--no-diagnose"]
    code, _, err = run_main(argv, tmp_path)
    assert code == 2, err[-2000:]
    (fix,) = [line for line in err.splitlines() if line.startswith("fix:")]
    assert fix.index("--label-kind") < fix.index("end the model in a layer of 1 unit"), fix


@pytest.mark.parametrize(
    "asked, kind, outputs",
    [("auto", "binary", 1), ("class", "class", 2), ("regression", "regression", 1)],
)
def test_the_kind_asked_for_is_the_kind_prepared(tmp_path, asked, kind, outputs):
    """The same 0./1. column, read as binary, prepared as the user asks (`--label-kind`,
    `prepare.label_kind`): two classes (a model of 2 logits), or a real value."""
    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.settings.config import load_config

    rows = ["a,b,target"] + [f"{i},{i % 7},{float(i % 2)}" for i in range(80)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    values = {"prepare.dataset": str(tmp_path / "t.csv"), "prepare.label": "target"}
    values |= {"prepare.label_kind": asked, "prepare.data_dir": str(tmp_path / "tfrecords")}
    label = prepare_dataset(load_config(None, values), progress=False).manifest.spec.label
    assert (label.kind, label.outputs) == (kind, outputs)
