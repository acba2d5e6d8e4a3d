"""What a training minimises and reports, from the label's kind (`tasks.data.spec`) or from
the user's compiled model (its loss and metrics).

`loss` gives each example's loss from the model's outputs; `score` each example's share of
what the training reports as it goes: 1 for a right class (accuracy), the share of labels
right (multi-label), the absolute error (real values: the mean absolute error). The
built-in models give float32 logits; a user's model may give probabilities (a softmax or
sigmoid last layer, or a compiled loss without `from_logits`), which `from_logits` says.
A model is built with its objective beside it (`Built`), never on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tfscale.tasks.data.spec import Label

# metric names whose lower values are better (errors and losses); any other is higher-better
_LOWER = ("loss", "error", "crossentropy", "hinge", "divergence", "poisson", "logcosh")
_LOWER_SHORT = ("mse", "mae", "mape", "msle", "rmse")


def lower_is_better(metric: str) -> bool:
    """Whether a metric's lower values are better: a loss or an error."""
    name = metric.lower()
    return name in _LOWER_SHORT or any(word in name for word in _LOWER)


@dataclass(frozen=True, eq=False)
class Objective:
    label: Label
    from_logits: bool = True
    # the user's compiled loss (a Keras loss object or function); None: the kind's default
    loss_fn: Any = None
    # the user's compiled metrics (Keras's serialized forms), for a target metric by name
    metrics: tuple[Any, ...] = field(default_factory=tuple)
    # each class's weight in the training loss, by class id (`train.class_weight`,
    # `tasks.core.class_weights`); empty: none
    class_weights: tuple[float, ...] = ()
    # the user's compiled `weighted_metrics`: on the held-out split, each example counted
    # by its weight where the data has weights (`evaluate(x, y, sample_weight)`)
    weighted_metrics: tuple[Any, ...] = ()

    @property
    def kind(self) -> str:
        return self.label.kind

    def loss(self, labels: Any, outputs: Any) -> Any:
        """Each example's loss (a vector of the batch's length)."""
        import keras
        import tensorflow as tf

        outputs = tf.cast(outputs, tf.float32)
        rows = tf.shape(outputs)[0]
        if self.loss_fn is not None:
            return self._user_loss(labels, outputs, rows)
        if self.kind == "class":
            return keras.losses.sparse_categorical_crossentropy(
                labels, outputs, from_logits=self.from_logits
            )
        targets = tf.reshape(tf.cast(labels, tf.float32), [rows, -1])
        outputs = tf.reshape(outputs, [rows, -1])
        if self.kind == "regression":
            return tf.reduce_mean(tf.square(outputs - targets), axis=-1)
        return keras.losses.binary_crossentropy(targets, outputs, from_logits=self.from_logits)

    def _user_loss(self, labels: Any, outputs: Any, rows: Any) -> Any:
        import keras
        import tensorflow as tf

        targets = self.targets(labels, outputs)
        function = self.loss_fn
        if isinstance(function, keras.losses.Loss):
            function = function.call  # unreduced: each example's
        per_example = tf.cast(function(targets, outputs), tf.float32)
        return tf.reduce_mean(tf.reshape(per_example, [rows, -1]), axis=-1)

    def sample_weights(self, labels: Any, given: Any = None) -> Any:
        """Each training example's weight, float32: the data's own (`given`, as
        `fit(sample_weight=)` takes them), or as Keras's `fit(class_weight=)` turns class
        weights into them (`make_class_weight_map_fn`: the class id, a binary label
        rounded); None with neither (Keras takes one or the other, never both: the run
        refuses both, `tasks.distribute.run`)."""
        import tensorflow as tf

        if given is not None:
            return tf.cast(given, tf.float32)
        if not self.class_weights:
            return None

        ids = tf.reshape(tf.cast(tf.round(tf.cast(labels, tf.float32)), tf.int32), [-1])
        return tf.gather(tf.constant(self.class_weights, tf.float32), ids)

    @property
    def keras_class_weight(self) -> dict[int, float] | None:
        """The class weights as `fit(class_weight=)` takes them."""
        return dict(enumerate(self.class_weights)) if self.class_weights else None

    def targets(self, labels: Any, outputs: Any) -> Any:
        """The labels as the user's loss and metrics take them: class ids (one-hot where the
        loss is categorical, not sparse), else the outputs' shape."""
        import tensorflow as tf

        if self.kind == "class":
            return self.keras_labels(labels)
        return tf.reshape(tf.cast(labels, outputs.dtype), tf.shape(outputs))

    def keras_loss(self) -> Any:
        """The loss as a Keras loss object for `compile`: the user's, else the kind's
        default (`loss` computes the same per example)."""
        import keras

        if self.loss_fn is not None:
            return self.loss_fn
        if self.kind == "class":
            return keras.losses.SparseCategoricalCrossentropy(from_logits=self.from_logits)
        if self.kind == "regression":
            return keras.losses.MeanSquaredError()
        return keras.losses.BinaryCrossentropy(from_logits=self.from_logits)

    def keras_labels(self, labels: Any) -> Any:
        """The labels as a step of the model's own takes them, as `fit` would be given them:
        class ids (one-hot where the compiled loss is categorical), else float32."""
        import tensorflow as tf

        if self.kind == "class":
            if self.one_hot:
                return tf.one_hot(tf.cast(labels, tf.int32), self.label.num_classes)
            return labels
        return tf.cast(labels, tf.float32)

    @property
    def one_hot(self) -> bool:
        name = loss_name(self.loss_fn)
        return "categorical" in name and "sparse" not in name

    def score(self, labels: Any, outputs: Any) -> Any:
        """Each example's score, float32: right or not (class, binary), the share of labels
        right (multi-label), the mean absolute error (real values)."""
        import tensorflow as tf

        outputs = tf.cast(outputs, tf.float32)
        if self.kind == "class":
            predicted = tf.argmax(outputs, axis=-1, output_type=tf.int32)
            return tf.cast(predicted == tf.cast(labels, tf.int32), tf.float32)
        rows = tf.shape(outputs)[0]
        targets = tf.reshape(tf.cast(labels, tf.float32), [rows, -1])
        outputs = tf.reshape(outputs, [rows, -1])
        if self.kind == "regression":
            return tf.reduce_mean(tf.abs(outputs - targets), axis=-1)
        threshold = 0.0 if self.from_logits else 0.5
        right = tf.cast((outputs > threshold) == (targets > 0.5), tf.float32)
        return tf.reduce_mean(right, axis=-1)

    def metric_names(self) -> list[str]:
        """The names of the metrics the model reports: the kind's score, `loss`, and its
        compiled metrics' and weighted metrics' (as Keras names them)."""
        return [self.label.score, "loss", *self._named()]

    def _named(self) -> dict[str, tuple[Any, bool]]:
        """The compiled metrics by the names Keras logs them under, each with whether it
        is weighted: a weighted metric whose name a metric took is `weighted_<name>`."""
        named: dict[str, tuple[Any, bool]] = {}
        for config in self.metrics:
            named.setdefault(_metric_name(config), (config, False))
        for config in self.weighted_metrics:
            name = _metric_name(config)
            named.setdefault(f"weighted_{name}" if name in named else name, (config, True))
        return named

    def is_weighted(self, name: str) -> bool:
        """Whether the metric of that name was compiled as one of `weighted_metrics`."""
        return self._named().get(name, (None, False))[1]

    def _shapes(self) -> tuple[Any, Any]:
        """A batch of one's labels and outputs as the user's metrics take them (zeros): the
        shapes by which Keras's `compile` tells `accuracy` binary, sparse or categorical."""
        import numpy as np

        outputs = np.zeros((1, self.label.outputs), np.float32)
        if self.kind == "class" and not self.one_hot:
            return np.zeros((1,), np.float32), outputs
        return np.zeros((1, self.label.outputs), np.float32), outputs

    def metric(self, name: str) -> Any:
        """A fresh Keras metric object: the compiled one named `name`, else Keras's own of
        that name (`auc`, `precision`, ...); None where neither is."""
        import keras

        config = self._named().get(name, (None, False))[0]
        if isinstance(config, str):  # as `compile` resolves it: `accuracy` by the shapes
            from keras.src.trainers.compile_utils import get_metric

            return get_metric(config, *self._shapes())
        if config is not None:
            return _fresh(config)
        try:
            return keras.metrics.get(name)
        except ValueError:
            return None


def _metric_name(config: Any) -> str:
    if isinstance(config, str):
        return config
    return config.get("config", {}).get("name", config.get("class_name", "")).lower()


def _fresh(config: dict) -> Any:
    import keras

    return keras.saving.deserialize_keras_object(config)


def loss_name(function: Any) -> str:
    """A loss's name, lower-cased (a Keras loss object's function's); empty for none."""
    if function is None:
        return ""
    inner = getattr(function, "fn", function)  # a LossFunctionWrapper's function
    return str(getattr(inner, "__name__", type(inner).__name__)).lower()


class Built(NamedTuple):
    """A model and what it is trained for, as they are built together
    (`tasks.train.models.model_for_data`, `tasks.train.user_models.user_model`) and travel
    together through a training's steps."""

    model: Any
    objective: Objective
