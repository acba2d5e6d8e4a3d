"""`train.class_weight` (`--class-weight`): read, checked against the label before any
work, and `balanced` made the weights scikit-learn's `compute_class_weight` gives, once,
on the training split (`distribute.run.Run`). That the weights train as Keras's
`fit(class_weight=)` trains them: tests/train/test_fidelity.py."""

from __future__ import annotations

import numpy as np
import pytest

from tfscale.tasks.core.class_weights import parsed, resolved
from tfscale.tasks.core.errors import UsageError
from tfscale.tasks.settings.config import ConfigError, load_config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text, expected",
    [
        ("none", "none"),
        ("balanced", "balanced"),
        ("cat=2, dog=0.5", {"cat": 2.0, "dog": 0.5}),
        ("1=3", {"1": 3.0}),
    ],
)
def test_the_setting_reads_none_balanced_or_pairs(text, expected):
    assert parsed(text) == expected


@pytest.mark.parametrize(
    "text, said",
    [
        ("balance", "expected none, balanced, or class=weight pairs"),
        ("cat=two", "the weight of 'cat' is not a number"),
        ("cat=-1", "must be a finite number >= 0"),
        ("cat=nan", "must be a finite number >= 0"),
        ("cat=1,cat=2", "'cat' is given twice"),
    ],
)
def test_a_malformed_setting_is_refused_as_the_config_loads(text, said):
    with pytest.raises(ConfigError, match=said) as caught:
        load_config(None, {"train.class_weight": text})
    assert "train.class_weight" in caught.value.message


def test_pairs_weigh_the_classes_they_name_by_name_or_index_and_the_rest_one():
    names = ("cat", "dog", "owl")
    assert resolved("dog=3,0=0.5", "class", names, [1, 1, 1]) == (0.5, 3.0, 1.0)
    assert resolved("none", "class", names, [1, 1, 1]) == ()
    with pytest.raises(UsageError, match="the label has no class 'emu'; its classes are cat"):
        resolved("emu=2", "class", names, [1, 1, 1])


def test_balanced_is_scikit_learns_balanced_weights():
    from sklearn.utils.class_weight import compute_class_weight

    y = np.array([0] * 70 + [1] * 20 + [2] * 10)
    expected = compute_class_weight("balanced", classes=np.arange(3), y=y)
    found = resolved("balanced", "class", ("a", "b", "c"), np.bincount(y).tolist())
    assert np.allclose(found, expected, rtol=1e-12)
    with pytest.raises(UsageError, match="class c has no training example"):
        resolved("balanced", "class", ("a", "b", "c"), [5, 5, 0])


@pytest.mark.parametrize("kind", ["regression", "multi_label"])
def test_class_weights_on_a_label_of_no_classes_are_refused(kind):
    with pytest.raises(UsageError, match=f"the label is {kind}") as caught:
        resolved("balanced", kind, (), [])
    assert "--class-weight none" in caught.value.fix


def test_a_run_makes_balanced_the_weights_of_its_training_split_and_says_them(tmp_path, caplog):
    """On a prepared table (breast cancer: 212 malignant, 357 benign, some held out): the
    run's config carries the explicit weights, as every process of it reads them."""
    import logging

    from sklearn.datasets import load_breast_cancer
    from sklearn.utils.class_weight import compute_class_weight

    from tfscale.tasks.data.inputs import class_counts
    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.distribute.strategy import select_strategy

    load_breast_cancer(as_frame=True).frame.to_csv(tmp_path / "cancer.csv", index=False)
    values = {
        "prepare.dataset": str(tmp_path / "cancer.csv"),
        "prepare.label": "target",
        "prepare.data_dir": str(tmp_path / "data"),
        "train.class_weight": "balanced",
        "train.strategy": "one_device",
    }
    config = load_config(None, values)
    prepared = prepare_dataset(config, progress=False)
    manifest = prepared.manifest
    report = detect_hardware()
    choice = select_strategy(report, config.train)
    with caplog.at_level(logging.INFO):
        run = Run(config, manifest, prepared.data_dir, choice, report)

    counts = class_counts(manifest, prepared.data_dir, 2)
    assert sum(counts) == manifest.splits["train"]
    y = np.repeat([0, 1], counts)
    expected = compute_class_weight("balanced", classes=np.arange(2), y=y)
    weights = parsed(run.train.class_weight)
    assert list(weights) == ["0", "1"]
    assert np.allclose([weights["0"], weights["1"]], expected, rtol=1e-12)
    assert f"balanced over {sum(counts):,} training examples" in caplog.text
    again = Run(run.config, manifest, prepared.data_dir, run.choice, report)
    assert again.train.class_weight == run.train.class_weight  # read once, kept


@pytest.mark.parametrize(
    "setting, strategy, said",
    [
        ("balanced", "one_device", "the data already weighs each example by its array"),
        ("none", "pipeline", "cuts the model into stages that do not carry the examples' weights"),
    ],
)
def test_weighted_data_is_refused_where_its_weights_would_be_lost_before_any_training(
    tmp_path, setting, strategy, said
):
    """Arrays with a `sample_weight` array: class weights as well (Keras's fit takes one or
    the other), or a strategy whose stages run the kind's loss alone: refused as the run is
    made, naming the weights and the way out."""
    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.distribute.strategy import select_strategy

    rng = np.random.default_rng(5)
    x = rng.normal(size=(60, 4)).astype("float32")
    np.savez(tmp_path / "w.npz", x=x, y=x[:, 0] > 0, sample_weight=rng.uniform(size=60))
    values = {
        "prepare.dataset": str(tmp_path / "w.npz"),
        "prepare.data_dir": str(tmp_path / "data"),
        "train.class_weight": setting,
        "train.strategy": strategy,
        "train.model": "mlp",
    }
    config = load_config(None, values)
    prepared = prepare_dataset(config, progress=False)
    report = detect_hardware()
    choice = select_strategy(report, config.train)
    with pytest.raises(UsageError, match=said) as caught:
        Run(config, prepared.manifest, prepared.data_dir, choice, report)
    assert "without its sample weights" in caught.value.fix
