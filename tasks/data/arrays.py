"""Arrays as a source: an `.npz` saved with `np.savez` (`x` and `y`; `x_train`, `y_train`,
`x_test` and `y_test`; or named arrays with the label under `prepare.label`; each
example's weight in an array of its own, `prepare.sample_weight`), read as a
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
from tfscale.tasks.data.streams import WEIGHT, Chunk, StreamSource
from tfscale.tasks.data.user_sources import (
    CHUNK_ROWS,
    Reader,
    dtype_name,
    file_version,
    label_coding_of,
    stream_source,
    weight_name,
)
from tfscale.tasks.settings.config import PrepareConfig

DEFAULT_LABEL = PrepareConfig().label  # named by the config's default, not by the user


def npz_source(path: Path, cfg: PrepareConfig) -> StreamSource:
    """Arrays saved with `np.savez`: `x` and `y`; `x_train`, `y_train`, `x_test` and
    `y_test` (its own split); or named arrays with the label under `cfg.label`."""
    parts, weight = _npz_parts(path, cfg)
    first_features, _ = next(iter(parts.values()))
    first_features = {n: a for n, a in first_features.items() if n != WEIGHT}
    all_labels = np.concatenate([labels for _, labels in parts.values()])
    coding = label_coding_of(all_labels, cfg, f"the label array of {path.name}")
    features = tuple(_array_feature(name, a) for name, a in first_features.items())

    def read(split: str | None) -> Iterator[Chunk]:
        arrays, labels = parts[split]
        for lo in range(0, len(labels), CHUNK_ROWS):
            rows = {n: _stored(a[lo : lo + CHUNK_ROWS]) for n, a in arrays.items()}
            yield rows, labels[lo : lo + CHUNK_ROWS]

    labels = {split: raw for split, (_, raw) in parts.items()}
    reader = Reader(read, weight=f"array {weight!r}" if weight else "")
    return stream_source(path.name, file_version(path), features, coding, labels, cfg, reader)


Parts = dict[str | None, tuple[dict[str, Any], np.ndarray]]


def _npz_parts(path: Path, cfg: PrepareConfig) -> tuple[Parts, str]:
    """The arrays by split (None: one set, to be split): the features by name (weights
    under `WEIGHT`), the labels; and the weights' array's name (`weight_name`).

    Raises:
        DatasetError: not an .npz, no arrays tfscale knows, arrays of unequal lengths, or
            weights beside a split of the arrays' own.
    """
    label = cfg.label
    import zipfile

    try:
        archive = np.load(path, allow_pickle=False)
        arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise DatasetError(
            f"{path} is not an .npz tfscale can read ({str(exc).splitlines()[0]})",
            "save the arrays with numpy.savez(path, x=..., y=...)",
        ) from None
    weight, weights = _weights_apart(path, arrays, cfg)
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
    if weights is not None and form is split_form and not named:
        raise _split_weights(path, weight)
    parts: Parts
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
        _check_lengths(path, split, {**features, **({weight: weights} if weight else {})}, labels)
    if weights is not None:
        parts[None][0][WEIGHT] = weights
    return parts, weight


def _weights_apart(path: Path, arrays: dict[str, Any], cfg: PrepareConfig) -> tuple[str, Any]:
    """The weights' array's name (`user_sources.weight_name`) and the array, taken out of
    `arrays`; ("", None) where there is none."""
    weight = weight_name(path, [name for name in arrays if name != cfg.label], cfg, "array")
    return weight, arrays.pop(weight) if weight else None


def _split_weights(path: Path, weight: str) -> DatasetError:
    return DatasetError(
        f"{path}: weights {weight!r} beside x_train and x_test: which split's rows they weigh "
        "is not said",
        f"save x, y and {weight} (tfscale holds out its test split), or drop {weight}",
    )


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
