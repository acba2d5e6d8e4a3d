"""One example as a `tf.train.Example`, for any features: how shards are written, and read
back after batching.

Each feature is stored under `feature/` and its own name, and the label under `label`, so no
name a user gives a column, an array or a pipeline's key can meet the label's (a column named
`label` is `feature/label`):

| feature                              | stored as                        | read back as          |
|--------------------------------------|----------------------------------|-----------------------|
| floating point, fixed shape          | `float_list`, float32            | float32, its shape    |
| integers or booleans, fixed shape    | `int64_list`                     | its dtype, its shape  |
| a uint8 array of one or more dims    | `bytes_list`: its raw bytes      | uint8, its shape      |
| text                                 | `bytes_list`: UTF-8              | a string              |
| a 1-D sequence of varying length     | the list its values make         | padded to the longest |

The label: an `int64_list` for classes, binary and multi-label ones, a `float_list` for real
values. An example's weight in the training loss, where the data has one, a `float_list`
of one value under `weight`. A source of images alone keeps the image format
(`encode_image`, `parse_images`): the raw uint8 bytes, the image's shape and the class.

Records are serialized deterministically, so the same examples give the same bytes. A chunk
whose features are all numbers of fixed shape (a numeric table, arrays) is encoded without
building a protocol buffer per row: every row's bytes follow one template, the values in
fixed places (`_Template`); the result is byte for byte what the protocol buffers give.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfscale.tasks.data.spec import Feature, FeatureSpec, Label
from tfscale.tasks.data.streams import WEIGHT as CHUNK_WEIGHT

LABEL = "label"
WEIGHT = "weight"  # each example's weight in the training loss, where the spec has one
FORMAT = 2  # records' layout: 2 keeps each feature under `feature/NAME` (1: under its name)


def key(name: str) -> str:
    """The record's key of the feature `name`."""
    return f"feature/{name}"


def storage(feature: Feature) -> str:
    """`float`, `int`, `raw` (uint8 bytes) or `bytes` (text): how a feature is stored."""
    if feature.dtype == "string":
        return "bytes"
    if feature.dtype == "uint8" and feature.shape and not feature.variable:
        return "raw"
    return "float" if feature.dtype.startswith("float") else "int"


def label_storage(label: Label) -> str:
    return "float" if label.kind == "regression" else "int"


def encode_chunk(spec: FeatureSpec, features: dict[str, Any], labels: np.ndarray) -> list[bytes]:
    """The serialized examples of a chunk: `features` maps each feature's name to its
    values, a row per example (a list of arrays where the feature varies in length), and
    each example's weight under `streams.WEIGHT` where the spec has one."""
    template = _Template.of(spec, features, labels)
    if template is not None:
        return template.encode(features, labels)
    return [
        _example(spec, {n: v[i] for n, v in features.items()}, labels[i])
        for i in range(len(labels))
    ]


def _example(spec: FeatureSpec, row: dict[str, Any], label: Any) -> bytes:
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example()
    out = example.features.feature
    for feature in spec.features:
        _fill(out[key(feature.name)], storage(feature), row[feature.name])
    _fill(out[LABEL], label_storage(spec.label), label)
    if spec.weight:
        _fill(out[WEIGHT], "float", row[CHUNK_WEIGHT])
    return example.SerializeToString(deterministic=True)


def _fill(slot: Any, kind: str, value: Any) -> None:
    if kind == "bytes":
        text = value if isinstance(value, bytes) else str(value).encode()
        slot.bytes_list.value.append(text)
    elif kind == "raw":
        slot.bytes_list.value.append(np.ascontiguousarray(value, np.uint8).tobytes())
    elif kind == "float":
        slot.float_list.value.extend(np.asarray(value, np.float32).ravel().tolist())
    else:
        slot.int64_list.value.extend(np.asarray(value, np.int64).ravel().tolist())


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


class _Template:
    """Every row's bytes for features of fixed shape stored as floats or small integers:
    the map entries in key order (as deterministic serialization writes them), with each
    value's bytes at a fixed offset. Integers take one varint byte each, so a chunk holding
    any integer outside [0, 127] is encoded by protocol buffers instead."""

    def __init__(self, parts: list[tuple[str, str, int]]):
        self.parts = parts  # (name, "float" | "int", values per row), in key order
        head, self.holes, size = bytearray(), [], 0
        pieces = []
        for name, kind, count in parts:
            width = 4 * count if kind == "float" else count
            packed = _varint(1 << 3 | 2) + _varint(width)  # the list's packed `value` field
            list_len = len(packed) + width
            kind_field = 2 if kind == "float" else 3  # Feature.float_list or .int64_list
            feature_head = _varint(kind_field << 3 | 2) + _varint(list_len) + packed
            feature_len = len(feature_head) + width
            value_head = _varint(2 << 3 | 2) + _varint(feature_len) + feature_head
            key = _field(1, name.encode())
            entry_len = len(key) + len(value_head) + width
            prefix = _varint(1 << 3 | 2) + _varint(entry_len) + key + value_head
            pieces.append((prefix, name, kind, width))
            size += len(prefix) + width
        self.record_size = len(_varint(1 << 3 | 2)) + len(_varint(size)) + size
        head += _varint(1 << 3 | 2) + _varint(size)
        layout = np.zeros(self.record_size, np.uint8)
        offset = len(head)
        layout[:offset] = np.frombuffer(bytes(head), np.uint8)
        for prefix, name, kind, width in pieces:
            layout[offset : offset + len(prefix)] = np.frombuffer(prefix, np.uint8)
            offset += len(prefix)
            self.holes.append((name, kind, offset, width))
            offset += width
        self.layout = layout

    @classmethod
    def of(
        cls, spec: FeatureSpec, features: dict[str, Any], labels: np.ndarray
    ) -> _Template | None:
        parts = []
        columns = _columns(features, labels)
        kinds = {key(f.name): storage(f) for f in spec.features}
        kinds[LABEL] = label_storage(spec.label)
        kinds[WEIGHT] = "float"
        for name in sorted(columns, key=lambda n: n.encode()):
            kind = kinds[name]
            values = columns[name]
            if kind not in ("float", "int") or not isinstance(values, np.ndarray):
                return None
            if values.dtype == object:
                return None
            if kind == "int" and values.size and (values.min() < 0 or values.max() > 127):
                return None
            parts.append((name, kind, int(np.prod(values.shape[1:], dtype=np.int64))))
        return cls(parts)

    def encode(self, features: dict[str, Any], labels: np.ndarray) -> list[bytes]:
        columns = _columns(features, labels)
        rows = np.tile(self.layout, (len(labels), 1))
        for name, kind, offset, width in self.holes:
            values = columns[name].reshape(len(labels), -1)
            data = values.astype("<f4" if kind == "float" else np.uint8)
            rows[:, offset : offset + width] = data.view(np.uint8).reshape(len(labels), width)
        return [row.tobytes() for row in rows]


def _columns(features: dict[str, Any], labels: np.ndarray) -> dict[str, Any]:
    """A chunk's values by their records' keys."""
    columns = {key(name): v for name, v in features.items() if name != CHUNK_WEIGHT}
    if CHUNK_WEIGHT in features:
        columns[WEIGHT] = features[CHUNK_WEIGHT]
    return {**columns, LABEL: labels}


def parse_spec(spec: FeatureSpec) -> dict[str, Any]:
    """The `tf.io.parse_example` features for a spec's records."""
    import tensorflow as tf

    out: dict[str, Any] = {}
    for feature in spec.features:
        kind = storage(feature)
        if feature.variable:
            dtype = {"float": tf.float32, "int": tf.int64, "bytes": tf.string}[kind]
            out[key(feature.name)] = tf.io.RaggedFeature(dtype)
        elif kind in ("raw", "bytes"):
            out[key(feature.name)] = tf.io.FixedLenFeature([], tf.string)
        else:
            dtype = tf.float32 if kind == "float" else tf.int64
            out[key(feature.name)] = tf.io.FixedLenFeature(list(feature.shape), dtype)
    dtype = tf.float32 if label_storage(spec.label) == "float" else tf.int64
    out[LABEL] = tf.io.FixedLenFeature(list(spec.label.shape), dtype)
    if spec.weight:
        out[WEIGHT] = tf.io.FixedLenFeature([], tf.float32)
    return out


def parse_records(
    serialized: Any, spec: FeatureSpec, batch_size: int | None = None, weighted: bool = False
) -> tuple[Any, ...]:
    """A batch of serialized records into `(features, labels)`: one tensor where the spec
    holds one feature, else a dict by name; variable lengths padded to the longest seen at
    prepare, or the features `spec.packed` names as one float32 vector each. Class and
    binary labels are int32, multi-label and real ones float32. `weighted`, where the spec
    has weights: `(features, labels, weights)`, as `fit` takes a weighted dataset."""
    import tensorflow as tf

    parsed = tf.io.parse_example(serialized, parse_spec(spec))
    rows = batch_size or -1
    features = {}
    for feature in spec.features:
        value = parsed[key(feature.name)]
        kind = storage(feature)
        if feature.variable:
            value = value.to_tensor(shape=[None, *feature.max_shape])
        elif kind == "raw":
            value = tf.reshape(tf.io.decode_raw(value, tf.uint8), [rows, *feature.shape])
        elif kind == "int" and feature.dtype != "int64":
            value = tf.cast(value, tf.as_dtype("int32" if feature.dtype != "bool" else "bool"))
        features[spec.key_of(feature)] = value
    labels = parsed[LABEL]
    if spec.label.kind in ("class", "binary"):
        labels = tf.cast(labels, tf.int32)
    elif spec.label.kind == "multi_label":
        labels = tf.cast(labels, tf.float32)
    if batch_size:
        labels = tf.ensure_shape(labels, [batch_size, *spec.label.shape])
    weights = (parsed[WEIGHT],) if weighted and spec.weight else ()
    if spec.packed:  # a model of one input: the numbers in the spec's order, as df.values
        columns = [tf.reshape(tf.cast(features[n], tf.float32), [rows]) for n in spec.packed]
        return tf.stack(columns, axis=-1), labels, *weights
    if len(spec.features) == 1:
        return features[spec.key_of(spec.features[0])], labels, *weights
    return features, labels, *weights


def encode_image(image: Any, label: int) -> bytes:
    """One image and its class as a `tf.train.Example` in the image format: the raw uint8
    image bytes, its shape, and the label."""
    from tensorflow.core.example import example_pb2, feature_pb2

    feature = {
        "image": feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[image.tobytes()])),
        "label": feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[label])),
        "shape": feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=list(image.shape))),
    }
    example = example_pb2.Example(features=feature_pb2.Features(feature=feature))
    return example.SerializeToString(deterministic=True)


def parse_images(
    serialized: Any, shape: tuple[int, ...], batch_size: int | None = None
) -> tuple[Any, Any]:
    """Parses a batch of serialized examples into images as stored, uint8 in 0-255 (as the
    spec says; every model takes them so, a built-in scaling them itself), and int32
    labels.

    A `batch_size` makes the batch dimension static (training batches, as TPUs need).
    """
    import tensorflow as tf

    parsed = tf.io.parse_example(
        serialized,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    images = tf.io.decode_raw(parsed["image"], tf.uint8)
    images = tf.reshape(images, [batch_size or -1, *shape])
    labels = tf.reshape(tf.cast(parsed["label"], tf.int32), [batch_size or -1])
    return images, labels
