"""Arrays as a source: an `.npz` saved with `np.savez` (`x` and `y`; `x_train`, `y_train`,
`x_test` and `y_test`; or named arrays with the label under `prepare.label`), read as a
stream (`tasks.data.streams`) a block of rows at a time. A label the user names wins over
the `x`/`y` forms; arrays either form would leave out are refused, never dropped.
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

DEFAULT_LABEL = PrepareConfig().label  # named by the config's default, not by the user


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
    split_form, pair = {"x_train", "y_train", "x_test", "y_test"}, {"x", "y"}
    form = split_form if split_form <= arrays.keys() else pair if pair <= arrays.keys() else None
    named = label in arrays and (label != DEFAULT_LABEL or form is None)
    if form is not None and not named and (others := sorted(arrays.keys() - form)):
        raise DatasetError(
            f"{path} holds {', '.join(others)} beside {', '.join(sorted(form))}: as "
            f"{' and '.join(sorted(form))} alone, tfscale would leave them out",
            "name the label array with --label (every other array is then a feature), "
            f"or save {', '.join(sorted(form))} alone",
        )
    parts: dict[str | None, tuple[dict[str, Any], np.ndarray]]
    if named:
        parts = {None: ({k: v for k, v in arrays.items() if k != label}, arrays[label])}
    elif form is split_form:
        parts = {s: ({"x": arrays[f"x_{s}"]}, arrays[f"y_{s}"]) for s in ("train", "test")}
    elif form is pair:
        parts = {None: ({"x": arrays["x"]}, arrays["y"])}
    else:
        raise DatasetError(
            f"{path} holds {', '.join(arrays) or 'no arrays'}: expected x and y, x_train, "
            f"y_train, x_test and y_test, or named arrays with the label under {label!r}",
            "save it with numpy.savez(path, x=..., y=...), or name the label array with --label",
        )
    for split, (features, labels) in parts.items():
        _check_lengths(path, split, features, labels)
    return parts


def _check_lengths(path: Path, split: str | None, features: dict, labels: np.ndarray) -> None:
    scalars = [name for name, a in [*features.items(), ("label", labels)] if np.ndim(a) == 0]
    if scalars:
        raise DatasetError(
            f"{path}: {', '.join(scalars)} hold(s) one value, not a row per example",
            "save arrays of a row per example: numpy.savez(path, x=rows, y=labels)",
        )
    lengths = [(name, len(a)) for name, a in features.items()] + [("label", len(labels))]
    if len({n for _, n in lengths}) > 1 or not features:
        where = f" ({split})" if split else ""
        shown = ", ".join(f"{n} {k}" for n, k in lengths)
        raise DatasetError(
            f"{path}{where}: the arrays differ in length ({shown}); each needs a row per example",
            "save arrays of equal length",
        )


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
