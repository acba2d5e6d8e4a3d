"""Keras's own `model.fit` as the training loop (`train.loop: fit`): the training a user runs
today, under the run's strategy and tfscale's optimizer (its rate rule), timed and evaluated
on the held-out clock by a callback, so that its figures stand beside tfscale's loop's.

One `fit` call trains every epoch (Keras reshuffles each epoch's examples; its iterator
runs on across the held-out evaluations); `make_fit_runner` times blocks of steps for the
measuring rounds, each a `fit` call timed from its first step (its set-up not counted).
Keras's `fit` runs under OneDevice and Mirrored strategies (`StrategyKind.keras_fit`; the
others are refused as the strategy is chosen).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfscale.tasks.core.process import raise_if_stopped
from tfscale.tasks.train.objectives import Built, Objective
from tfscale.tasks.train.steps import first_rows, half_gradients

SCORE = "tfscale_score"


def compile_for_fit(built: Built, optimizer: Any, steps_per_execution: int) -> None:
    """Compiles the model for `fit` with tfscale's `optimizer`: its own compiled loss,
    `loss_weights` and metrics where it was compiled (the label kind's default loss where
    not), and the label kind's score (`SCORE`) for the training's records."""
    model, objective = built
    config = _compile_given(model) or {}
    metrics = [m for m in _as_list(config.get("metrics")) if m is not None]
    loss = config.get("loss") if model.compiled else objective.keras_loss()
    model.compile(
        optimizer=optimizer,
        loss=loss,
        loss_weights=config.get("loss_weights"),
        metrics=[*metrics, _Score(objective)],
        steps_per_execution=steps_per_execution,
    )


def compiled_as_given(model: Any) -> Callable[[], None]:
    """A call that puts the model's compile back as the user gave it (their optimizer, loss
    and metrics, or none), so that its saved file reads back as tfscale's loop saves it:
    `compile_for_fit`'s score metric is tfscale's own, not for the file."""
    config = _compile_given(model)

    def restore() -> None:
        if config is not None:
            model.compile(**config)
        else:
            model.compiled = False

    return restore


def _compile_given(model: Any) -> dict[str, Any] | None:
    """The arguments the model was compiled with (Keras keeps them), or None."""
    return dict(model._compile_config.config) if model.compiled else None


def _as_list(metrics: Any) -> list[Any]:
    if metrics is None:
        return []
    if isinstance(metrics, dict):
        return [m for value in metrics.values() for m in _as_list(value)]
    return list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]


class _Score(keras.metrics.Mean):
    """The mean of the label kind's score of each example (`Objective.score`): accuracy, or
    a real value's absolute error."""

    def __init__(self, objective: Any):
        super().__init__(name=SCORE)
        self.objective = objective

    def update_state(self, y_true, y_pred, sample_weight=None):
        if self.objective.kind == "class" and self.objective.one_hot:
            y_true = tf.argmax(y_true, axis=-1)
        return super().update_state(self.objective.score(y_true, y_pred))


def fit_input(dataset_fn: Callable, objective: Objective) -> tf.data.Dataset:
    """The training input as `fit` takes it: global batches (this worker's replicas' in
    turn, which `fit` splits among them), labels as the model's loss takes them."""
    return dataset_fn(None).map(lambda x, y, *w: (x, objective.keras_labels(y), *w))


def logged_score(logs: dict[str, Any], name: str) -> float:
    """The label kind's score `fit` logged: tfscale's metric (`SCORE`), or where the
    model's own `train_step` returns its logs without it, the score it logs by Keras's
    name (`keras_meaning`), else NaN."""
    from tfscale.tasks.train.keras_meaning import logged_value

    value = logs.get(SCORE)
    if value is None:
        value = logged_value(logs, name)
    return float("nan") if value is None else float(value)


class EpochRecords(keras.callbacks.Callback):
    """Each epoch of one `fit` call as tfscale's loop records it (`training._timed_epoch`):
    its loss and score, its seconds without the held-out evaluations, which it runs at the
    clock's cuts (at the first step a graph call ends on or after each), ending the
    training at the target when asked."""

    def __init__(
        self,
        clock: Any,
        steps: int,
        step_examples: int,
        stop_at_target: bool,
        written: Callable[[dict[str, float]], None],
        score_name: str = "accuracy",
        finite: Callable[[float, int, int], None] = lambda loss, epoch, step: None,
        window: Callable[[int], None] = lambda step: None,
    ):
        super().__init__()
        self.finite = finite  # (loss, epoch, step): stops a training whose loss is not a number
        # (step): the noise scale's window to the step, read where tfscale's loop reads it
        self.window = window
        self.score_name = score_name  # the label kind's (`Label.score`)
        self.clock, self.steps, self.step_examples = clock, steps, step_examples
        self.stop_at_target, self.written = stop_at_target, written
        self.history: list[dict[str, float]] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.clock.start()
        self.first = epoch * self.steps
        self.done, self.evaluating = 0, 0.0
        self.cuts = self.clock.cuts(self.first, self.first + self.steps)
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        raise_if_stopped()  # a stop whose exception was swallowed (`process.stops_noted`)
        self.done = batch + 1
        step = self.first + self.done
        if self.cuts and step >= self.cuts[0]:
            self.cuts = [c for c in self.cuts if c > step]
            self.window(step)
            self.evaluating += self.clock.evaluate(step)
            if self.stop_at_target and self.clock.reached:
                self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self.started - self.evaluating
        examples = self.done * self.step_examples
        loss, score = float(logs["loss"]), logged_score(logs, self.score_name)
        self.finite(loss, epoch + 1, self.first + self.done)
        if not self.clock.on:  # no evaluations to read it at: each epoch's end
            self.window(self.first + self.done)
        record = self.clock.epoch_record(epoch + 1, self.first, loss, score, seconds, examples)
        self.history.append(record)
        self.written(record)


def dividing(steps: int, per_call: int) -> int:
    """The most steps up to `per_call` that divide `steps`: Keras's `fit` runs whole
    executions of `steps_per_execution` steps (an epoch of 45 steps at 10 runs 50), so an
    epoch of exactly `steps` needs an execution that divides it."""
    return max(k for k in range(1, max(min(per_call, steps), 1) + 1) if steps % k == 0)


def fit_epochs(
    setup: Any,
    dataset_fn: Callable,
    cfg: Any,
    callbacks: tuple[list[Any], Any],
    initial_epoch: int = 0,
) -> Any:
    """Trains epochs `initial_epoch` (a resumed training's first) to `cfg.epochs` of
    `setup.steps` steps in one `fit` call over `dataset_fn`'s global batches (Keras
    reshuffles each epoch; its iterator runs on across the held-out evaluations), in whole
    executions that divide an epoch (`dividing` `cfg.steps_per_call`), so that an epoch is
    exactly its steps. `callbacks`: fit's, and the held-out batches it evaluates each epoch
    for the user's (`validation_data`, or None). Returns Keras's `History`."""
    callbacks, validation = callbacks
    compile_for_fit(setup.built, setup.optimizer, dividing(setup.steps, cfg.steps_per_call))
    return setup.model.fit(
        fit_input(dataset_fn, setup.objective),
        epochs=cfg.epochs,
        initial_epoch=initial_epoch,
        class_weight=setup.objective.keras_class_weight,
        steps_per_epoch=setup.steps,
        verbose=0,
        shuffle=False,  # the input is shuffled by its seed, each epoch anew
        callbacks=callbacks,
        validation_data=validation,
    )


def make_fit_runner(setup: Any, dataset_fn: Callable) -> Callable:
    """An epoch runner (`steps.make_epoch_runner`'s contract) of `fit` calls over
    `dataset_fn` (each replica's batches, taken in turn as global batches): `run(steps)`
    trains exactly `steps` steps with `fit` (whole executions of `steps_per_call`, then the
    remainder as one execution, each execution's function traced once and kept) and
    returns (the loss summed over them, the summed score of their examples), as tfscale's
    runner does; `run.clock.seconds` is the last call's steps' own time."""
    model = setup.model
    compile_for_fit(setup.built, setup.optimizer, setup.steps_per_call)
    data = fit_input(lambda ctx: dataset_fn(ctx).rebatch(setup.global_batch), setup.objective)
    clock = FirstStepClock()
    traced: dict[int, Any] = {}

    def fit_steps(steps: int, per_execution: int) -> dict[str, list[float]]:
        if model.steps_per_execution != per_execution:
            traced[model.steps_per_execution] = model.train_function
            model.steps_per_execution = per_execution
            model.train_function = traced.get(per_execution)  # None: `fit` traces it
        return model.fit(
            data,
            epochs=1,
            steps_per_epoch=steps,
            verbose=0,
            shuffle=False,
            callbacks=[clock],
            class_weight=setup.objective.keras_class_weight,
        ).history

    def run_epoch(steps: int, after_steps: Callable[[int], None] = lambda n: None):
        whole, rest = divmod(steps, setup.steps_per_call)
        parts = [(whole * setup.steps_per_call, setup.steps_per_call), (rest, rest)]
        loss = score = seconds = 0.0
        for n, per_execution in (p for p in parts if p[0]):
            logs = fit_steps(n, per_execution)
            loss += logs["loss"][-1] * n
            last = {name: values[-1] for name, values in logs.items()}
            score += logged_score(last, setup.objective.label.score) * n * setup.step_examples
            seconds += clock.seconds
        clock.seconds = seconds
        after_steps(steps)
        return loss, score

    run_epoch.clock = clock
    return run_epoch


def recording_train_step(model: Any, noise: Any) -> Callable:
    """Keras's own `train_step` (Keras 3.15's TensorFlow trainer: the same calls in the same
    order, so the update is `fit`'s) that also stages the gradient noise scale's norms
    (`steps.GradientNoise`) as tfscale's step stages them: each replica's gradient, or a
    lone replica's two halves' from the same forward pass; the optimizer's all-reduce
    records them. Keras's step computes one gradient, of the whole batch, so a lone
    replica has no smaller batch to compare it with without this."""
    from keras.src import tree
    from keras.src.losses.loss import unscale_loss_for_distribution
    from keras.src.trainers.data_adapters.data_adapter_utils import unpack_x_y_sample_weight

    split = noise.split_batch
    factor = 1.0 if split else noise.big_batch / noise.small_batch  # to a mean gradient

    def train_step(data):
        x, y, sample_weight = unpack_x_y_sample_weight(data)
        with tf.GradientTape(persistent=split) as tape:
            y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
            loss = model._compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            rows = tf.shape(next(i for i in tree.flatten(x) if i is not None))[0]
            model._loss_tracker.update_state(
                unscale_loss_for_distribution(loss), sample_weight=rows
            )
            loss = model.optimizer.scale_loss(loss)
            if split:
                half = model.optimizer.scale_loss(
                    _first_half_loss(model, x, y, y_pred, sample_weight)
                )
        weights = model.trainable_weights
        gradients = tape.gradient(loss, weights)
        micro = half_gradients(tape.gradient(half, weights), gradients) if split else [gradients]
        noise.stage(micro, weights, factor, model.optimizer.scale_loss(1.0))
        model.optimizer.apply_gradients(zip(gradients, weights, strict=True))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return train_step


def _first_half_loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    """The model's loss (Keras's `compute_loss`) on the first half of a batch, from the
    whole batch's forward pass: the loss of a batch of half as many examples."""
    rows = tf.shape(tf.nest.flatten(y)[0])[0] // 2
    x, y, y_pred, sample_weight = first_rows((x, y, y_pred, sample_weight), rows)
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)


class NoiseRecording(keras.callbacks.Callback):
    """Records the gradient noise scale in `fit` as tfscale's loop records it: one
    execution (of `steps_per_execution` steps, as tfscale's graph call) in
    `noise.every_calls`, the first among them, runs `recording_train_step`; the others
    Keras's own step. Keras makes a train function of the model's `train_step` as it is
    then, so the recording one is made once, at the training's begin, beside fit's own."""

    def __init__(self, noise: Any):
        super().__init__()
        self.noise, self.calls = noise, itertools.count()
        self.functions: dict[bool, Any] = {}

    def on_train_begin(self, logs=None):
        model = self.model
        self.functions = {False: model.train_function}
        model.train_step = recording_train_step(model, self.noise)
        try:
            model.make_train_function(force=True)
            self.functions[True] = model.train_function
        finally:
            del model.train_step
        model.train_function = self.functions[False]

    def on_train_batch_begin(self, batch, logs=None):
        recording = next(self.calls) % self.noise.every_calls == 0
        self.model.train_function = self.functions[recording]

    def on_train_end(self, logs=None):
        self.model.train_function = self.functions[False]


class FirstStepClock(keras.callbacks.Callback):
    """The seconds of a `fit` call from its first step's start to its end: its steps
    alone, without the set-up of each call (its iterator over the input, its callbacks)."""

    def on_train_begin(self, logs=None):
        self.began = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.began is None:
            self.began = time.perf_counter()

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self.began
