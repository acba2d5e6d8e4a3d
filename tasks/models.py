"""The models tfscale trains, by name: `mlp`, `cnn` and a small `resnet`, in Keras 3 layers."""

from __future__ import annotations

from collections.abc import Callable

import keras
from keras import layers

from tasks.errors import UsageError


def load_trained_model(path: str) -> keras.Model:
    """A model tfscale saved, without its optimizer (its learning-rate schedule is
    registered with Keras in `tasks.steps`)."""
    import tasks.steps  # noqa: F401  (registers WarmupSchedule)

    return keras.models.load_model(path, compile=False)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """A fresh model whose last layer gives float32 logits (also under mixed precision).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in MODELS:
        raise UsageError(f"Unknown model {name!r}; expected one of {', '.join(MODELS)}")
    inputs = keras.Input(shape=input_shape)
    features = MODELS[name](inputs)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(features)
    return keras.Model(inputs, logits, name=name)


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


MODELS: dict[str, Callable] = {"mlp": _mlp, "cnn": _cnn, "resnet": _resnet}
