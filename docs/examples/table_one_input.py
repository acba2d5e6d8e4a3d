"""A table classifier of one input over the numeric columns, as `model.fit` takes
`df.drop(columns=[label]).values` (docs/your-model.md)."""

import keras


def build(spec):
    inputs = keras.Input(shape=(len(spec.numbers),))
    x = keras.layers.Normalization(
        mean=[f.mean for f in spec.numbers], variance=[f.std**2 for f in spec.numbers]
    )(inputs)
    x = keras.layers.Dense(32, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(keras.optimizers.AdamW(1e-3), "binary_crossentropy", metrics=["auc"])
    return model
