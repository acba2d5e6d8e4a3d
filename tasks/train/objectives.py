"""What a training minimises and reports, from the label's kind (`tasks.data.spec`).

`loss` gives each example's loss from the model's float32 logits; `score` each example's
share of what the training reports as it goes: 1 for a right class (accuracy), the share
of labels right (multi-label), the absolute error (real values: the mean absolute error).
A model carries its objective (`objective_of`), set where it is built from the data's spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.data.spec import Label


@dataclass(frozen=True)
class Objective:
    label: Label

    @property
    def kind(self) -> str:
        return self.label.kind

    def loss(self, labels: Any, logits: Any) -> Any:
        """Each example's loss (a vector of the batch's length)."""
        import keras
        import tensorflow as tf

        logits = tf.cast(logits, tf.float32)
        if self.kind == "class":
            return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        rows = tf.shape(logits)[0]
        targets = tf.reshape(tf.cast(labels, tf.float32), [rows, -1])
        logits = tf.reshape(logits, [rows, -1])
        if self.kind == "regression":
            return tf.reduce_mean(tf.square(logits - targets), axis=-1)
        return keras.losses.binary_crossentropy(targets, logits, from_logits=True)

    def score(self, labels: Any, logits: Any) -> Any:
        """Each example's score, float32: right or not (class, binary), the share of labels
        right (multi-label), the mean absolute error (real values)."""
        import tensorflow as tf

        logits = tf.cast(logits, tf.float32)
        if self.kind == "class":
            predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
            return tf.cast(predicted == tf.cast(labels, tf.int32), tf.float32)
        rows = tf.shape(logits)[0]
        targets = tf.reshape(tf.cast(labels, tf.float32), [rows, -1])
        logits = tf.reshape(logits, [rows, -1])
        if self.kind == "regression":
            return tf.reduce_mean(tf.abs(logits - targets), axis=-1)
        right = tf.cast((logits > 0.0) == (targets > 0.5), tf.float32)
        return tf.reduce_mean(right, axis=-1)


CLASSES = Objective(Label("class"))  # the objective of image models: a class per example


def objective_of(model: Any) -> Objective:
    """The objective a model was built for (`set_objective`); a class per example where
    none was set."""
    return getattr(model, "tfscale_objective", CLASSES)


def set_objective(model: Any, label: Label) -> Any:
    """Marks `model` as trained for `label` (returns it)."""
    model.tfscale_objective = Objective(label)
    return model
