"""A two-input functional model, saved as a .keras file (docs/your-model.md): the data
has two features, `pixels` (8x8 images as floats) and `hint` (one number)."""

import keras
import numpy as np
from sklearn.datasets import load_digits


def arrays(path="digits2.npz"):
    """The UCI digits as two features and a class label, in an .npz."""
    digits = load_digits()
    hint = (digits.images.mean(axis=(1, 2)) / 16).astype(np.float32)
    pixels = (digits.images / 16).astype(np.float32)
    np.savez(path, pixels=pixels, hint=hint, label=digits.target)
    return path


def save(path="two_inputs.keras"):
    pixels = keras.Input(shape=(8, 8), name="pixels")
    hint = keras.Input(shape=(), name="hint")
    x = keras.layers.Flatten()(pixels)
    x = keras.layers.Concatenate()([x, keras.layers.Reshape((1,))(hint)])
    x = keras.layers.Dense(64, activation="relu")(x)
    model = keras.Model({"pixels": pixels, "hint": hint}, keras.layers.Dense(10)(x))
    model.compile(
        "adam",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.save(path)
    return path
