"""Image sources: `digits`, `synthetic` and an image folder (tables, arrays and pipelines:
`tasks.data.user_sources`; tensorflow-datasets: `tasks.data.tfds_source`).

Every source gives random access by range (`examples(split, start, stop)`) so
shards can be written, and resumed, independently, with bounded memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from tasks.core.errors import UserError
from tasks.data.spec import FeatureSpec
from tasks.settings.config import PrepareConfig

Example = tuple[np.ndarray, int]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_CHUNK = 1024


class DatasetError(UserError, ValueError):
    """The dataset cannot be found or read."""


class Source(Protocol):
    name: str
    version: str
    spec: FeatureSpec
    splits: dict[str, int]

    def examples(self, split: str, start: int, stop: int) -> Iterator[Example]: ...


@dataclass
class ArraySource:
    """In-memory arrays per split (small datasets such as `digits`)."""

    name: str
    version: str
    spec: FeatureSpec
    arrays: dict[str, tuple[np.ndarray, np.ndarray]]
    splits: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.splits = {s: len(y) for s, (_, y) in self.arrays.items()}

    def examples(self, split: str, start: int, stop: int) -> Iterator[Example]:
        images, labels = self.arrays[split]
        for i in range(start, stop):
            yield images[i], int(labels[i])


def load_digits_source(seed: int, test_fraction: float) -> ArraySource:
    """The UCI handwritten digits scikit-learn ships, split train/test with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, digits.target, test_size=test_fraction, random_state=seed, stratify=digits.target
    )
    spec = FeatureSpec.image((8, 8, 1), tuple(str(i) for i in range(10)))
    return ArraySource("digits", "1.0.0", spec, {"train": (x_tr, y_tr), "test": (x_te, y_te)})


@dataclass
class SyntheticSource:
    """Seeded images: a fixed random prototype per class blended with per-example noise,
    `signal` of each pixel the prototype's; a `label_noise` share of labels replaced by a
    uniformly drawn class (which may be the true one).

    At the default (signal 0.75, no label noise) the label is easy to learn, so accuracy
    means something at once. A lower signal and some label noise give a task of known
    difficulty for time to a target: the best accuracy a model can reach is
    `1 - label_noise * (classes - 1) / classes`, and the examples it needs to get near it
    grow as the signal falls. Any example can be generated on its own, in chunks, from its
    index.
    """

    seed: int
    spec: FeatureSpec
    splits: dict[str, int]
    signal: float = 0.75
    label_noise: float = 0.0
    name: str = "synthetic"
    version: str = "1.0.0"

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, 0xC1A55])
        shape = (self.spec.num_classes, *self.spec.shape)
        self._prototypes = rng.integers(0, 256, size=shape, dtype=np.uint8)

    def examples(self, split: str, start: int, stop: int) -> Iterator[Example]:
        split_id = sorted(self.splits).index(split)
        for chunk in range(start // _CHUNK, -(-stop // _CHUNK)):
            images, labels = self._chunk(split_id, chunk, self.splits[split])
            lo = max(start - chunk * _CHUNK, 0)
            hi = min(stop - chunk * _CHUNK, len(labels))
            for i in range(lo, hi):
                yield images[i], int(labels[i])

    def _chunk(self, split_id: int, chunk: int, total: int) -> tuple[np.ndarray, np.ndarray]:
        n = min(_CHUNK, total - chunk * _CHUNK)
        rng = np.random.default_rng([self.seed, split_id, chunk])
        labels = rng.integers(0, self.spec.num_classes, size=n)
        noise = rng.integers(0, 256, size=(n, *self.spec.shape), dtype=np.uint8)
        if self.signal == 0.75:  # the original blend, kept to the byte
            images = (self._prototypes[labels] // 4) * 3 + noise // 4
        else:
            blend = self.signal * self._prototypes[labels] + (1 - self.signal) * noise
            images = np.rint(blend).astype(np.uint8)
        if self.label_noise > 0:
            flipped = rng.random(n) < self.label_noise
            labels = np.where(flipped, rng.integers(0, self.spec.num_classes, size=n), labels)
        return images, labels


def synthetic_source(cfg: PrepareConfig) -> SyntheticSource:
    s = cfg.synthetic
    spec = FeatureSpec.image(
        (s.height, s.width, s.channels), tuple(f"class_{i}" for i in range(s.classes))
    )
    splits = {"train": s.train_examples, "test": s.test_examples}
    return SyntheticSource(cfg.seed, spec, splits, s.signal, s.label_noise)


@dataclass
class FolderSource:
    """`<root>/<split>/<label>/*.png|jpg`, read one file at a time."""

    root: Path
    spec: FeatureSpec
    files: dict[str, list[tuple[Path, int]]]
    version: str = "1.0.0"
    name: str = field(init=False)
    splits: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.root.name
        self.splits = {s: len(f) for s, f in self.files.items()}

    def examples(self, split: str, start: int, stop: int) -> Iterator[Example]:
        for path, label in self.files[split][start:stop]:
            image = _read_image(path, self.spec.shape[-1])
            if image.shape != self.spec.shape:
                raise DatasetError(
                    f"{path}: expected an image of shape {self.spec.shape} like the rest of "
                    f"the folder, got {image.shape}; resize the folder's images to one size."
                )
            yield image, label


def folder_source(root: Path) -> FolderSource:
    split_dirs = sorted(d for d in root.iterdir() if d.is_dir())
    classes = sorted({c.name for s in split_dirs for c in s.iterdir() if c.is_dir()})
    if not split_dirs or not classes:
        raise DatasetError(
            f"{root}: expected the layout <root>/<split>/<label>/*.png|jpg; found no such folders."
        )
    files = {
        s.name: [
            (p, classes.index(p.parent.name))
            for p in sorted(s.glob("*/*"))
            if p.suffix.lower() in IMAGE_SUFFIXES
        ]
        for s in split_dirs
    }
    first = next((f[0][0] for f in files.values() if f), None)
    if first is None:
        raise DatasetError(f"{root}: no .png or .jpg images under <split>/<label>/.")
    probe = _read_image(first, None)
    spec = FeatureSpec.image(tuple(probe.shape), tuple(classes))
    return FolderSource(root, spec, {s: f for s, f in files.items() if f})


def _read_image(path: Path, channels: int | None) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        mode = {1: "L", 3: "RGB"}.get(channels or 0, "L" if img.mode in ("L", "1") else "RGB")
        array = np.asarray(img.convert(mode), dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array


# The sources known by name: adding one is a function above and a row here. Any other
# name is an image folder or a tensorflow-datasets name (`tasks.data.preparation.open_source`).
NAMED_SOURCES: dict[str, Callable[[PrepareConfig], Source]] = {
    "digits": lambda cfg: load_digits_source(cfg.seed, cfg.test_fraction),
    "synthetic": synthetic_source,
}


def dataset_slug(dataset: str) -> str:
    """The directory name a dataset's shards live under: a folder's or a file's name, a
    function's `module_function`, a TFDS name with `_` for `/`."""
    if Path(dataset).is_dir() or Path(dataset).suffix.lower() in (".csv", ".parquet", ".npz"):
        return Path(dataset).name
    if ":" in dataset:  # package.module:function or path/to/file.py:function
        module, function = dataset.rsplit(":", 1)
        return f"{Path(module).name}_{function}"
    return dataset.replace("/", "_")
