"""A sequence model (an embedding and a 1-D convolution) on a tf.data function of token
sequences, compiled with SGD and momentum (docs/your-model.md)."""

import keras
import numpy as np
import tensorflow as tf

VOCABULARY, LENGTH = 200, 24


def tokens():
    """2,000 seeded sequences of tokens; the label: whether any of tokens 1-6 is among
    them (about half are)."""
    rng = np.random.default_rng(0)
    x = rng.integers(1, VOCABULARY, size=(2000, LENGTH), dtype=np.int32)
    y = (x <= 6).any(axis=1).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y))


def build(spec):
    ids = keras.Input(shape=spec.features[0].shape, dtype="int32")
    x = keras.layers.Embedding(VOCABULARY, 16)(ids)
    x = keras.layers.Conv1D(32, 3, activation="relu")(x)
    x = keras.layers.GlobalMaxPooling1D()(x)
    model = keras.Model(ids, keras.layers.Dense(1)(x))
    model.compile(
        keras.optimizers.SGD(0.1, momentum=0.9),
        keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)],
    )
    return model
