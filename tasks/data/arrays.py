"""Arrays as a source: an `.npz` saved with `np.savez` (`x` and `y`; `x_train`, `y_train`,
`x_test` and `y_test`; or named arrays with the label under `prepare.label`), read as a
stream (`tasks.data.streams`) a block of rows at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tfscale.tasks.data.datasets import DatasetError
from tfscale.tasks.data.spec import Feature
from tfscale.tasks.data.streams import Chunk, StreamSource
from tfscale.tasks.data.user_sources import (
    CHUNK_ROWS,
    dtype_name,
    file_version,
    label_coding_of,
    refuse_weights,
    stream_source,
)
from tfscale.tasks.settings.config import PrepareConfig


def npz_source(path: Path, cfg: PrepareConfig) -> StreamSource:
    """Arrays saved with `np.savez`: `x` and `y`; `x_train`, `y_train`, `x_test` and
    `y_test` (its own split); or named arrays with the label under `cfg.label`."""
    parts = _npz_parts(path, cfg.label)
    first_features, _ = next(iter(parts.values()))
    all_labels = np.concatenate([labels for _, labels in parts.values()])
    coding = label_coding_of(all_labels, cfg, f"the label array of {path.name}")
    features = tuple(_array_feature(name, a) for name, a in first_features.items())

    def read(split: str | None) -> Iterator[Chunk]:
        arrays, labels = parts[split]
        for lo in range(0, len(labels), CHUNK_ROWS):
            rows = {n: _stored(a[lo : lo + CHUNK_ROWS]) for n, a in arrays.items()}
            yield rows, labels[lo : lo + CHUNK_ROWS]

    labels = {split: raw for split, (_, raw) in parts.items()}
    return stream_source(path.name, file_version(path), features, coding, labels, cfg, read)


def _npz_parts(path: Path, label: str) -> dict[str | None, tuple[dict[str, Any], np.ndarray]]:
    """The arrays by split (None: one set, to be split): the features by name, the labels.

    Raises:
        DatasetError: not an .npz, no arrays tfscale knows, or arrays of unequal lengths.
    """
    import zipfile

    try:
        archive = np.load(path, allow_pickle=False)
        arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise DatasetError(
            f"{path} is not an .npz tfscale can read ({str(exc).splitlines()[0]})",
            "save the arrays with numpy.savez(path, x=..., y=...)",
        ) from None
    refuse_weights(path, list(arrays), "array")
    parts: dict[str | None, tuple[dict[str, Any], np.ndarray]]
    if {"x_train", "y_train", "x_test", "y_test"} <= arrays.keys():
        parts = {s: ({"x": arrays[f"x_{s}"]}, arrays[f"y_{s}"]) for s in ("train", "test")}
    elif {"x", "y"} <= arrays.keys():
        parts = {None: ({"x": arrays["x"]}, arrays["y"])}
    elif label in arrays:
        named = {k: v for k, v in arrays.items() if k != label}
        parts = {None: (named, arrays[label])}
    else:
        raise DatasetError(
            f"{path} holds {', '.join(arrays) or 'no arrays'}: expected x and y, x_train, "
            f"y_train, x_test and y_test, or named arrays with the label under {label!r}",
            "save it with numpy.savez(path, x=..., y=...), or name the label array with --label",
        )
    for split, (features, labels) in parts.items():
        lengths = {name: len(a) for name, a in {**features, "label": labels}.items()}
        if len(set(lengths.values())) > 1 or not features:
            where = f" ({split})" if split else ""
            shown = ", ".join(f"{n} {k}" for n, k in lengths.items())
            raise DatasetError(
                f"{path}{where}: the arrays differ in length ({shown}); each needs a row per "
                "example",
                "save arrays of equal length",
            )
    return parts


def _array_feature(name: str, array: np.ndarray) -> Feature:
    if array.dtype.kind in "SUO":
        if array.ndim > 1:
            raise DatasetError(
                f"array {name!r} holds text of shape {array.shape[1:]} per example",
                "give text as one string per example",
            )
        return Feature(name, "string", ())
    return Feature(name, dtype_name(array.dtype), tuple(array.shape[1:]))


def _stored(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind in "SU":
        return values.astype(object)
    return values
