"""The user's own data: tables (CSV, Parquet), arrays (.npz), a tf.data pipeline's
function, and tensorflow-datasets sets of text and dicts (mocked: no download), each
written into shards, verified and read back as it was; then trained on for real.

The tables are the ones scikit-learn ships (wine: 3 classes; iris: text classes; diabetes:
real values), written to files by each test."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.data.inputs import Reading, build_dataset
from tfscale.tasks.data.manifest import verify_shards
from tfscale.tasks.data.preparation import format_prepared, prepare_dataset
from tfscale.tasks.settings.config import load_config


def prepare(tmp_path: Path, dataset: str, **prepare_keys):
    values = {"prepare.dataset": dataset, "prepare.data_dir": str(tmp_path / "tfrecords")}
    values.update({f"prepare.{k}": v for k, v in prepare_keys.items()})
    return prepare_dataset(load_config(None, values), progress=False)


def read_all(result, split: str):
    """Every example of `split`, in the manifest's order: (features, labels) as numpy."""
    features, labels = [], []
    for x, y in build_dataset(result.manifest, result.data_dir, split, 64, training=False):
        features.append(x)
        labels.append(y.numpy())
    if isinstance(features[0], dict):
        joined = {k: np.concatenate([f[k].numpy() for f in features]) for k in features[0]}
    else:
        joined = np.concatenate([f.numpy() for f in features])
    return joined, np.concatenate(labels)


def wine_csv(tmp_path: Path) -> tuple[Path, object]:
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).frame
    path = tmp_path / "wine.csv"
    frame.to_csv(path, index=False)
    return path, frame


@pytest.mark.unit
def test_a_table_keeps_every_column_and_row_split_stratified_with_its_statistics(tmp_path):
    path, frame = wine_csv(tmp_path)
    result = prepare(tmp_path, str(path), label="target")
    spec = result.manifest.spec
    columns = [c for c in frame.columns if c != "target"]
    assert sorted(f.name for f in spec.features) == sorted(columns)
    assert {f.dtype for f in spec.features} == {"float32"}
    assert (spec.label.kind, spec.label.class_names) == ("class", ("0", "1", "2"))
    assert result.manifest.feature["label"]["metric"] == "accuracy"
    verify_shards(result.data_dir)

    train, train_labels = read_all(result, "train")
    test, test_labels = read_all(result, "test")
    assert len(train_labels) + len(test_labels) == len(frame)
    # stratified: each class's held-out share is the split's, to one example
    for c in range(3):
        total = int((frame.target == c).sum())
        assert abs(int((test_labels == c).sum()) - 0.2 * total) <= 1
    # every row read back as it was: the proline column's values, and each label's
    both = np.concatenate([train["proline"], test["proline"]])
    assert np.allclose(np.sort(both), np.sort(frame.proline.to_numpy(np.float32)))
    # the mean and deviation a built-in model standardises by: the training split's
    alcohol = next(f for f in spec.features if f.name == "alcohol")
    assert alcohol.mean == pytest.approx(train["alcohol"].mean(), rel=1e-4)
    assert alcohol.std == pytest.approx(train["alcohol"].std(), rel=1e-3)


@pytest.mark.unit
def test_a_text_label_becomes_named_classes_and_a_parquet_target_real_values(tmp_path):
    from sklearn.datasets import load_diabetes, load_iris

    iris = load_iris(as_frame=True).frame
    iris["species"] = np.array(["setosa", "versicolor", "virginica"])[iris.pop("target")]
    iris.to_csv(tmp_path / "iris.csv", index=False)
    result = prepare(tmp_path, str(tmp_path / "iris.csv"), label="species")
    assert result.manifest.spec.label.class_names == ("setosa", "versicolor", "virginica")
    _, labels = read_all(result, "test")
    assert np.bincount(labels).tolist() == [10, 10, 10]

    diabetes = load_diabetes(as_frame=True).frame
    diabetes.to_parquet(tmp_path / "diabetes.parquet")
    result = prepare(tmp_path, str(tmp_path / "diabetes.parquet"), label="target")
    label = result.manifest.spec.label
    assert (label.kind, label.loss, label.metric, label.lower_is_better) == (
        "regression",
        "mean_squared_error",
        "mean_absolute_error",
        True,
    )
    _, train = read_all(result, "train")
    _, test = read_all(result, "test")
    assert train.dtype == np.float32
    both = np.sort(np.concatenate([train, test]))
    assert np.allclose(both, np.sort(diabetes.target.to_numpy(np.float32)))
    assert label.mean == pytest.approx(train.mean(), rel=1e-4)


@pytest.mark.unit
def test_the_same_table_gives_the_same_bytes_and_an_interrupted_prepare_resumes_mid_table(
    tmp_path, monkeypatch
):
    """Shards are read from the table front to back: a prepare stopped at its fourth shard
    goes on from there, reading past the rows it has, and its shards are the bytes an
    uninterrupted prepare writes."""
    import tfscale.tasks.data.shards as shards

    path, _ = wine_csv(tmp_path)
    first = prepare(tmp_path / "a", str(path), label="target", num_shards=3)
    real, calls = shards._write_one, []

    def stops_at_the_fourth(source, shard, out):
        calls.append(shard.file)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(source, shard, out)

    monkeypatch.setattr(shards, "_write_one", stops_at_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "b", str(path), label="target", num_shards=3)
    assert not list((tmp_path / "b").rglob("manifest.json"))
    monkeypatch.setattr(shards, "_write_one", real)
    resumed = prepare(tmp_path / "b", str(path), label="target", num_shards=3)
    assert (resumed.written, resumed.reused) == (3, 3)
    assert [s.sha256 for s in resumed.manifest.shards] == [s.sha256 for s in first.manifest.shards]
    assert resumed.manifest.digest == first.manifest.digest
    # another label column is another dataset: every shard written again
    other = prepare(tmp_path / "a", str(path), label="alcohol", num_shards=3)
    assert other.written == 6 and other.manifest.spec.label.kind == "regression"


@pytest.mark.unit
def test_numeric_chunks_are_encoded_by_template_byte_for_byte_as_protocol_buffers_do():
    """The fast encoder's records equal `SerializeToString(deterministic=True)`'s for
    floats of any shape, small integers and long names; a chunk with an integer past 127
    goes through protocol buffers, and both parse back to the values written."""
    import tensorflow as tf

    from tfscale.tasks.data import records
    from tfscale.tasks.data.spec import Feature, FeatureSpec, Label

    rng = np.random.default_rng(3)
    spec = FeatureSpec(
        (
            Feature("b", "float32", ()),
            Feature("a" * 200, "float32", (40,)),
            Feature("count", "int64", (3,)),
        ),
        Label("multi_label", (5,)),
    )
    features = {
        "b": rng.random(7).astype(np.float32),
        "a" * 200: rng.random((7, 40)),
        "count": rng.integers(0, 128, (7, 3)),
    }
    labels = rng.integers(0, 2, (7, 5))
    assert records._Template.of(spec, features, labels) is not None
    fast = records.encode_chunk(spec, features, labels)
    slow = [
        records._example(spec, {n: v[i] for n, v in features.items()}, labels[i]) for i in range(7)
    ]
    assert fast == slow
    features["count"][2, 1] = 300  # two varint bytes: not a template's fixed width
    assert records._Template.of(spec, features, labels) is None
    parsed, parsed_labels = records.parse_records(
        tf.constant(records.encode_chunk(spec, features, labels)), spec
    )
    assert parsed["count"].numpy().tolist() == features["count"].tolist()
    assert np.allclose(parsed["a" * 200].numpy(), features["a" * 200])
    assert parsed_labels.numpy().tolist() == labels.tolist()


@pytest.mark.unit
def test_arrays_by_x_and_y_by_their_own_splits_and_by_name(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6)).astype(np.float64)
    np.savez(tmp_path / "xy.npz", x=x, y=(x.sum(1) > 0).astype(np.int64))
    result = prepare(tmp_path, str(tmp_path / "xy.npz"))
    spec = result.manifest.spec
    assert [(f.name, f.dtype, f.shape) for f in spec.features] == [("x", "float32", (6,))]
    assert (spec.label.kind, spec.label.metric) == ("binary", "auc")
    train, _ = read_all(result, "train")
    assert train.shape[1:] == (6,) and result.manifest.splits == {"test": 60, "train": 240}

    images = rng.integers(0, 256, (50, 8, 8, 1), dtype=np.uint8)
    np.savez(
        tmp_path / "split.npz",
        x_train=images[:40],
        y_train=np.arange(40) % 3,
        x_test=images[40:],
        y_test=np.arange(10) % 3,
    )
    result = prepare(tmp_path, str(tmp_path / "split.npz"))
    assert result.manifest.splits == {"test": 10, "train": 40}
    assert result.manifest.spec.is_image  # the image format: read as images are
    test, labels = read_all(result, "test")
    assert np.array_equal(test, images[40:]) and labels.tolist() == (np.arange(10) % 3).tolist()

    tags = (rng.random((80, 4)) > 0.5).astype(np.int64)
    np.savez(tmp_path / "named.npz", age=rng.random(80), words=rng.random((80, 3)), tags=tags)
    result = prepare(tmp_path, str(tmp_path / "named.npz"), label="tags")
    spec = result.manifest.spec
    assert sorted(f.name for f in spec.features) == ["age", "words"]
    assert (spec.label.kind, spec.label.outputs) == ("multi_label", 4)
    features, labels = read_all(result, "train")
    assert labels.dtype == np.float32 and labels.shape == (64, 4)
    assert features["words"].shape == (64, 3)


TOKENS = '''
    import numpy as np
    import tensorflow as tf


    def make():
        """Token sequences of 3 to 11 ids, each class drawing from its own 20."""
        rng = np.random.default_rng(1)
        rows = []
        for _ in range(300):
            label = int(rng.integers(0, 3))
            rows.append(((rng.integers(1, 21, rng.integers(3, 12)) + 20 * label), label))
        return tf.data.Dataset.from_generator(
            lambda: ((np.int32(s), y) for s, y in rows),
            output_signature=(tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)),
        )
'''

REVIEWS = '''
    import tensorflow as tf


    def make():
        """Dicts of a text, a number and the label, with their own test split."""
        words = ["good", "bad", "fine", "awful"]
        def split(n, offset):
            text = [f"{words[(i + offset) % 4]} film {i}" for i in range(n)]
            stars = [float((i + offset) % 5) for i in range(n)]
            label = [int((i + offset) % 4 in (0, 2)) for i in range(n)]
            return tf.data.Dataset.from_tensor_slices(
                {"review": text, "meta": {"stars": stars}, "liked": label}
            )
        return {"train": split(40, 0), "test": split(12, 1)}
'''


@pytest.mark.unit
def test_a_pipelines_function_by_file_or_by_module_with_lengths_padded(tmp_path, monkeypatch):
    (tmp_path / "tokens.py").write_text(textwrap.dedent(TOKENS))
    result = prepare(tmp_path, str(tmp_path / "tokens.py") + ":make")
    (feature,) = result.manifest.spec.features
    assert (feature.name, feature.dtype, feature.shape, feature.max_shape) == (
        "x",
        "int32",
        (None,),
        (11,),
    )
    assert Path(result.data_dir).name == "tokens.py_make"
    train, labels = read_all(result, "train")
    assert train.shape == (240, 11) and (train[:, :3] > 0).all()  # padded with 0 after
    assert ((train[train > 0] - 1) // 20 == np.repeat(labels, (train > 0).sum(1))).all()

    package = tmp_path / "shop" / "data"
    package.mkdir(parents=True)
    (tmp_path / "shop" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "reviews.py").write_text(textwrap.dedent(REVIEWS))
    monkeypatch.chdir(tmp_path)
    result = prepare(tmp_path, "shop.data.reviews:make", label="liked")
    spec = result.manifest.spec
    assert {(f.name, f.dtype) for f in spec.features} == {
        ("review", "string"),
        ("meta/stars", "float32"),
    }
    assert spec.label.kind == "binary" and result.manifest.splits == {"test": 12, "train": 40}
    test, labels = read_all(result, "test")
    assert test["review"][0] == b"bad film 0" and labels[0] == 0


@pytest.mark.unit
def test_a_tfds_set_of_text_keeps_its_splits_and_class_names(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=24):
        result = prepare(tmp_path, "imdb_reviews")
    spec = result.manifest.spec
    assert [(f.name, f.dtype) for f in spec.features] == [("text", "string")]
    assert (spec.label.kind, spec.label.class_names) == ("binary", ("neg", "pos"))
    assert result.manifest.splits == {"test": 24, "train": 24}
    text, labels = read_all(result, "train")
    assert text.dtype == object and set(labels.tolist()) <= {0, 1}


@pytest.mark.unit
def test_bad_labels_and_sources_say_what_to_do(tmp_path):
    (tmp_path / "t.csv").write_text("a,label\n1,0.5\n2,1.5\n3,2.5\n")
    with pytest.raises(DatasetError, match="binary needs 2") as caught:
        prepare(tmp_path, str(tmp_path / "t.csv"), label_kind="binary")
    assert "--label-kind" in caught.value.fix
    np.savez(tmp_path / "m.npz", x=np.zeros((4, 2)), y=np.array([[0, 2], [1, 0], [0, 1], [1, 1]]))
    with pytest.raises(DatasetError, match="not a 0/1 vector"):
        prepare(tmp_path, str(tmp_path / "m.npz"), label_kind="multi_label")
    assert not list(tmp_path.rglob("manifest.json"))


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["class", "regression", "binary", "tokens", "text"])
def test_a_built_in_dense_model_trains_on_each_source_under_mirrored(kind, tmp_path):
    """Each kind of data through a short training on 2 replicas and its evaluation: the
    loss falls, and the held-out metric is the kind's (accuracy; the mean absolute error;
    AUC beside accuracy)."""
    import tensorflow_datasets as tfds

    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.train.evaluation import evaluate_model
    from tfscale.tasks.train.training import train_model

    if kind == "class":
        dataset, label = str(wine_csv(tmp_path)[0]), "target"
    elif kind == "regression":
        from sklearn.datasets import load_diabetes

        load_diabetes(as_frame=True).frame.to_parquet(tmp_path / "d.parquet")
        dataset, label = str(tmp_path / "d.parquet"), "target"
    elif kind == "binary":
        rng = np.random.default_rng(0)
        x = rng.normal(size=(512, 6))
        np.savez(tmp_path / "b.npz", x=x, y=(x[:, 0] + x[:, 1] > 0).astype(int))
        dataset, label = str(tmp_path / "b.npz"), "label"
    elif kind == "tokens":
        (tmp_path / "tokens.py").write_text(textwrap.dedent(TOKENS))
        dataset, label = f"{tmp_path / 'tokens.py'}:make", "label"
    else:
        dataset, label = "imdb_reviews", "label"
    values = {
        "prepare.dataset": dataset,
        "prepare.label": label,
        "prepare.data_dir": str(tmp_path / "tfrecords"),
        "train.runs_dir": str(tmp_path / "runs"),
        "train.model": "mlp",
        "train.strategy": "mirrored",
        "train.replicas": 2,
        "train.epochs": 4,
        "train.precision": "float32",
        "train.jit_compile": False,
        "train.batch_size_per_replica": 16,
        "train.learning_rate": 0.003,
    }
    config = load_config(None, values)
    with tfds.testing.mock_data(num_examples=256):
        prepared = prepare_dataset(config, progress=False)
    report = detect_hardware()
    run = Run(
        config, prepared.manifest, prepared.data_dir, select_strategy(report, config.train), report
    )
    result = train_model(run).result
    assert (result.strategy, result.replicas) == ("mirrored", 2)
    assert Path(result.model_path).is_relative_to(tmp_path / "runs")  # train.runs_dir's
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0], losses
    evaluation = evaluate_model(result.model_path, prepared.manifest, prepared.data_dir, 64)
    if kind == "regression":
        assert set(evaluation.metrics) == {"mean_absolute_error"}
        assert "mean_absolute_error" in result.history[-1]
        # better than predicting the training mean for every example
        _, test = read_all(prepared, "test")
        baseline = np.abs(test - prepared.manifest.spec.label.mean).mean()
        assert evaluation.metrics["mean_absolute_error"] < baseline
        assert "mean absolute error" in evaluation.text()
    elif kind == "binary":
        assert evaluation.metrics["auc"] > 0.9 and "AUC" in evaluation.text()
    elif kind in ("class", "tokens"):
        assert evaluation.test_accuracy > 0.8, evaluation
    else:  # mocked text is random: it trains, and is scored as a binary label is
        assert set(evaluation.metrics) == {"accuracy", "auc"}
    saved = json.loads((Path(result.model_path).parent / "final_eval.json").read_text())
    assert saved["result"]["metrics"] == pytest.approx(evaluation.metrics, nan_ok=True)


@pytest.mark.unit
def test_a_cached_prepare_keys_on_the_users_file_and_module_not_only_the_config(
    tmp_path, monkeypatch
):
    """`tfscale run` reuses a prepare keyed on the config; the user's table edited in place,
    or their pipeline's module, changes the key (`source_fingerprint`), and the shards
    written from the edited table hold its rows."""
    from tfscale.tasks.data.preparation import source_fingerprint

    table = tmp_path / "t.csv"
    table.write_text("a,label\n1,0\n2,1\n3,0\n4,1\n")
    cfg = load_config(None, {"prepare.dataset": str(table)}).prepare
    before = source_fingerprint(cfg)
    first = prepare(tmp_path, str(table))
    table.write_text("a,label\n1,0\n2,1\n3,0\n5,1\n")
    assert source_fingerprint(cfg) != before
    again = prepare(tmp_path, str(table))
    assert again.written == len(again.manifest.shards)
    rows = np.concatenate([read_all(again, s)[0] for s in ("train", "test")])
    assert (
        sorted(rows.ravel().tolist()) == [1, 2, 3, 5]
        and first.manifest.digest != again.manifest.digest
    )

    (tmp_path / "mine.py").write_text("def make():\n    return 1\n")
    monkeypatch.chdir(tmp_path)
    by_module = load_config(None, {"prepare.dataset": "mine:make"}).prepare
    by_file = load_config(None, {"prepare.dataset": "mine.py:make"}).prepare
    was = (source_fingerprint(by_module), source_fingerprint(by_file))
    (tmp_path / "mine.py").write_text("def make():\n    return 2\n")
    now = (source_fingerprint(by_module), source_fingerprint(by_file))
    assert was[0] == was[1] and now[0] == now[1] and was != now
    assert source_fingerprint(load_config(None, {}).prepare) == ""


@pytest.mark.integration
def test_a_new_user_prepares_trains_and_evaluates_a_table_with_the_commands(tmp_path):
    """`tfscale prepare --dataset wine.csv --label target`, then `train` and `evaluate`,
    through the command's own entry: each says what the data is and what it reached."""
    from helpers import run_main, tiny_params

    wine_csv(tmp_path)
    params = ["--params", str(tiny_params(tmp_path, **{"track.store_dir": "mlflow"}))]
    data = ["--dataset", "wine.csv", "--label", "target"]
    code, out, err = run_main([*params, "prepare", *data], tmp_path)
    assert code == 0, err[-2000:]
    assert "alcohol float32" in out and "3 classes" in out, out
    train = [*params, "train", *data, "--no-diagnose", "--strategy", "mirrored"]
    code, out, err = run_main([*train, "--batch-size-per-replica", "16"], tmp_path)
    assert code == 0, err[-2000:]
    assert "training mlp on wine.csv: mirrored, 2 replicas" in out, out
    code, out, err = run_main([*params, "evaluate", *data], tmp_path)
    assert code == 0, err[-2000:]
    assert "test accuracy" in out and "(36 examples)" in out, out


@pytest.mark.integration
def test_the_whole_study_on_a_real_valued_table_logs_its_error_and_no_time_to_target(tmp_path):
    """The study flow on a Parquet table with a real-valued target: the summary gives the
    held-out mean absolute error (no confusion matrix to write or log), the answer says
    there is no time to target, and the MLflow runs end FINISHED with the model logged
    (its signature from the table's ten features)."""
    from helpers import LEAST_WORK, tiny_params
    from sklearn.datasets import load_diabetes

    import mlflow
    from tfscale.flows.study import scaling_study

    load_diabetes(as_frame=True).frame.to_parquet(tmp_path / "diabetes.parquet")
    overrides = {
        "track.store_dir": str(tmp_path / "mlflow"),
        "prepare.dataset": str(tmp_path / "diabetes.parquet"),
        "prepare.label": "target",
    }
    # one epoch at least work: the claims read the held-out error after training, never the
    # speedup's rounds or the noise scale
    config = load_config(tiny_params(tmp_path, **LEAST_WORK, **{"train.epochs": 1}), overrides)
    summary = scaling_study(config, return_state=True).result()
    assert summary.test_metrics["mean_absolute_error"] > 0
    assert (
        "no time to target: no evaluate.target for the held-out mean absolute error"
        in summary.answer
    )
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    runs = client.search_runs(client.search_experiments()[0].experiment_id)
    assert runs and {r.info.status for r in runs} == {"FINISHED"}
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.data.metrics["test_mean_absolute_error"] == pytest.approx(
        summary.test_metrics["mean_absolute_error"], rel=1e-3
    )
    (model,) = client.search_logged_models([parent.info.experiment_id])
    assert str(model.status).endswith("READY")
    # MLflow's fluent API reads the global URI, and setting it also sets the environment's
    # MLFLOW_TRACKING_URI: restored to what the environment said (none in tests), else every
    # later tracker in this process would write to the URI left there
    was = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(client.tracking_uri)
    try:
        info = mlflow.models.get_model_info(f"models:/{model.model_id}")
    finally:
        mlflow.set_tracking_uri(was)
    assert sorted(info.signature.inputs.input_names()) == sorted(
        c for c in load_diabetes(as_frame=True).frame.columns if c != "target"
    )


WEIGHTED = """
import tensorflow as tf

def weighted():
    x = tf.random.stateless_normal((40, 3), seed=(1, 2))
    y = tf.cast(x[:, 0] > 0, tf.int64)
    return tf.data.Dataset.from_tensor_slices((x, y, tf.abs(x[:, 2]) * 3))

def two_labels():
    x = tf.random.stateless_normal((40, 3), seed=(1, 2))
    labels = {"a": tf.cast(x[:, 0] > 0, tf.int64), "b": tf.cast(x[:, 1] > 0, tf.int64)}
    return tf.data.Dataset.from_tensor_slices((x, labels))
"""


@pytest.mark.unit
def test_a_pipeline_of_several_labels_is_refused_at_prepare(tmp_path):
    """Several labels from a tf.data function: refused, naming them, where they would
    otherwise be dropped and something else trained."""
    (tmp_path / "weighted.py").write_text(WEIGHTED)
    expected = r"gives a dict of labels \(a, b\); tfscale trains on one label"
    with pytest.raises(DatasetError, match=expected):
        prepare(tmp_path, f"{tmp_path / 'weighted.py'}:two_labels")
    assert not (tmp_path / "tfrecords").exists() or not any((tmp_path / "tfrecords").rglob("*"))


def read_weighted(result) -> tuple[np.ndarray, np.ndarray]:
    """Every example's features and weight over both splits, as training reads them."""
    rows, weights = [], []
    for split in ("train", "test"):
        reading = Reading(weighted=True)
        for x, _, w in build_dataset(result.manifest, result.data_dir, split, 16, False, reading):
            rows.append(
                np.asarray(
                    x if not isinstance(x, dict) else np.stack([x[k] for k in sorted(x)], axis=-1)
                )
            )
            weights.append(w.numpy())
    return np.concatenate(rows), np.concatenate(weights)


@pytest.mark.unit
@pytest.mark.parametrize("form", ["csv", "csv-named", "npz", "pipeline"])
def test_each_examples_weight_reaches_the_shards_beside_it_never_as_a_feature(tmp_path, form):
    """A table's `sample_weight` column (or one --sample-weight names), an .npz's
    `sample_weight` array, a pipeline's (x, y, w): each example's weight is stored with it,
    read back beside its own features, and is no feature; the manifest says where it came
    from."""
    rng = np.random.default_rng(3)
    x, y, w = rng.normal(size=(30, 2)).astype(np.float32), rng.integers(0, 2, 30), None
    w = rng.uniform(0, 4, size=30).astype(np.float32)
    keys = {}
    if form.startswith("csv"):
        column = "sample_weight" if form == "csv" else "importance"
        rows = "\n".join(
            f"{float(a)!r},{float(b)!r},{c},{float(d)!r}"
            for (a, b), c, d in zip(x, y, w, strict=True)
        )
        (tmp_path / "t.csv").write_text(f"a,b,label,{column}\n" + rows + "\n")
        dataset, keys = str(tmp_path / "t.csv"), {"label": "label"}
        if form == "csv-named":
            keys["sample_weight"] = "importance"
    elif form == "npz":
        np.savez(tmp_path / "t.npz", x=x, y=y, sample_weight=w)
        dataset = str(tmp_path / "t.npz")
    else:
        (tmp_path / "weighted.py").write_text(WEIGHTED)
        dataset = f"{tmp_path / 'weighted.py'}:weighted"
        import tensorflow as tf

        x = tf.random.stateless_normal((40, 3), seed=(1, 2)).numpy()
        w = np.abs(x[:, 2]) * 3
    result = prepare(tmp_path, dataset, **keys)
    spec = result.manifest.spec
    assert spec.weight and len(spec.features) in (1, 2)
    assert all("weight" not in f.name and f.name != "importance" for f in spec.features)
    features, weights = read_weighted(result)
    assert len(weights) == len(w)
    by_row = {
        tuple(np.round(row.ravel(), 5)): wt for row, wt in zip(features, weights, strict=True)
    }
    expected = {tuple(np.round(row.ravel(), 5)): wt for row, wt in zip(x, w, strict=True)}
    assert by_row.keys() == expected.keys()
    assert all(abs(by_row[k] - expected[k]) < 1e-6 for k in expected)
    summary = format_prepared(result).splitlines()
    assert (
        f"weights    each example's loss weighed by its {spec.weight}, as fit(sample_weight=)"
        in summary
    )


@pytest.mark.unit
def test_a_feature_named_weight_is_said_to_be_one_with_the_way_to_weigh_by_it(tmp_path):
    """A column `weight` (a patient's, or each example's?) stays a feature, as it is in
    `df.drop(columns=[label])`, and the summary says how to make it the weights."""
    rows = "\n".join(f"{i},{60 + i % 7},{i % 2}" for i in range(30))
    (tmp_path / "t.csv").write_text("age,weight,label\n" + rows + "\n")
    result = prepare(tmp_path, str(tmp_path / "t.csv"), label="label")
    assert [f.name for f in result.manifest.spec.features] == ["age", "weight"]
    said = "'weight' is a feature the model trains on; if it weighs the examples, prepare "
    assert f"weights    {said}with --sample-weight weight" in format_prepared(result).splitlines()


@pytest.mark.unit
@pytest.mark.parametrize(
    "weights, keys, expected",
    [
        ("class_weight", {}, r"its column 'class_weight' holds weights by its name"),
        ("sample_weight", {"sample_weight": "w"}, r"no column 'w' to take the sample weights"),
        ("sample_weight", {"bad": "-1"}, r"1 weight\(s\) that are not a finite number >= 0"),
        ("sample_weight", {"bad": ""}, r"1 weight\(s\) that are not a finite number >= 0"),
        ("sample_weight", {"bad": "heavy"}, r"holds string values, not the numbers"),
    ],
)
def test_weights_tfscale_cannot_honour_are_refused_by_name_before_any_shard(
    tmp_path, weights, keys, expected
):
    """A weights column named otherwise (it would be a feature), a named column that is not
    there, a negative, blank or text weight: refused, naming it, with nothing written."""
    bad = keys.pop("bad", None)
    values = ["1.5"] * 30
    if bad is not None:
        values[7] = bad
    rows = "\n".join(f"{i},{i % 3},{i % 2},{v}" for i, v in enumerate(values))
    (tmp_path / "t.csv").write_text(f"a,b,label,{weights}\n" + rows + "\n")
    with pytest.raises(DatasetError, match=expected) as caught:
        prepare(tmp_path, str(tmp_path / "t.csv"), label="label", **keys)
    assert "weight" in caught.value.fix
    assert not list(tmp_path.rglob("manifest.json"))


@pytest.mark.unit
def test_a_model_of_one_input_gets_the_numeric_columns_as_df_values_gives_them(tmp_path):
    """`keras.Input(shape=(len(spec.numbers),))` over a table: each example is its row of
    `df.drop(columns=[label]).values`, the columns in the table's order, a text column left
    out; a model of named inputs still gets the dict, and the digest is the manifest's."""
    import keras

    from tfscale.tasks.train.model_inputs import as_model_takes

    path, frame = wine_csv(tmp_path)
    frame.insert(3, "grower", [f"g{i % 3}" for i in range(len(frame))])
    frame.to_csv(path, index=False)
    result = prepare(tmp_path, str(path), label="target")
    spec = result.manifest.spec
    numbers = [c for c in frame.columns if c not in ("target", "grower")]
    assert [f.name for f in spec.numbers] == numbers

    one = keras.Model(i := keras.Input((len(numbers),)), keras.layers.Dense(3)(i))
    fitted = as_model_takes(result.manifest, one)
    assert fitted.spec.packed == tuple(numbers) and fitted.digest == result.manifest.digest
    rows, labels = [], []
    for x, y in build_dataset(fitted, result.data_dir, "test", 16, training=False):
        assert x.shape[1:] == (len(numbers),) and one(x).shape[1:] == (3,)
        rows.append(x.numpy())
        labels.append(y.numpy())
    rows = np.concatenate(rows)
    expected = frame[numbers].to_numpy(np.float32)
    for row, label in zip(rows, np.concatenate(labels), strict=True):
        (at,) = np.flatnonzero((expected == row).all(axis=1))  # the row itself, exactly
        assert frame.target[at] == label

    named = {f.name: keras.Input((1,), name=f.keras_name) for f in spec.features if f.numeric}
    dict_model = keras.Model(
        named, keras.layers.Dense(3)(keras.layers.Concatenate()([*named.values()]))
    )
    assert as_model_takes(result.manifest, dict_model).spec.packed == ()


def _table_with_blanks(tmp_path: Path):
    """Wine with blank cells in two columns: three in early rows, two after row 150."""
    path, frame = wine_csv(tmp_path)
    frame = frame.astype({"magnesium": float})
    frame.loc[[2, 5, 9], "alcohol"] = np.nan
    frame.loc[[151, 170], "magnesium"] = np.nan
    frame.to_csv(path, index=False)
    return path, frame


@pytest.mark.unit
def test_blank_cells_are_refused_naming_each_column_and_count_before_a_shard_is_written(
    tmp_path,
):
    path, _ = _table_with_blanks(tmp_path)
    with pytest.raises(DatasetError, match=r"blank cells \('alcohol' 3, 'magnesium' 2\)") as e:
        prepare(tmp_path, str(path), label="target")
    assert "--missing mean" in e.value.fix and "drop" in e.value.fix
    assert not list(tmp_path.rglob("*.tfrecord")) and not list(tmp_path.rglob("manifest.json"))


@pytest.mark.unit
@pytest.mark.parametrize("missing", ["mean", "zero", "drop"])
def test_blanks_filled_with_the_training_splits_mean_or_zero_or_their_rows_dropped(
    tmp_path, missing
):
    path, frame = _table_with_blanks(tmp_path)
    result = prepare(tmp_path, str(path), label="target", missing=missing)
    spec = result.manifest.spec
    alcohol = next(f for f in spec.features if f.name == "alcohol")
    assert (alcohol.blanks, alcohol.missing) == (3, missing)
    train, train_labels = read_all(result, "train")
    test, test_labels = read_all(result, "test")
    both = np.concatenate([train["alcohol"], test["alcohol"]])
    assert not np.isnan(both).any() and not np.isnan(train["magnesium"]).any()
    if missing == "drop":
        assert len(train_labels) + len(test_labels) == len(frame) - 5
        return
    assert len(train_labels) + len(test_labels) == len(frame)
    known = set(frame.alcohol.dropna().astype(np.float32).tolist())
    filled = [v for v in both.tolist() if v not in known]
    assert len(filled) == 3 and len(set(filled)) == 1
    if missing == "zero":
        assert filled[0] == 0.0
    else:  # the mean over the training split's known values, never the held-out rows'
        kept = train["alcohol"][np.isin(train["alcohol"], list(known))]
        assert filled[0] == pytest.approx(kept.mean(), rel=1e-5)
        everything = frame.alcohol.mean()
        assert filled[0] != pytest.approx(everything, rel=1e-7)


PIPELINES = """
import tensorflow as tf


def rows(seed):
    x = tf.reshape(tf.range(180, dtype=tf.float32), [180, 1])
    y = tf.range(180) % 3
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return ds.shuffle(200, seed=seed) if seed != "none" else ds.shuffle(200)


def unseeded():
    return rows("none")


def seeded():
    return rows(7)


def noisy():  # the labels as read each time, the features not
    return rows(7).map(lambda x, y: (x + tf.random.uniform([1]), y))


def flipped():  # a guide's augmentation, as a map over the examples
    images = tf.reshape(tf.range(180 * 4, dtype=tf.float32), [180, 2, 2, 1])
    ds = tf.data.Dataset.from_tensor_slices((images, tf.range(180) % 3))
    return ds.map(lambda x, y: (tf.image.random_flip_left_right(x), y))
"""


@pytest.mark.unit
def test_a_pipeline_that_changes_between_reads_is_refused_and_a_seeded_one_never_leaks(
    tmp_path, monkeypatch
):
    """An unseeded `.shuffle` gives other examples at each read: refused, where prepare
    wrote 26 of 36 test rows into train as well; so is a random map (noise, a flip), which
    would be drawn once and reach the held-out split too. A seeded shuffle (Keras's reshuffle each
    iteration included) gives the same examples each time: no row in both splits."""
    (tmp_path / "pipes.py").write_text(PIPELINES)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match="other examples each time it is read") as e:
        prepare(tmp_path, "pipes.py:unseeded")
    assert "seed=" in e.value.fix
    import tensorflow as tf

    # under a global seed (an earlier test's, a notebook's training) TensorFlow draws the
    # same values at each read of a freshly made pipeline: the draws repeat, unseeded here
    tf.random.set_seed(None)
    for changing in ("noisy", "flipped"):  # a random map: the features differ, not labels
        with pytest.raises(DatasetError, match="other feature values") as e:
            prepare(tmp_path, f"pipes.py:{changing}")
        assert "put augmentation in the model" in e.value.fix
    result = prepare(tmp_path, "pipes.py:seeded")
    train, _ = read_all(result, "train")
    test, _ = read_all(result, "test")
    assert len(train) + len(test) == 180
    assert not set(train.ravel().tolist()) & set(test.ravel().tolist())


@pytest.mark.unit
def test_every_model_gets_images_as_the_spec_says_whatever_its_name(digits, tmp_path):
    """The spec says uint8: a user's model gets uint8 in 0-255, whether the images are a
    built-in set or an `.npz` of uint8 images with a class or a binary label, and named
    like a built-in (`cnn`) or not; a built-in takes the same uint8 and scales it to
    [0, 1] as its own first layer."""
    import keras

    from tfscale.tasks.train.model_inputs import as_model_takes
    from tfscale.tasks.train.models import model_for_data

    _, manifest, data_dir = digits
    spec = manifest.spec
    assert spec.features[0].dtype == "uint8"
    inputs = keras.Input(spec.shape, dtype="uint8")
    scaled = keras.layers.Rescaling(1 / 255)(inputs)
    for name in ("digits_net", "cnn", "mlp", "resnet", "embedding"):
        mine = keras.Model(
            inputs, keras.layers.Dense(10)(keras.layers.Flatten()(scaled)), name=name
        )
        taken = as_model_takes(manifest, mine)
        x, _ = next(iter(build_dataset(taken, data_dir, "test", 64, False)))
        assert x.dtype == "uint8" and int(x.numpy().max()) > 1, name
    built_in = model_for_data("cnn", spec).model
    x, _ = next(
        iter(build_dataset(as_model_takes(manifest, built_in), data_dir, "test", 64, False))
    )
    assert x.dtype == "uint8" and built_in.inputs[0].dtype == "uint8"
    first = keras.Model(built_in.inputs, built_in.get_layer("to_unit_range").output)
    scaled_x = first(x).numpy()
    assert np.allclose(scaled_x, x.numpy() / 255.0) and scaled_x.max() > 0.5

    images = np.random.default_rng(0).integers(0, 256, (60, 8, 8, 1), dtype=np.uint8)
    for label in (np.arange(60) % 3, np.arange(60) % 2):  # a class label, then a binary one
        np.savez(tmp_path / "i.npz", x=images, y=label)
        result = prepare(tmp_path / str(label.max()), str(tmp_path / "i.npz"))
        as_taken = dataclasses.replace(result, manifest=as_model_takes(result.manifest, mine))
        got, _ = read_all(as_taken, "test")
        assert got.dtype == np.uint8 and got.max() > 1, label.max()


@pytest.mark.unit
@pytest.mark.parametrize("form", ["csv", "npz"])
def test_a_feature_named_as_tfscales_own_keys_keeps_its_values_beside_the_label(tmp_path, form):
    """Columns and arrays named `label`, `weight`, `image`, `x` and `y` are features like any
    other: the shards hold their values, never the target's, and their statistics are
    theirs (a real-valued target, whose statistics the shards add up too)."""
    rng = np.random.default_rng(3)
    names = ["label", "weight", "image", "x", "y"]
    columns = {name: rng.normal(10 * i, 1 + i, 200) for i, name in enumerate(names)}
    columns["row"] = np.arange(200, dtype=np.float64)
    target = rng.normal(-50.0, 5.0, 200)
    if form == "csv":
        import pandas as pd

        pd.DataFrame({**columns, "target": target}).to_csv(tmp_path / "t.csv", index=False)
    else:
        np.savez(tmp_path / "t.npz", target=target, **columns)
    result = prepare(tmp_path, str(tmp_path / f"t.{form}"), label="target")
    spec = result.manifest.spec
    assert sorted(f.name for f in spec.features) == sorted([*names, "row"])
    assert spec.label.kind == "regression"
    features, labels = read_all(result, "train")
    rows = features["row"].astype(int)
    for name in names:
        assert np.allclose(features[name], columns[name][rows], atol=1e-4), name
        feature = next(f for f in spec.features if f.name == name)
        assert feature.mean == pytest.approx(features[name].mean(), abs=1e-3), name
    assert np.allclose(labels, target[rows], atol=1e-4)
    assert spec.label.mean == pytest.approx(labels.mean(), abs=1e-3)


@pytest.mark.unit
def test_arrays_beside_x_and_y_are_refused_not_left_out_and_a_named_label_wins(tmp_path):
    rng = np.random.default_rng(4)
    x, noise = rng.normal(size=(100, 3)), rng.normal(size=100)
    y = (x[:, 0] > 0).astype(np.int64)
    np.savez(tmp_path / "xy.npz", x=x, y=y, label=noise)
    with pytest.raises(DatasetError, match=r"holds label beside x, y.*leave them out") as caught:
        prepare(tmp_path, str(tmp_path / "xy.npz"))
    assert "--label" in caught.value.fix
    result = prepare(tmp_path, str(tmp_path / "xy.npz"), label="y")
    assert sorted(f.name for f in result.manifest.spec.features) == ["label", "x"]


@pytest.mark.unit
def test_shards_of_the_earlier_record_layout_are_refused_and_prepare_rewrites_them(tmp_path):
    from tfscale.tasks.data.manifest import MANIFEST_NAME, ShardError, load_manifest

    path, _ = wine_csv(tmp_path)
    result = prepare(tmp_path, str(path), label="target")
    params = {k: v for k, v in result.manifest.params.items() if k != "records"}
    earlier = dataclasses.replace(result.manifest, params=params)
    (Path(result.data_dir) / MANIFEST_NAME).write_text(earlier.file_text())
    with pytest.raises(ShardError, match=r"prepared by an earlier tfscale.*prepare --dataset"):
        load_manifest(result.data_dir)
    again = prepare(tmp_path, str(path), label="target")
    assert again.written == len(again.manifest.shards)
    assert load_manifest(again.data_dir).params["records"] == 2


@pytest.mark.unit
@pytest.mark.parametrize("source", ["csv", "parquet"])
def test_time_stamps_are_read_as_pandas_reads_them_and_their_resolution_said(tmp_path, source):
    """`Z`, `+01:00` and fractions of a second are parsed as pandas parses them (the
    instant, in UTC), in a CSV and in a Parquet file of sub-second datetimes; a blank is a
    blank cell; the features line says how near float32 days keep them."""
    import pandas as pd

    stamps = ["2024-05-01T10:30:00Z", "2024-05-01T11:30:00+01:00", "2024-05-02T10:30:00.25Z"]
    stamps = stamps * 20
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"t": stamps, "x": rng.normal(size=60), "y": np.arange(60) % 2})
    path = tmp_path / f"t.{source}"
    if source == "csv":
        frame.to_csv(path, index=False)
    else:
        frame["t"] = pd.to_datetime(frame["t"], format="ISO8601", utc=True)
        frame.to_parquet(path)
    result = prepare(tmp_path, str(path), label="y")
    assert re.search(r"t date as days since 1970 \(to \+-84 s\)", result.manifest.spec.describe())
    train, _ = read_all(result, "train")
    test, _ = read_all(result, "test")
    days = np.concatenate([train["t"], test["t"]])
    expected = pd.to_datetime(pd.Series(stamps), format="ISO8601", utc=True)
    expected = expected.dt.tz_convert(None).to_numpy("datetime64[ns]").astype(np.int64) / 86_400e9
    assert sorted(set(days.tolist())) == sorted(set(expected.astype(np.float32).tolist()))
    assert len(set(days.tolist())) == 2  # 10:30Z and 11:30+01:00 are one instant
    frame = pd.DataFrame({"t": ["2024-05-01T10:00:00Z", ""] * 15, "y": np.arange(30) % 2})
    frame.to_csv(tmp_path / "gaps.csv", index=False)
    with pytest.raises(DatasetError, match=r"blank cells \('t' 15\)"):
        prepare(tmp_path, str(tmp_path / "gaps.csv"), label="y")


@pytest.mark.unit
def test_columns_keras_would_name_alike_are_refused_naming_both(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"a b": np.arange(20.0), "a/b": np.arange(20.0), "y": np.arange(20) % 2})
    frame.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DatasetError, match=r"features 'a b' and 'a/b' are both 'a_b'") as e:
        prepare(tmp_path, str(tmp_path / "t.csv"), label="y")
    assert "rename one of 'a b' and 'a/b'" in e.value.fix
    assert not list(tmp_path.rglob("*.tfrecord"))


@pytest.mark.unit
def test_infinities_and_numbers_past_float32_are_blanks_refused_or_filled(tmp_path):
    """`inf` and `1e308` (inf in float32) are blank cells: refused naming the column and
    count, or filled from the training split's mean with `--missing mean`."""
    import pandas as pd

    values = np.arange(40.0)
    values[[3, 9]] = [np.inf, 1e308]
    pd.DataFrame({"x": values, "y": np.arange(40) % 2}).to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DatasetError, match=r"blank cells \('x' 2\)"):
        prepare(tmp_path, str(tmp_path / "t.csv"), label="y")
    result = prepare(tmp_path, str(tmp_path / "t.csv"), label="y", missing="mean")
    train, _ = read_all(result, "train")
    test, _ = read_all(result, "test")
    assert np.isfinite(np.concatenate([train, test])).all()  # one feature: its values


@pytest.mark.unit
def test_data_that_cannot_teach_is_refused_naming_why(tmp_path):
    """One label value (a table's, an image folder's one class folder) and a column name
    given twice, each refused at prepare before a shard is written."""
    import pandas as pd
    from PIL import Image

    frame = pd.DataFrame({"x": np.arange(20.0), "y": ["yes"] * 20})
    frame.to_csv(tmp_path / "one.csv", index=False)
    with pytest.raises(DatasetError, match=r"every example has the same label \('yes'\)"):
        prepare(tmp_path, str(tmp_path / "one.csv"), label="y")
    (tmp_path / "twice.csv").write_text(
        "a,a,y\n" + "".join(f"{i},{-i},{i % 2}\n" for i in range(20))
    )
    with pytest.raises(DatasetError, match=r"column name\(s\) 'a' appear more than once"):
        prepare(tmp_path, str(tmp_path / "twice.csv"), label="y")
    for i in range(6):
        path = tmp_path / "cats" / "cat" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4, 3), i, np.uint8)).save(path)
    with pytest.raises(DatasetError, match=r"holds one class \(cat\)"):
        prepare(tmp_path, str(tmp_path / "cats"))
    assert not list(tmp_path.rglob("*.tfrecord"))


@pytest.mark.unit
def test_a_row_of_too_many_fields_past_the_first_block_is_named_as_such(tmp_path):
    """A CSV row with an extra field after the first 4 MiB read: said as a row of 4 fields
    against a header of 3, not as a column of mixed types."""
    path = tmp_path / "t.csv"
    with path.open("w") as out:
        out.write("a,b,label\n")
        out.writelines(f"{i},{i % 7},{i % 2}\n" for i in range(400_000))
        out.write("1,2,3,4\n")
    assert path.stat().st_size > 4 << 20
    with pytest.raises(DatasetError, match=r"a row has 4 fields where the header has 3") as e:
        prepare(tmp_path, str(path))
    assert "one field per column" in e.value.fix


@pytest.mark.integration
def test_a_users_module_importing_tensorflow_keeps_its_start_up_lines_off_the_console(tmp_path):
    """A tf.data function's module that imports TensorFlow itself, loaded as prepare loads
    it (`--dataset pipeline.py:make`): TensorFlow's C++ start-up lines ("All log messages
    before absl::InitializeLog()", the CPU and CUDA notices) stay off the console. The
    first import in a process is the claim, so the load runs in one of its own."""
    import subprocess
    import sys

    from helpers import ROOT, scaled

    (tmp_path / "pipeline.py").write_text(
        "import tensorflow as tf\n\ndef make():\n    return tf.data.Dataset.range(4)\n"
    )
    load = (
        "from tfscale.tasks.core.user_code import load_function\n"
        "make, _ = load_function('pipeline.py:make')\n"
        "print('loaded', make.__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-c", load],
        cwd=tmp_path,
        env=dict(env, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert proc.returncode == 0 and "loaded make" in proc.stdout, proc.stderr[-2000:]
    assert proc.stderr == "", proc.stderr[-2000:]


@pytest.mark.unit
def test_several_label_columns_are_refused_naming_them_before_any_shard(tmp_path):
    """`--label a,b` (two targets, a model of two outputs): refused rather than read as
    one column's name, with the multi-label form tfscale takes."""
    rows = "\n".join(f"{i},{i % 2},{i % 3 == 0:d}" for i in range(30))
    (tmp_path / "t.csv").write_text("x,a,b\n" + rows + "\n")
    with pytest.raises(DatasetError, match=r"--label names 2 columns \(a, b\)") as caught:
        prepare(tmp_path, str(tmp_path / "t.csv"), label="a,b")
    assert "--label-kind multi_label" in caught.value.fix
    assert not list(tmp_path.rglob("manifest.json"))
