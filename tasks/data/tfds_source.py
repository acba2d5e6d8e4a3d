"""Any tensorflow-datasets image-classification dataset, by name, as a tfscale source."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tasks.data.datasets import DatasetError, Example, FeatureSpec


@dataclass
class TfdsSource:
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


def tfds_source(name: str) -> TfdsSource:
    """Prepares (downloads where a network exists) and opens a TFDS dataset.

    Raises:
        DatasetError: unknown name, failed download, or no image/label features.
    """
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=os.environ.get("TFDS_DATA_DIR"))
    except tfds.core.registered.DatasetNotFoundError:
        raise DatasetError(
            f"Unknown dataset {name!r}: expected 'digits', 'synthetic', an image folder "
            f"(<root>/<split>/<label>/*.png), or a tensorflow-datasets name such as 'mnist'."
        ) from None
    try:
        builder.download_and_prepare()
    except Exception as exc:  # noqa: BLE001 - TFDS raises many kinds; all mean "not available"
        raise DatasetError(
            f"Could not download or prepare TFDS dataset {name!r} ({type(exc).__name__}: "
            f"{str(exc)[:200]}). Without a network, use --dataset digits or synthetic, or put "
            f"the prepared dataset under $TFDS_DATA_DIR."
        ) from None
    features = builder.info.features
    image_key = _find_feature(features, tfds.features.Image, name, "an Image")
    label_key = _find_feature(features, tfds.features.ClassLabel, name, "a ClassLabel")
    label = features[label_key]
    names = tuple(label.names) if label.names else tuple(str(i) for i in range(label.num_classes))
    spec = FeatureSpec(shape=tuple(features[image_key].shape), class_names=names)
    if None in spec.shape:
        raise DatasetError(f"{name!r} has images of varying size {spec.shape}; tfscale needs one.")
    splits = {s: i.num_examples for s, i in builder.info.splits.items()} or _count_splits(builder)
    return TfdsSource(builder, image_key, label_key, spec, splits)


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
