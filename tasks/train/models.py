"""The models tfscale trains, by name: `mlp`, `cnn`, a small `resnet` and a wide `embedding`
model with a large table, in Keras 3 layers."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import keras
from keras import layers

from tfscale.tasks.core.errors import UsageError, UserError, system_error
from tfscale.tasks.data.spec import Feature, FeatureSpec
from tfscale.tasks.train.objectives import Built, Objective
from tfscale.tasks.train.user_models import is_user_model, user_model


def load_trained_model(path: str, source: str = "") -> keras.Model:
    """A model tfscale saved, without its optimizer (its learning-rate schedule is
    registered with Keras in `tasks.train.steps`), with the user's own code in place: the
    module of `source` (the function that built it, `train.model`) imported first, so that
    its custom layers, losses and models load, registered with Keras or not."""
    import zipfile

    import tfscale.tasks.train.steps  # noqa: F401  (registers WarmupSchedule)

    custom = users_objects(source)
    try:
        try:  # a user's compiled model keeps its loss and metrics (`tasks.train.user_models`)
            with warnings.catch_warnings():  # its optimizer's slots were never saved: none
                warnings.filterwarnings("ignore", "Skipping variable loading for optimizer")
                return keras.models.load_model(path, custom_objects=custom)
        except (TypeError, ValueError) as exc:
            if "compile" not in str(exc).lower() and "deserializ" not in str(exc).lower():
                raise
            return keras.models.load_model(path, custom_objects=custom, compile=False)
    except (ValueError, OSError, zipfile.BadZipFile) as exc:  # not a model, or damaged
        if isinstance(exc, OSError) and system_error(exc) is not None:
            raise
        first = str(exc).split(". ")[0]
        raise UserError(
            f"{path} is not a Keras model tfscale can load ({first})",
            "give the model.keras a 'tfscale train' wrote (its run directory, or "
            "--export-dir), or train again if that file was damaged.",
        ) from None


def users_objects(source: str) -> dict[str, Any]:
    """The Keras classes (layers, models, losses, metrics) and the functions (a loss or a
    metric written as one) of the user's module whose function `source` names, imported
    now, as Keras's `custom_objects` takes them; none for a built-in or a saved file, or
    where the module is not there (Keras then names what it cannot find)."""
    from tfscale.tasks.core.user_code import is_function_ref, load_function

    if not source or not is_function_ref(source):
        return {}
    try:
        function, _ = load_function(source, "model")
    except UserError:
        return {}
    import inspect

    kinds = (keras.layers.Layer, keras.losses.Loss, keras.metrics.Metric)
    module = inspect.unwrap(function).__globals__  # not `load_function`'s wrapper's
    own = module.get("__name__")
    return {
        name: value
        for name, value in module.items()
        if (isinstance(value, type) and issubclass(value, kinds))
        or (inspect.isfunction(value) and value.__module__ == own)
    }


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, ps_tasks: int = 0
) -> keras.Model:
    """A fresh model of images as stored (uint8, 0-255; scaled to [0, 1] as its first
    layer, so that no caller decides how to feed it) whose last layer gives float32 logits
    (also under mixed precision).

    Args:
        ps_tasks: parameter servers the model's variables live on (0: none); a table of
            `2 * PARTITION_SHARD_BYTES` or more is split across them.

    Raises:
        UsageError: an unknown name, listing the known ones.
    """
    if name not in MODELS:
        raise UsageError(f"Unknown model {name!r}; expected one of {', '.join(MODELS)}")
    inputs = keras.Input(shape=input_shape, dtype="uint8")
    x = layers.Rescaling(1 / 255.0, name="to_unit_range")(inputs)
    features = MODELS[name](x, ps_tasks) if name == "embedding" else MODELS[name](x)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(features)
    return keras.Model(inputs, logits, name=name)


def model_for_data(name: str, spec: FeatureSpec, ps_tasks: int = 0) -> Built:
    """A fresh model for the data's spec, with its objective (`Built`): the label kind's
    (`tasks.train.objectives`), or a user's model's own compile. The user's model
    (`tasks.train.user_models`), or a built-in: on images, any; on other features (a
    table, arrays, text, token sequences), `mlp` over every feature, each made a vector
    first (`feature_vectors`).

    Raises:
        UsageError: a model that needs images, on data without them; a user's model that
            cannot be built.
    """
    if is_user_model(name):
        return user_model(name, spec)
    if spec.is_image:
        model = build_model(name, spec.shape, spec.num_classes, ps_tasks)
        return Built(model, Objective(spec.label))
    if name not in MODELS:
        raise UsageError(f"Unknown model {name!r}; expected one of {', '.join(MODELS)}")
    if name != "mlp":
        shown = ", ".join(f.name for f in spec.features[:4])
        images = [f for f in spec.features if f.dtype == "uint8" and len(f.shape) == 3]
        if len(spec.features) == 1 and images and spec.label.kind == "binary":
            raise UsageError(
                f"The {name} model takes images with a class label; this data's images "
                f"({shown}) have a label of two values, read as binary",
                "prepare it again with --label-kind class (prepare.label_kind) for the "
                "image models, or train it with --model mlp",
            )
        raise UsageError(
            f"The {name} model needs images; this data's features are {shown}"
            + (", ..." if len(spec.features) > 4 else ""),
            "train it with --model mlp (train.model), which takes any features",
        )
    inputs = {
        f.name: keras.Input(shape=f.padded_shape, dtype=_input_dtype(f), name=_layer_name(f, i))
        for i, f in enumerate(spec.features)
    }
    x = feature_vectors(spec, inputs)
    logits = layers.Dense(spec.label.outputs, dtype="float32", name="logits")(_mlp(x))
    label = spec.label
    if label.kind == "regression" and label.std:  # learnt on the standardised scale
        logits = Rescale(label.std, label.mean, dtype="float32", name="to_label_scale")(logits)
    model_inputs = inputs[spec.features[0].name] if len(spec.features) == 1 else inputs
    with warnings.catch_warnings():  # a feature named `a/b` has an input layer named `in0_a_b`
        warnings.filterwarnings("ignore", "When providing `inputs` as a dict")
        model = keras.Model(model_inputs, logits, name=name)
    return Built(model, Objective(spec.label))


def _input_dtype(feature: Feature) -> str:
    if feature.dtype == "string":
        return "string"
    return {"bool": "bool", "uint8": "uint8", "int32": "int32", "int64": "int64"}.get(
        feature.dtype, "float32"
    )


def _layer_name(feature: Feature, index: int) -> str:
    """The feature's name, where Keras takes it as a layer's; else one made of it, unique by
    the feature's index."""
    if re.fullmatch(r"[A-Za-z_][0-9A-Za-z_.-]{0,80}", feature.name):
        return feature.name
    return f"in{index}_" + re.sub(r"[^0-9A-Za-z_]+", "_", feature.name)[:40]


def feature_vectors(spec: FeatureSpec, inputs: dict[str, Any]) -> Any:
    """Every feature as one float vector per example, concatenated: numbers standardised
    by the training split's mean and deviation (uint8 arrays scaled to [0, 1]), text as a
    bag of hashed words, integer sequences as the mean of their tokens' embeddings."""
    parts = []
    for feature in spec.features:
        x = inputs[feature.name]
        if feature.dtype == "string":
            parts.append(HashedWords(HASH_BINS, TOKEN_DIM)(x))
        elif feature.dtype in ("int32", "int64") and feature.padded_shape:
            parts.append(TokenBag(HASH_BINS, TOKEN_DIM)(x))
        else:
            scale, shift = 1.0, 0.0
            if feature.dtype == "uint8":
                scale = 1 / 255.0
            elif feature.std:
                scale, shift = 1 / feature.std, -feature.mean / feature.std
            x = Rescale(scale, shift)(x)
            parts.append(layers.Flatten()(x) if feature.padded_shape else layers.Reshape((1,))(x))
    return parts[0] if len(parts) == 1 else layers.Concatenate()(parts)


HASH_BINS, TOKEN_DIM = 4096, 16


@keras.saving.register_keras_serializable(package="tfscale")
class Rescale(layers.Layer):
    """`x * scale + shift` in float32, missing values (NaN) as 0 after it."""

    def __init__(self, scale: float = 1.0, shift: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.scale, self.shift = float(scale), float(shift)

    def call(self, x):
        x = keras.ops.cast(x, "float32") * self.scale + self.shift
        return keras.ops.where(keras.ops.isnan(x), keras.ops.zeros_like(x), x)

    def get_config(self) -> dict:
        return {**super().get_config(), "scale": self.scale, "shift": self.shift}


@keras.saving.register_keras_serializable(package="tfscale")
class TokenBag(layers.Layer):
    """Integer tokens (0: padding) as the mean of their embeddings, ids taken modulo
    `bins`."""

    def __init__(self, bins: int = HASH_BINS, dim: int = TOKEN_DIM, **kwargs):
        super().__init__(**kwargs)
        self.bins, self.dim = bins, dim
        self.table = layers.Embedding(bins, dim)

    def call(self, ids):
        ids = keras.ops.reshape(keras.ops.cast(ids, "int32"), (keras.ops.shape(ids)[0], -1))
        present = keras.ops.cast(ids != 0, "float32")[..., None]
        vectors = keras.ops.cast(self.table(keras.ops.mod(ids, self.bins)), "float32") * present
        count = keras.ops.maximum(keras.ops.sum(present, axis=1), 1.0)
        return keras.ops.sum(vectors, axis=1) / count

    def get_config(self) -> dict:
        return {**super().get_config(), "bins": self.bins, "dim": self.dim}


@keras.saving.register_keras_serializable(package="tfscale")
class HashedWords(layers.Layer):
    """Text as the mean embedding of its words (split on whitespace, lower-cased, hashed
    into `bins`)."""

    def __init__(self, bins: int = HASH_BINS, dim: int = TOKEN_DIM, **kwargs):
        super().__init__(**kwargs)
        self.bins, self.dim = bins, dim
        self.table = layers.Embedding(bins, dim)

    def call(self, text):
        import tensorflow as tf

        words = tf.strings.split(tf.strings.lower(tf.reshape(text, [-1])))
        ids = tf.strings.to_hash_bucket_fast(words, self.bins)
        vectors = tf.ragged.map_flat_values(self.table, ids)
        total = tf.cast(tf.reduce_sum(vectors, axis=1), "float32")
        return total / tf.cast(tf.maximum(words.row_lengths(), 1), "float32")[:, None]

    def get_config(self) -> dict:
        return {**super().get_config(), "bins": self.bins, "dim": self.dim}


def _mlp(x):
    x = layers.Flatten()(x)
    for width in (256, 128):
        x = layers.Dense(width, activation="relu")(x)
    return x


def _cnn(x):
    """Three conv layers as in the Keras examples, sized to the input."""
    for filters in (32, 64, 64):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        if x.shape[1] >= 4:
            x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    return layers.Dense(128, activation="relu")(x)


def _residual(x, filters: int, stride: int):
    shortcut = x
    y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    y = layers.Activation("relu")(y)
    y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = layers.BatchNormalization()(shortcut)
    return layers.Activation("relu")(layers.Add()([y, shortcut]))


def _resnet(x):
    """A small residual net for 32x32 images: three stages of two blocks."""
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 and x.shape[1] >= 4 else 1
            x = _residual(x, filters, stride)
    return layers.GlobalAveragePooling2D()(x)


EMBEDDING_ROWS, EMBEDDING_DIM = 65_536, 16  # float32: a 4 MiB table
LEVELS = 16
PARTITION_SHARD_BYTES = 1 << 20  # on parameter servers, tables of 2 MiB or more are split


def table_shards(rows: int, dim: int, ps_tasks: int) -> int:
    """Parts a table is split into: one per ps task, each at least PARTITION_SHARD_BYTES."""
    return max(1, min(ps_tasks, rows * dim * 4 // PARTITION_SHARD_BYTES))


@keras.saving.register_keras_serializable(package="tfscale")
class PartitionedEmbedding(layers.Layer):
    """An embedding table split by row (`id % shards`) into `shards` variables.

    A parameter-server strategy places variables on its ps tasks in turn, so each part
    lands on its own ps. (TensorFlow's own variable partitioner makes a ShardedVariable,
    which Keras 3's optimizer cannot update: "ShardedVariable doesn't support being used
    as a reference".)
    """

    def __init__(self, rows: int, dim: int, shards: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.rows, self.dim, self.shards = rows, dim, shards
        self.parts = [
            self.add_weight(
                shape=(-(-(rows - i) // shards), dim),
                initializer="uniform",
                name=f"part_{i}",
            )
            for i in range(shards)
        ]

    def call(self, ids):
        part, row = ids % self.shards, ids // self.shards
        out = 0.0
        for i, table in enumerate(self.parts):
            rows = keras.ops.take(table, keras.ops.minimum(row, table.shape[0] - 1), axis=0)
            mask = keras.ops.expand_dims(keras.ops.cast(part == i, rows.dtype), -1)
            out = out + rows * mask
        return out

    def get_config(self) -> dict:
        return {**super().get_config(), "rows": self.rows, "dim": self.dim, "shards": self.shards}


@keras.saving.register_keras_serializable(package="tfscale")
class ColumnSplitDense(layers.Layer):
    """A Dense layer whose kernel (and bias) is split by columns into `parts`, each part's
    variables and matmul on a device of its own (`devices`; none: wherever the caller is),
    the outputs joined: Megatron's column-parallel linear layer. The activation is
    elementwise, so the join equals the whole layer's output. Saved without its devices: it
    loads on one device."""

    def __init__(self, units: int, parts: int = 2, activation=None, devices=None, **kwargs):
        super().__init__(**kwargs)
        self.units, self.parts = units, parts
        self.activation = keras.activations.get(activation)
        self.devices = list(devices or [None] * parts)
        self.widths = [units // parts + (1 if i < units % parts else 0) for i in range(parts)]

    def build(self, input_shape):
        import tensorflow as tf

        self.kernels, self.biases = [], []
        for i, (width, device) in enumerate(zip(self.widths, self.devices, strict=True)):
            with tf.device(device):
                self.kernels.append(
                    self.add_weight(
                        shape=(input_shape[-1], width),
                        initializer="glorot_uniform",
                        name=f"kernel_{i}",
                    )
                )
                self.biases.append(
                    self.add_weight(shape=(width,), initializer="zeros", name=f"bias_{i}")
                )

    def call(self, x):
        import tensorflow as tf

        outputs = []
        for kernel, bias, device in zip(self.kernels, self.biases, self.devices, strict=True):
            with tf.device(device):
                outputs.append(self.activation(keras.ops.matmul(x, kernel) + bias))
        return keras.ops.concatenate(outputs, axis=-1)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "units": self.units,
            "parts": self.parts,
            "activation": keras.activations.serialize(self.activation),
        }


def _embedding(x, ps_tasks: int = 0):
    """A wide model: every (pixel position, intensity level) is a token, hashed into a large
    embedding table; the mean of a picture's token vectors feeds one hidden layer. On a
    parameter-server cluster the table is split across the ps tasks."""
    flat = layers.Flatten()(x)
    scaled = keras.ops.round(keras.ops.clip(flat, 0.0, 1.0) * (LEVELS - 1))
    positions = keras.ops.arange(flat.shape[-1], dtype="int32") * LEVELS
    tokens = ((positions + keras.ops.cast(scaled, "int32")) * 40_503) % EMBEDDING_ROWS
    shards = table_shards(EMBEDDING_ROWS, EMBEDDING_DIM, ps_tasks)
    vectors = PartitionedEmbedding(EMBEDDING_ROWS, EMBEDDING_DIM, shards, name="table")(tokens)
    x = layers.GlobalAveragePooling1D()(vectors)
    return layers.Dense(64, activation="relu")(x)


MODELS: dict[str, Callable] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "resnet": _resnet,
    "embedding": _embedding,
}
