"""Any tensorflow-datasets set, by name, as a tfscale source: one image and a class in the
original image format (`TfdsSource`), any other features (text, numbers, dicts of them)
as a stream (`tasks.data.pipelines.datasets_source`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tfscale.tasks.data.datasets import DatasetError, Example, FeatureSpec, ImageSource
from tfscale.tasks.settings.config import PrepareConfig


@dataclass
class TfdsSource(ImageSource):
    """A TFDS builder read by split slices (`train[100:200]`), in file order."""

    builder: Any
    image_key: str
    label_key: str
    spec: FeatureSpec
    splits: dict[str, int]

    @property
    def name(self) -> str:
        return self.builder.name

    @property
    def version(self) -> str:
        return str(self.builder.version)

    def examples(self, split: str, start: int, stop: int) -> Iterator[Example]:
        import tensorflow_datasets as tfds

        ds = self.builder.as_dataset(split=f"{split}[{start}:{stop}]", shuffle_files=False)
        for row in tfds.as_numpy(ds.take(stop - start)):
            yield row[self.image_key], int(row[self.label_key])


def tfds_source(name: str, cfg: PrepareConfig | None = None) -> Any:
    """Prepares (downloads where a network exists) and opens a TFDS dataset.

    Its features and label: the supervised keys TFDS declares; else the label under
    `cfg.label` and the rest as features; else its first image and class label.

    Raises:
        DatasetError: unknown name, failed download, or no label to be found.
    """
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=os.environ.get("TFDS_DATA_DIR"))
    except tfds.core.registered.DatasetNotFoundError:
        raise DatasetError(
            f"Unknown dataset {name!r}: expected 'digits', 'synthetic', an image folder "
            f"(<root>/<class>/*.png or <root>/train|test/<class>/*.png), a table (.csv, "
            f".parquet), arrays (.npz), a function (pkg.module:function or "
            f"file.py:function), or a tensorflow-datasets name such as 'mnist'."
        ) from None
    try:
        builder.download_and_prepare()
    except Exception as exc:  # noqa: BLE001 - TFDS raises many kinds; all mean "not available"
        raise DatasetError(
            f"Could not download or prepare TFDS dataset {name!r} ({type(exc).__name__}: "
            f"{str(exc)[:200]}). Without a network, use --dataset digits or synthetic, or put "
            f"the prepared dataset under $TFDS_DATA_DIR."
        ) from None
    cfg = cfg or PrepareConfig(dataset=name)
    features = builder.info.features
    if not _one_image_and_class(builder, cfg.label):
        return _stream_source(builder, cfg)
    image_key = _find_feature(features, tfds.features.Image, name, "an Image")
    label_key = _find_feature(features, tfds.features.ClassLabel, name, "a ClassLabel")
    label = features[label_key]
    names = tuple(label.names) if label.names else tuple(str(i) for i in range(label.num_classes))
    spec = FeatureSpec.image(tuple(features[image_key].shape), names)
    if None in spec.shape:
        raise DatasetError(f"{name!r} has images of varying size {spec.shape}; tfscale needs one.")
    splits = {s: i.num_examples for s, i in builder.info.splits.items()} or _count_splits(builder)
    return TfdsSource(builder, image_key, label_key, spec, splits)


def _one_image_and_class(builder: Any, label: str) -> bool:
    """Whether the set's examples are one image of fixed shape and a class (the image
    format): its supervised keys say so, or, without them, it has an image and a class
    label and no feature named `label`."""
    import tensorflow_datasets as tfds

    features = builder.info.features
    keys = builder.info.supervised_keys
    if keys and all(isinstance(k, str) for k in keys[:2]):
        image, target = features[keys[0]], features[keys[1]]
    elif label in features.keys() and not isinstance(features[label], tfds.features.ClassLabel):
        return False
    else:
        image = _first(features, tfds.features.Image)
        target = _first(features, tfds.features.ClassLabel)
    return (
        isinstance(image, tfds.features.Image)
        and isinstance(target, tfds.features.ClassLabel)
        and None not in tuple(image.shape)
        and len(features.keys()) <= 3
    )


def _first(features: Any, kind: type) -> Any:
    return next((f for f in features.values() if isinstance(f, kind)), None)


def _stream_source(builder: Any, cfg: PrepareConfig) -> Any:
    """Any other set: its own train and test splits where it has both, else its train
    split split by `cfg.test_fraction`."""
    import tensorflow_datasets as tfds

    from tfscale.tasks.data.pipelines import datasets_source

    features = builder.info.features
    keys = builder.info.supervised_keys
    supervised = bool(keys) and all(isinstance(k, str) for k in keys[:2])
    label_key = keys[1] if supervised else cfg.label
    if label_key not in features.keys():
        raise DatasetError(
            f"TFDS dataset {builder.name!r} has no feature {label_key!r} to take the label "
            f"from (its features: {', '.join(features.keys())})",
            "name the label's feature with --label (prepare.label)",
        )
    target = features[label_key]
    names = tuple(target.names) if isinstance(target, tfds.features.ClassLabel) else ()
    available = set(builder.info.splits.keys()) or set(_count_splits(builder))
    splits = ["train", "test"] if {"train", "test"} <= available else ["train"]
    if "train" not in available:
        raise DatasetError(
            f"TFDS dataset {builder.name!r} has no train split (it has "
            f"{', '.join(sorted(available))})",
            "choose a set with a train split",
        )

    def read(split: str) -> Any:
        ds = builder.as_dataset(split=split, shuffle_files=False)
        if supervised:  # the input feature alone, under its own name
            ds = ds.map(lambda e: ({keys[0]: e[keys[0]]}, e[label_key]))
        return ds

    datasets = {s: read(s) for s in splits} if len(splits) == 2 else {None: read("train")}
    return datasets_source(builder.name, str(builder.version), datasets, cfg, label_key, names)


def _find_feature(features: Any, kind: type, name: str, what: str) -> str:
    for key, feature in features.items():
        if isinstance(feature, kind):
            return key
    raise DatasetError(f"TFDS dataset {name!r} has no {what} feature; tfscale classifies images.")


def _count_splits(builder: Any) -> dict[str, int]:
    """Split sizes read off the data itself, for builders whose metadata lacks them."""
    counts = {}
    for split in ("train", "validation", "test"):
        try:
            counts[split] = sum(1 for _ in builder.as_dataset(split=split))
        except Exception:  # noqa: BLE001 - the split does not exist
            continue
    return {s: n for s, n in counts.items() if n}
