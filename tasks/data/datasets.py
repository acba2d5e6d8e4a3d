"""Image sources: `digits`, `synthetic` and an image folder (a table, arrays and a
pipeline: `tasks.data.tables`, `.arrays`, `.pipelines`; tensorflow-datasets:
`tasks.data.tfds_source`), each a `Source` (`tasks.data.streams`) through `ImageSource`.

Each gives its examples by range (`examples(split, start, stop)`), one image and its class
at a time, so shards can be written, and resumed, independently, with bounded memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tfscale.tasks.core.errors import UserError
from tfscale.tasks.data.spec import IMAGE, FeatureSpec
from tfscale.tasks.data.streams import Chunk
from tfscale.tasks.settings.config import PrepareConfig

Example = tuple[np.ndarray, int]
# the files Keras's image_dataset_from_directory reads (its ALLOWLIST_FORMATS)
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
COLOR_MODES = {"grayscale": "L", "rgb": "RGB", "rgba": "RGBA"}  # PIL's mode of each
_CHUNK = 1024
_CHUNK_BYTES = 16 << 20  # an image source's chunk holds at most this much (large photos)


class DatasetError(UserError, ValueError):
    """The dataset cannot be found or read."""


class ImageSource:
    """A `Source` of one image and a class an example: `examples` gives them one at a time
    in order, `batches` in chunks of at most `_CHUNK` images and `_CHUNK_BYTES` (the images
    a list: an image folder's may differ in shape until one is read). Its label is the
    class, never a name the config gives."""

    named_label = False

    def examples(self, split: str, start: int, stop: int) -> Iterator[Example]:
        raise NotImplementedError

    def batches(self, split: str, start: int, stop: int) -> Iterator[Chunk]:
        images, labels, held = [], [], 0
        for image, label in self.examples(split, start, stop):
            images.append(image)
            labels.append(label)
            held += image.nbytes
            if len(labels) == _CHUNK or held >= _CHUNK_BYTES:
                yield {IMAGE: images}, np.asarray(labels)
                images, labels, held = [], [], 0
        if labels:
            yield {IMAGE: images}, np.asarray(labels)


@dataclass
class ArraySource(ImageSource):
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
class SyntheticSource(ImageSource):
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
class FolderSource(ImageSource):
    """An image folder, read one file at a time: each split's files with their class's
    index. `held_out` says where the test split came from where it is not a `test/` folder
    of the user's: `validation` (the `validation/` folder) or `drawn` (a seeded draw from
    each class of a flat folder)."""

    root: Path
    spec: FeatureSpec
    files: dict[str, list[tuple[Path, int]]]
    held_out: str = ""
    mode: str = "RGB"  # PIL's mode its images are read in (`COLOR_MODES`)
    version: str = "1.0.0"
    name: str = field(init=False)
    splits: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.root.name
        self.splits = {s: len(f) for s, f in self.files.items()}

    def examples(self, split: str, start: int, stop: int) -> Iterator[Example]:
        for path, label in self.files[split][start:stop]:
            image = _read_image(path, self.mode)
            if image.shape != self.spec.shape:
                raise DatasetError(
                    f"{path}: expected an image of shape {self.spec.shape} like the rest of "
                    f"the folder, got {image.shape}; resize the folder's images to one size."
                )
            yield image, label


SPLIT_FOLDERS = ("train", "test", "validation")
_LAYOUTS = (
    "lay it out as <root>/train/<class>/* with <root>/test/<class>/* or "
    "<root>/validation/<class>/*, or as <root>/<class>/* for prepare to hold out "
    "prepare.test_fraction of each class"
)


def folder_source(root: Path, cfg: PrepareConfig) -> FolderSource:
    """An image folder in one of three layouts: `<root>/train/<class>/*` with
    `<root>/test/<class>/*`; the same with `validation/` for `test/` (held out as the test
    split); or the class folders directly under `<root>` (flat), `cfg.test_fraction` of
    each class held out by a seeded draw (`cfg.seed`). Images are the files Keras reads
    (.bmp, .gif, .jpeg, .jpg, .png) of one size, read in `cfg.color_mode` (rgb by
    default, as Keras reads them); folders whose names start with `.` are skipped.

    Raises:
        DatasetError: the folder is in none of the layouts, mixes them, or has no held-out
            split to be had; naming the folder and what to do.
    """
    split_dirs, class_dirs = _layout(root)
    if split_dirs:
        classes = sorted({c.name for s in split_dirs for c in _subfolders(s)})
        files, held_out = _split_layout(root, split_dirs, classes)
    else:
        classes = [d.name for d in class_dirs]
        files, held_out = _drawn_split(root, class_dirs, cfg), "drawn"
    if len(classes) < 2:
        raise DatasetError(
            f"{root} holds one class ({', '.join(classes)}): a model learns nothing from it "
            "(loss 0, accuracy 1)",
            "give a folder per class, two classes or more",
        )
    mode = COLOR_MODES[cfg.color_mode]
    probe = _read_image(files["train"][0][0], mode)
    spec = FeatureSpec.image(tuple(probe.shape), tuple(classes))
    return FolderSource(root, spec, files, held_out, mode)


def _subfolders(folder: Path) -> list[Path]:
    names = [e.name for e in _entries(folder) if _is_dir(e) and not e.name.startswith(".")]
    return [folder / n for n in sorted(names)]


def _images(folder: Path) -> list[Path]:
    names = [e.name for e in _entries(folder) if _is_image(e.name) and _followed(e, e.is_file)]
    return [folder / n for n in sorted(names)]


def _entries(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as entries:
        return list(entries)


def _is_dir(entry: os.DirEntry) -> bool:
    return _followed(entry, entry.is_dir)


def _followed(entry: os.DirEntry, test: Callable[[], bool]) -> bool:
    """`test` of the entry (is it a folder, a file: a link followed), a link that leads
    nowhere readable (a loop, a link to itself) refused by name rather than met later as a
    crash.

    Raises:
        DatasetError: the entry is a link that cannot be followed.
    """
    try:
        return test()
    except OSError as exc:
        raise DatasetError(
            f"{entry.path} is a link that cannot be followed ({exc.strerror})",
            "remove the link, or point it at an image or a folder outside this one",
        ) from None


def _is_image(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_SUFFIXES


def _holds(folder: Path) -> tuple[bool, bool]:
    """Whether `folder` holds folders (other than hidden ones), and whether it holds images."""
    folders = images = False
    for e in _entries(folder):
        if _is_dir(e):
            folders = folders or not e.name.startswith(".")
        else:
            images = images or _is_image(e.name)
    return folders, images


def _layout(root: Path) -> tuple[list[Path], list[Path]]:
    """The split folders (folders of class folders), or else the class folders (folders of
    images), under `root`."""
    folders = _subfolders(root)
    holds = {d: _holds(d) for d in folders}
    splits = [d for d in folders if holds[d][0]]
    classes = [d for d in folders if holds[d][1]]
    both = next((d for d in splits if d in classes), None)
    if both is not None:
        raise DatasetError(f"{both} holds both images and folders", _LAYOUTS)
    if splits and classes:
        raise DatasetError(
            f"{root} mixes split folders ({', '.join(d.name for d in splits)}) with folders "
            f"of images ({', '.join(d.name for d in classes)})",
            _LAYOUTS,
        )
    odd = next((d for d in splits if d.name.lower() not in SPLIT_FOLDERS), None)
    if odd is not None:
        raise DatasetError(
            f"{odd} holds folders, but only train/, test/ and validation/ hold class folders",
            _LAYOUTS,
        )
    misplaced = next((d for d in classes if d.name.lower() in SPLIT_FOLDERS), None)
    if misplaced is not None:
        raise DatasetError(
            f"{misplaced} holds images directly; a split folder holds a folder per class",
            f"move its images into {misplaced}/<class>/ folders",
        )
    if not splits and not classes:
        raise DatasetError(
            f"{root} holds no images (.bmp, .gif, .jpeg, .jpg, .png) in class folders",
            _LAYOUTS,
        )
    if splits:
        return [d for d in folders if d.name.lower() in SPLIT_FOLDERS], []
    return [], folders


def _split_layout(
    root: Path, split_dirs: list[Path], classes: list[str]
) -> tuple[dict[str, list[tuple[Path, int]]], str]:
    """Each split folder's images with their class indices, under its lower-case name, and
    `validation` where `validation/` stands for the missing `test/` (stored as `test`)."""
    files: dict[str, list[tuple[Path, int]]] = {}
    for folder in split_dirs:
        split = folder.name.lower()
        if split in files:
            raise DatasetError(
                f"{root} has two {split} folders (names differing in case only)",
                "merge them into one",
            )
        files[split] = [(p, classes.index(c.name)) for c in _subfolders(folder) for p in _images(c)]
    held_out = ""
    if not files.get("test") and files.get("validation"):
        files["test"], held_out = files.pop("validation"), "validation"
    if not files.get("train"):
        raise DatasetError(
            f"{root} has no training images in train/<class>/",
            "put them there, or put the class folders directly under the folder for "
            "prepare to hold out prepare.test_fraction of each class",
        )
    if not files.get("test"):
        raise DatasetError(
            f"{root} has no held-out split: no images in test/<class>/ or validation/<class>/",
            f"add a test/ (or validation/) folder of the same classes, or put the class "
            f"folders directly under {root} for prepare to hold out prepare.test_fraction "
            f"of each class",
        )
    folders = {"train": "train/", "test": f"{held_out or 'test'}/"}
    _refuse_missing_classes(root, {folders[s]: files[s] for s in folders}, classes)
    return {s: f for s, f in files.items() if f}, held_out


def _refuse_missing_classes(
    root: Path, files: dict[str, list[tuple[Path, int]]], classes: list[str]
) -> None:
    """Each class has images in the training split (a class never trained on is guessed
    wrong every time) and in the held-out one (its accuracy there is never measured).

    Raises:
        DatasetError: naming the split folder and the classes it has no image of.
    """
    for folder, images in files.items():
        missing = sorted(set(range(len(classes))) - {index for _, index in images})
        if missing:
            names = ", ".join(classes[i] for i in missing)
            raise DatasetError(
                f"{root}/{folder} has no image of class {names} (its folder there missing or "
                "empty)",
                "give every class images in every split folder, or put the class folders "
                "directly under the folder for prepare to hold out prepare.test_fraction of "
                "each class",
            )


def _drawn_split(
    root: Path, class_dirs: list[Path], cfg: PrepareConfig
) -> dict[str, list[tuple[Path, int]]]:
    """A flat folder's images split train/test by a seeded draw stratified by class
    (`tasks.data.streams.test_rows`, as for a table)."""
    from tfscale.tasks.data.streams import test_rows

    images = [(p, i) for i, d in enumerate(class_dirs) for p in _images(d)]
    labels = np.array([i for _, i in images])
    few = [d.name for i, d in enumerate(class_dirs) if (labels == i).sum() < 2]
    if few:
        raise DatasetError(
            f"{root} has no held-out split to be had: class folder(s) {', '.join(few)} "
            f"hold fewer than 2 images, one for training and one held out",
            "add images to them, or give train/ and test/ folders of class folders",
        )
    try:
        held = test_rows(labels, cfg.test_fraction, cfg.seed, stratify=True)
    except ValueError as exc:  # the fraction leaves no image to train on
        raise DatasetError(
            f"{root}: holding out prepare.test_fraction {cfg.test_fraction:g} of its "
            f"{len(images)} images leaves none to train on",
            "lower prepare.test_fraction, or add images",
        ) from exc
    return {
        "test": [x for x, h in zip(images, held, strict=True) if h],
        "train": [x for x, h in zip(images, held, strict=True) if not h],
    }


def _read_image(path: Path, mode: str) -> np.ndarray:
    """The image at `path` in PIL's `mode` (L, RGB or RGBA: `prepare.color_mode`), as
    Keras's `image_dataset_from_directory` converts it (a gif: its first frame).

    Raises:
        DatasetError: the file is not an image PIL reads, naming it.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            array = np.asarray(img.convert(mode), dtype=np.uint8)
    except (UnidentifiedImageError, OSError) as exc:
        raise DatasetError(
            f"{path} is not an image tfscale can read ({type(exc).__name__}), though named as one",
            "remove it from the folder, or save it again as .png or .jpg",
        ) from None
    return array[..., None] if array.ndim == 2 else array


# The sources known by name: adding one is a function above and a row here. Any other
# name is an image folder or a tensorflow-datasets name (`tasks.data.preparation.open_source`).
NAMED_SOURCES: dict[str, Callable[[PrepareConfig], ImageSource]] = {
    "digits": lambda cfg: load_digits_source(cfg.seed, cfg.test_fraction),
    "synthetic": synthetic_source,
}


def dataset_slug(dataset: str) -> str:
    """The directory name a dataset's shards live under: a folder's or a file's name, a
    function's `module_function`, a TFDS name with `_` for `/`."""
    if Path(dataset).is_dir() or Path(dataset).suffix.lower() in (".csv", ".parquet", ".npz"):
        return Path(dataset).resolve().name or "root"  # `.` and `..` by the folder's name
    if ":" in dataset:  # package.module:function or path/to/file.py:function
        module, function = dataset.rsplit(":", 1)
        return f"{Path(module).name}_{function}"
    return dataset.replace("/", "_")
