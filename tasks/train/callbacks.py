"""The user's Keras callbacks, called by tfscale's loop as Keras's `fit` calls them.

A model's function gives them beside the model: `return model, [EarlyStopping(...), ...]`
(`tasks.train.user_models` keeps them, `of`). The training run calls `on_train_begin`, each
epoch's `on_epoch_begin` and `on_epoch_end` with Keras's logs (`loss`, the label kind's
score, and `val_loss` and `val_<score>` on the held-out split where there is one, as
`fit(validation_data=)` gives them), the batch hooks once per graph call of
`train.steps_per_call` steps (as Keras calls them once per execution of
`steps_per_execution`), and `on_train_end`; `model.stop_training` ends the training at
its epoch's end. A callback sees the model as `fit` gives it, its `optimizer` the one that
trains (`ReduceLROnPlateau` and `LearningRateScheduler` set its rate). Measuring rounds,
the autotune's and the diagnosis', never run them: `EarlyStopping` ends the training, not
the measurement.

Refused before measuring, with the reason (`refusal`): `BackupAndRestore`, whose work
tfscale's checkpoints do (a stopped training goes on from its last epoch when run again);
a rate-setting callback where tfscale's schedule sets the rate (a warm-up, or a rate that
adapts to the noise scale); a `monitor` tfscale does not log.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from tfscale.tasks.core.errors import UsageError, UserError
from tfscale.tasks.core.user_code import one_line

# the callbacks a model's function gave beside it, by model
_GIVEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def keep(model: Any, callbacks: Sequence[Any]) -> None:
    """Records the callbacks a model's function gave beside `model`."""
    _GIVEN[model] = tuple(callbacks)


def of(model: Any) -> tuple[Any, ...]:
    """The callbacks the model's function gave beside it (empty: none)."""
    return _GIVEN.get(model, ())


def split(made: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """`(model, callbacks)` where a model's function returned a model and a list of Keras
    callbacks, as `fit(callbacks=)` takes them; None where it returned anything else."""
    import keras

    if not isinstance(made, tuple | list) or len(made) != 2:
        return None
    model, callbacks = made
    if not isinstance(model, keras.Model) or not isinstance(callbacks, list | tuple):
        return None
    if not all(isinstance(c, keras.callbacks.Callback) for c in callbacks):
        return None
    return model, tuple(callbacks)


def logged_keys(score: str, held_out: bool) -> list[str]:
    """What tfscale's loop logs at an epoch's end: the loss and the label kind's score, and
    the same on the held-out split where there is one."""
    keys = ["loss", score]
    return keys + [f"val_{key}" for key in keys] if held_out else keys


def refusal(callbacks: Sequence[Any], keys: list[str], schedule: str) -> tuple[str, str] | None:
    """(what, fix) for the first callback tfscale cannot call as `fit` calls it, where
    tfscale's loop logs `keys` and `schedule` says what else sets the rate ('' for
    nothing); None where it can call them all."""
    import keras

    setters = (keras.callbacks.ReduceLROnPlateau, keras.callbacks.LearningRateScheduler)
    for callback in callbacks:
        name = type(callback).__name__
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            return (
                f"{name}: tfscale checkpoints every epoch itself, and a stopped training goes "
                "on from its last epoch when run again",
                "drop BackupAndRestore from the callbacks: tfscale's checkpoints do its work",
            )
        if isinstance(callback, setters) and schedule:
            return (
                f"{name} sets the learning rate, which {schedule} sets too",
                "train with --warmup-epochs 0 and --lr-scaling none, linear or sqrt, so that "
                f"the rate is {name}'s alone",
            )
        monitor = getattr(callback, "monitor", None)
        if isinstance(monitor, str) and monitor not in keys:
            return (
                f"{name} monitors {monitor!r}, which tfscale's loop does not log (it logs "
                f"{', '.join(keys)})",
                "monitor one of those, or train with --loop fit, which logs what fit logs",
            )
    return None


class AsFitSees:
    """The model as a callback sees it under `fit`: the model itself (its weights, `save`,
    `stop_training`), with the `optimizer` that trains it."""

    def __init__(self, model: Any, optimizer: Any):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "optimizer", optimizer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._model, name, value)


class Called:
    """The user's callbacks over one training run (`of` the model), called as `fit` calls
    them; every call does nothing where there are none."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        params: dict[str, Any],
        held_out: Any,
        score: str,
        step_examples: int,
    ):
        self.callbacks = of(model)
        self.model = model
        # the label kind's score (its logs' key) and the examples of a step
        self.score, self.step_examples = score, step_examples
        self.steps = params["steps"]
        self.per_call = True  # the batch hooks called after each graph call (`batch`)
        self.held_out = held_out  # (loss, score) on the held-out split, or None
        self.batch_hooks = any(_overrides(c, _BATCH_HOOKS) for c in self.callbacks)
        seen = AsFitSees(model, optimizer)
        for callback in self.callbacks:
            callback.set_model(seen)
            callback.set_params(params)
        self.logs: dict[str, float] = {}
        self._done = (0.0, 0.0)  # the epoch's earlier parts: the loss and score sums

    def train_begin(self) -> None:
        self.model.stop_training = False
        self._each("on_train_begin")

    def epoch_begin(self, epoch: int) -> None:
        self._done = (0.0, 0.0)
        self._each("on_epoch_begin", epoch)

    def epoch_part(self, loss: float, correct: float, counts: tuple[int, int]) -> None:
        """A part of the epoch ran (its loss summed over its steps, its examples' scores
        summed; the step counts before and after it): the running logs go on from it. A
        runner that cannot be read between its graph calls (`per_call` false: a parameter
        server's coordinator) has the batch hooks called here, once for the part."""
        self._done = (self._done[0] + loss, self._done[1] + correct)
        if not self.per_call:
            first, last = counts
            self.batch(first % self.steps, (last - 1) % self.steps, lambda: (0.0, 0.0))

    def batch(self, begin: int, end: int, running: Any) -> None:
        """The batch hooks of steps `begin`..`end` of the epoch (0-based), one graph call,
        with the epoch's running mean loss and score so far, as `fit` logs them: its
        earlier parts' sums and this part's (`running()`: the loss and score sums)."""
        if not self.batch_hooks:
            return
        self._each("on_train_batch_begin", begin)
        part_loss, part_correct = running()
        done = end + 1
        logs = {
            "loss": (self._done[0] + part_loss) / done,
            self.score: (self._done[1] + part_correct) / (done * self.step_examples),
        }
        self._each("on_train_batch_end", end, logs)

    def epoch_end(self, epoch: int, record: dict[str, float]) -> bool:
        """`on_epoch_end` with the epoch's logs; whether a callback stopped the training."""
        if not self.callbacks:
            return False
        logs = {"loss": record["loss"], self.score: record[self.score]}
        if self.held_out is not None:
            loss, value = self.held_out()
            logs.update({"val_loss": loss, f"val_{self.score}": value})
        self.logs = logs
        self._each("on_epoch_end", epoch, logs)
        return bool(getattr(self.model, "stop_training", False))

    def train_end(self) -> None:
        self._each("on_train_end", self.logs or None)

    def _each(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            try:
                getattr(callback, hook)(*args)
            except Exception as exc:  # noqa: BLE001 - the user's callback: whatever it raises
                raise CallbackRaised(
                    f"the model's callback {type(callback).__name__} raised "
                    f"{type(exc).__name__} in {hook}: {one_line(exc)}",
                    "fix the callback, or drop it (run again with --debug for the traceback)",
                ) from exc


class CallbackRaised(UserError):
    """A callback the model's function gave raised: the user's error, in one line."""


class CallbackRefused(UsageError):
    """A callback tfscale cannot call as `fit` calls it (`refusal`), or `train.callbacks`
    naming no function that gives callbacks."""


def configured(model: Any, ref: str) -> None:
    """Keeps the callbacks `train.callbacks` names (`package.module:function` or
    `path/to/file.py:function`, called with nothing) beside `model`, after any its own
    function gave; nothing where `ref` is empty.

    Raises:
        CallbackRefused: `ref` is no function reference, or the function gives no list of
            Keras callbacks.
        CallbackRaised: the function raised, or exited.
    """
    if not ref:
        return
    import keras

    from tfscale.tasks.core.user_code import FUNCTION, called, load_function

    if FUNCTION.fullmatch(ref) is None:
        raise CallbackRefused(
            f"train.callbacks {ref!r}: expected package.module:function or "
            "path/to/file.py:function",
            "name the function that returns the callbacks (--callbacks)",
        )
    function, _ = load_function(ref, "callbacks", CallbackRefused)
    made = called(function, (), f"--callbacks {ref}", "list of callbacks", CallbackRaised)
    if not isinstance(made, list | tuple) or not all(
        isinstance(c, keras.callbacks.Callback) for c in made
    ):
        raise CallbackRefused(
            f"--callbacks {ref} returned {type(made).__name__}, not a list of Keras callbacks",
            "return them as fit(callbacks=) takes them: [keras.callbacks.EarlyStopping(), ...]",
        )
    keep(model, (*of(model), *made))


def refused(model: Any, manifest: Any, train: Any) -> tuple[str, str] | None:
    """(what, fix) for the first callback kept beside `model` that the training (`train`:
    its `TrainConfig`, on data whose held-out split `manifest` says) cannot call as `fit`
    calls it (`refusal`); None where it can call them all."""
    given = of(model)
    if not given:
        return None
    held_out = manifest.splits.get("test", 0) > 0
    keys = logged_keys(manifest.spec.label.score, held_out)
    if train.loop == "fit":  # fit logs what it logs; tfscale's checkpoints still resume
        keys = [getattr(c, "monitor", "") for c in given]
    return refusal(given, keys, rate_setter(model, train))


def check(model: Any, manifest: Any, train: Any) -> None:
    """Raises:
    CallbackRefused: a callback kept beside `model` the training cannot call as `fit`
        calls it (`refused`), with the reason."""
    found = refused(model, manifest, train)
    if found is not None:
        raise CallbackRefused(f"the training's callback {found[0]}", found[1])


def rate_setter(model: Any, train: Any) -> str:
    """What sets the learning rate of `model`'s training besides a callback: its own
    schedule, tfscale's warm-up, or a rule that adapts it to the noise scale ('' for
    nothing: the rate is a number a callback may set)."""
    from tfscale.tasks.train.optimizers import base_rate, compiled_optimizer

    if base_rate(compiled_optimizer(model), train.learning_rate) is None:
        return "the model's own learning-rate schedule"
    if train.warmup_epochs > 0:
        return f"tfscale's warm-up over {train.warmup_epochs} epoch(s) (--warmup-epochs)"
    if train.lr_scaling in ("auto", "adascale") and train.noise_scale:
        return f"--lr-scaling {train.lr_scaling}, adapting it to the gradient noise scale,"
    return ""


def _overrides(callback: Any, hooks: Sequence[str]) -> bool:
    """Whether a callback does anything in `hooks`: a method of its class's own, or one
    given as it was made (`LambdaCallback`'s)."""
    import keras

    base = keras.callbacks.Callback
    return any(
        getattr(getattr(callback, hook), "__func__", None) is not getattr(base, hook)
        for hook in hooks
    )
