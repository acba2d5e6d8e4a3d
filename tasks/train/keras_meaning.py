"""What Keras's own `fit` means by a training step, for tfscale's loop to train exactly that:
the loss of a batch as the model's `compute_loss` gives it (the compiled loss with its
`loss_weights`, plus `model.losses`: regularisers and `add_loss`), and a model's own
`train_step` where it overrides Keras's.

tfscale's loop owns the distribution, the clock and the gradient noise scale; the meaning of
a step is the model's. Reduction follows Keras under a strategy: the compiled loss is the
mean over the replica's batch divided by the replicas in sync, and so is each of
`model.losses` (`keras/src/backend/tensorflow/trainer.py` `_aggregate_additional_loss`), so
the optimizer's all-reduced sum is the global batch's mean gradient.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tfscale.tasks.train.objectives import Built


def _overrides(model: Any, method: str) -> bool:
    return getattr(type(model), method, None) is not getattr(keras.Model, method)


def own_train_step(model: Any) -> bool:
    """Whether the model overrides Keras's `train_step` (Keras's guide "Customizing what
    happens in fit()")."""
    return _overrides(model, "train_step")


def own_test_step(model: Any) -> bool:
    """Whether the model overrides Keras's `test_step` (its own evaluation)."""
    return _overrides(model, "test_step")


def keras_loss(model: Any) -> bool:
    """Whether Keras's `compute_loss` gives the model's loss: it was compiled with a loss,
    or overrides `compute_loss`. Otherwise the label kind's default loss stands in for the
    compiled one (`tasks.train.objectives`), with `model.losses` added as Keras adds them."""
    compiled = getattr(model, "compiled", False) and getattr(model, "_compile_loss", None)
    return bool(compiled) or _overrides(model, "compute_loss")


def not_cut_as_it_means(model: Any) -> list[str]:
    """What of the model's own meaning a pipeline or column cut would not train (its stages
    run the objective's loss alone): empty where nothing."""
    found = []
    if own_train_step(model):
        found.append("its own train_step")
    if _overrides(model, "compute_loss"):
        found.append("its own compute_loss")
    if model.losses:
        found.append(f"{len(model.losses)} regularisation or add_loss term(s) (model.losses)")
    return found


def attach(built: Built, optimizer: Any, features: Any, labels: Any) -> None:
    """Readies a model for tfscale's step, in the strategy's scope: its compiled loss and
    metrics built for a batch like (`features`, `labels`), as `fit` builds them before its
    first step (their variables made here, not inside a traced step); a model with its own
    `train_step` updates with tfscale's `optimizer` (`model.optimizer`), whose all-reduce
    the training's rate and rounds act on."""
    model, objective = built
    if own_train_step(model):
        model.optimizer = optimizer
    if getattr(model, "compiled", False):
        targets = objective.keras_labels(labels)
        model._symbolic_build(data_batch=(features, targets))


def step_loss(
    model: Any, objective: Any, batch: tuple, outputs: Any, effective_batch: int
) -> tf.Tensor:
    """The loss of a (micro-)batch, (features, labels, each example's weight or None),
    whose replica's examples are `effective_batch` divided by the replicas in sync, in
    float32: Keras's `compute_loss` of it divided by the micro-batches of the step, or (no
    compiled loss) the objective's loss summed over the effective batch plus `model.losses`
    as Keras scales them."""
    x, labels, given = batch
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    rows = tf.nest.flatten(x)[0].shape[0]
    share = effective_batch / (rows * replicas)  # the micro-batches of a step
    weights = objective.sample_weights(labels, given)  # as fit applies them
    if keras_loss(model):
        targets = objective.targets(labels, outputs)
        loss = model._compute_loss(
            x=x, y=targets, y_pred=outputs, sample_weight=weights, training=True
        )
        return tf.cast(loss, tf.float32) / share
    each = objective.loss(labels, outputs)
    loss = tf.reduce_sum(each if weights is None else each * weights) / effective_batch
    extra = [tf.cast(tf.reduce_sum(each), tf.float32) for each in model.losses]
    if extra:
        loss += tf.add_n(extra) / (replicas * share)
    return loss


def held_out_losses(model: Any, objective: Any, labels: Any, outputs: Any) -> tf.Tensor:
    """Each example's loss as Keras's `evaluate` counts it: the compiled (or the kind's)
    loss, plus the `model.losses` (regularisers, `add_loss`) of the call that gave
    `outputs`, which Keras adds to every batch's mean."""
    each = tf.cast(objective.loss(labels, outputs), tf.float32)
    extra = [tf.cast(tf.reduce_sum(term), tf.float32) for term in model.losses]
    return each + tf.add_n(extra) if extra else each


def run_own_train_step(
    model: Any, objective: Any, x: Any, labels: Any, given: Any = None
) -> tuple[Any, Any]:
    """The model's own `train_step` on this replica's batch (with each example's weight
    where the data has them), its metrics reset first so that what it returns is this
    step's: (its loss over the replicas in sync, so that summing the replicas gives the
    mean; the sum of the examples' scores where it reports the label kind's score, else
    NaN)."""
    for metric in model.metrics:
        metric.reset_state()
    weights = objective.sample_weights(labels, given)  # fit gives (x, y, weights) with them
    data = (x, objective.keras_labels(labels))
    logs = model.train_step(data if weights is None else (*data, weights))
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    rows = tf.cast(tf.shape(labels)[0], tf.float32)
    return _logged(logs, "loss") / replicas, _logged(logs, objective.label.score) * rows


def _logged(logs: Any, name: str) -> tf.Tensor:
    """A value the step returned by name, float32; NaN where it returned none such."""
    value = logged_value(logs, name)
    return tf.constant(float("nan")) if value is None else tf.cast(value, tf.float32)


# the names Keras gives a score's metric (`compile(metrics=["mae"])` logs `mae`)
SCORE_NAMES = {"accuracy": ("accuracy", "acc"), "mean_absolute_error": ("mae",)}


def logged_value(logs: Any, name: str) -> Any:
    """The value the step logged under `name` (or a name Keras gives its metric), its logs
    flattened as Keras flattens them (a guide's `{m.name: m.result() for m in
    self.metrics}` nests the compiled metrics under `compile_metrics`)."""
    if not isinstance(logs, dict):
        return None
    flat = _flattened(logs)
    value = flat.get(name)
    names = SCORE_NAMES.get(name, ())
    if value is None and names:
        found = (v for k, v in flat.items() if k in names or k.endswith(f"_{name}"))
        value = next(found, None)
    return value


def _flattened(logs: dict) -> dict:
    """Nested dicts of logs as one, their inner keys kept (as Keras's `fit` reports them)."""
    flat = {}
    for key, value in logs.items():
        if isinstance(value, dict):
            flat.update(_flattened(value))
        else:
            flat[key] = value
    return flat
