"""What docs/data.md promises of the data, each claim at the narrowest boundary that proves
it, in this process (issue 61, item 2): `$TFDS_DATA_DIR` for a local copy, a TFDS set that
cannot download, a blank text cell, the image models on a uint8 `.npz`, and empty labels.
(Integer labels of more than 256 values are proven by tests/core/test_label_kinds.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.data.inputs import build_dataset
from tfscale.tasks.data.preparation import prepare_dataset
from tfscale.tasks.settings.config import load_config


def prepare(tmp_path: Path, dataset: str, **keys):
    values = {"prepare.dataset": dataset, "prepare.data_dir": str(tmp_path / "tfrecords")}
    values.update({f"prepare.{k}": v for k, v in keys.items()})
    return prepare_dataset(load_config(None, values), progress=False)


class Builders:
    """`tfds.builder` as tfscale calls it: each call's `data_dir` kept; its builder's
    download raising `failure` (None: the set is there, and the stub stops the prepare
    once it is asked for its features)."""

    def __init__(self, failure: Exception | None = None):
        self.data_dirs: list[str | None] = []
        self.failure = failure

    def __call__(self, name, data_dir=None):
        self.data_dirs.append(data_dir)
        failure = self.failure

        class Builder:
            def download_and_prepare(self):
                if failure is not None:
                    raise failure

            @property
            def info(self):
                raise LookupError("prepared from the local copy")

        return Builder()


@pytest.mark.unit
def test_tfds_reads_its_sets_from_tfds_data_dir(monkeypatch, tmp_path):
    """`$TFDS_DATA_DIR` names the folder TFDS prepares and reads a set from (a local copy,
    without a network); unset, TFDS's own default."""
    import tensorflow_datasets as tfds

    from tfscale.tasks.data.tfds_source import tfds_source

    builders = Builders()
    monkeypatch.setattr(tfds, "builder", builders)
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "copy"))
    with pytest.raises(LookupError, match="local copy"):
        tfds_source("mnist")
    monkeypatch.delenv("TFDS_DATA_DIR")
    with pytest.raises(LookupError):
        tfds_source("mnist")
    assert builders.data_dirs == [str(tmp_path / "copy"), None]


@pytest.mark.unit
@pytest.mark.parametrize("failure", [ConnectionError("no route to host"), OSError("offline")])
def test_a_tfds_set_that_cannot_download_is_refused_naming_the_local_copy(
    monkeypatch, tmp_path, failure
):
    """A TFDS set that is not downloaded and cannot be: prepare stops with one error naming
    the set, what TFDS said, and the ways out (digits, synthetic, `$TFDS_DATA_DIR`),
    before a shard or manifest is written."""
    import tensorflow_datasets as tfds

    monkeypatch.setattr(tfds, "builder", Builders(failure))
    with pytest.raises(DatasetError) as caught:
        prepare(tmp_path, "mnist")
    said = str(caught.value)
    assert "Could not download or prepare TFDS dataset 'mnist'" in said
    assert type(failure).__name__ in said and "$TFDS_DATA_DIR" in said
    assert not list(tmp_path.rglob("*.tfrecord")) and not list(tmp_path.rglob("manifest.json"))


@pytest.mark.unit
@pytest.mark.parametrize("source", ["csv", "parquet"])
def test_a_blank_text_cell_is_the_empty_string_a_value_like_any_other(tmp_path, source):
    """A table's blank text cell (a CSV's empty field, a Parquet null) is not a blank
    numeric cell: nothing is refused or filled, and the model reads the empty string (a
    blank number in the same table is refused)."""
    import pandas as pd

    grower = [None if i % 5 == 0 else "north" if i % 2 else "south" for i in range(40)]
    frame = pd.DataFrame({"grower": grower, "size": range(40), "label": [i % 2 for i in range(40)]})
    path = tmp_path / f"t.{source}"
    frame.to_csv(path, index=False) if source == "csv" else frame.to_parquet(path)
    result = prepare(tmp_path, str(path))
    feature = next(f for f in result.manifest.spec.features if f.name == "grower")
    assert (feature.dtype, feature.blanks, feature.missing) == ("string", 0, "")
    read = []
    for split in ("train", "test"):
        for x, _ in build_dataset(result.manifest, result.data_dir, split, 64, training=False):
            read += [v.decode() for v in x["grower"].numpy().ravel()]
    assert len(read) == 40 and read.count("") == 8 and set(read) == {"", "north", "south"}
    frame["size"] = frame["size"].astype(float).where(frame.index != 3)
    frame.to_csv(path, index=False) if source == "csv" else frame.to_parquet(path)
    with pytest.raises(DatasetError, match=r"blank cells \('size' 1\)"):
        prepare(tmp_path / "n", str(path))


@pytest.mark.unit
def test_the_image_models_train_on_a_uint8_npz_of_images_with_class_labels(tmp_path):
    """An `.npz` of uint8 images (`N x H x W x C`) with class labels is stored as the
    built-in image sets are: the image format, so `cnn` and `resnet` build on it, get
    its uint8 images as stored and scale them to [0, 1] in their first layer, as on digits."""
    import keras

    from tfscale.tasks.train.model_inputs import as_model_takes
    from tfscale.tasks.train.models import model_for_data

    images = np.random.default_rng(0).integers(0, 256, (60, 8, 8, 1), dtype=np.uint8)
    np.savez(tmp_path / "i.npz", x=images, y=np.arange(60) % 3)
    result = prepare(tmp_path, str(tmp_path / "i.npz"))
    spec = result.manifest.spec
    assert spec.is_image and spec.shape == (8, 8, 1) and spec.num_classes == 3
    for name in ("cnn", "resnet"):
        model = model_for_data(name, spec).model
        taken = as_model_takes(result.manifest, model)
        x, y = next(iter(build_dataset(taken, result.data_dir, "train", 16, training=False)))
        assert x.dtype == "uint8"
        scaled = model.get_layer("to_unit_range")(x)
        assert 0.0 <= float(scaled.numpy().min()) and 0.5 < float(scaled.numpy().max()) <= 1.0
        assert keras.ops.shape(model(x))[-1] == 3


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["numbers", "text"])
@pytest.mark.parametrize("source", ["csv", "parquet"])
def test_empty_labels_are_refused_at_prepare_naming_the_column_and_count(tmp_path, source, kind):
    """A table whose label column has empty values (a number's blank; a text's blank or
    spaces, never a class ""): prepare stops with one error naming the file, the column
    and how many, and the fix, before a shard is written."""
    import pandas as pd

    frame = pd.DataFrame({"a": np.arange(30.0), "label": [float(i % 2) for i in range(30)]})
    if kind == "text":
        frame["label"] = [("no", "yes")[i % 2] for i in range(30)]
        frame.loc[[3, 17], "label"] = ["", " "]
    else:
        frame.loc[[3, 17], "label"] = np.nan
    path = tmp_path / f"t.{source}"
    frame.to_csv(path, index=False) if source == "csv" else frame.to_parquet(path)
    with pytest.raises(DatasetError, match=r"column 'label' has 2 empty value\(s\)") as caught:
        prepare(tmp_path, str(path))
    assert "fill them or drop those rows" in caught.value.fix
    assert not list(tmp_path.rglob("*.tfrecord"))


@pytest.mark.unit
def test_two_class_images_read_as_binary_get_the_fix_that_works_for_the_image_models(tmp_path):
    """A uint8 image `.npz` with a label of two values is read as binary: `--model cnn`
    is refused with `--label-kind class`, which makes it the image format cnn takes."""
    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.train.models import model_for_data

    images = np.random.default_rng(0).integers(0, 256, (40, 8, 8, 1), dtype=np.uint8)
    np.savez(tmp_path / "i.npz", x=images, y=np.arange(40) % 2)
    spec = prepare(tmp_path, str(tmp_path / "i.npz")).manifest.spec
    with pytest.raises(UsageError, match="label of two values, read as binary") as caught:
        model_for_data("cnn", spec)
    assert "--label-kind class" in caught.value.fix
    again = prepare(tmp_path / "as_classes", str(tmp_path / "i.npz"), label_kind="class")
    assert model_for_data("cnn", again.manifest.spec).model.output_shape[-1] == 2
