"""A regression on a table, with a mean-absolute-error target (docs/your-model.md)."""

import keras


def build(spec):
    # keyed by Keras's names, as Keras wants a dict's keys to be its inputs' names
    inputs = {f.keras_name: keras.Input(shape=(1,), name=f.keras_name) for f in spec.features}
    x = keras.layers.Concatenate()(list(inputs.values()))
    mean = [f.mean for f in spec.features]
    x = keras.layers.Normalization(mean=mean, variance=[f.std**2 for f in spec.features])(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(1)(x)
    # learnt on the label's standardised scale, reported on its own
    y = keras.layers.Rescaling(spec.label.std, offset=spec.label.mean)(x)
    model = keras.Model(inputs, y)
    model.compile(keras.optimizers.Adam(3e-3), "mse", metrics=["mae"])
    return model
