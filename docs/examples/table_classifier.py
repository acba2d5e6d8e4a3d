"""A table classifier over every column, compiled with AdamW and AUC (docs/your-model.md)."""

import keras


def build(spec):
    # keyed by Keras's names, as Keras wants a dict's keys to be its inputs' names
    inputs = {f.keras_name: keras.Input(shape=(1,), name=f.keras_name) for f in spec.features}
    x = keras.layers.Concatenate()(list(inputs.values()))
    mean = [f.mean for f in spec.features]
    x = keras.layers.Normalization(mean=mean, variance=[f.std**2 for f in spec.features])(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(keras.optimizers.AdamW(1e-3), "binary_crossentropy", metrics=["auc"])
    return model
