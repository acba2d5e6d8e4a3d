"""Every use of a library's private internals, in one place, each with the version it was
written against (`WRITTEN_FOR`). `tests/core/test_internals.py` checks each one's behaviour on
the installed versions, so an upgrade that changes it fails there, not in a training run.

Other places subclass or read a library's private names, each where the behaviour it changes
lives and each covered by its own test: Keras's optimizer hooks in `tasks/train/steps.py`
(`_all_reduce_sum_gradients`, the one place a replica's gradient and the all-reduced one
both exist; Adam's `_momentums`, `_velocities` and `_get_variable_index`); Keras's own
TensorFlow `train_step`, written out in `tasks/train/fit_loop.py` (`recording_train_step`:
`_compute_loss`, `_loss_tracker`, `_call_has_training_arg`, `unscale_loss_for_distribution`,
`unpack_x_y_sample_weight`: the noise scale's half batch under `--loop fit`); a compiled
optimizer's `_learning_rate` (`tasks/train/optimizers.py`: a schedule, which the public
`learning_rate` evaluates); Keras's `compile_utils.get_metric` (`tasks/train/objectives.py`:
a compiled metric by name, `accuracy` resolved by the shapes as `compile` resolves it); a
compiled loss wrapper's `_fn_kwargs` (`tasks/train/user_models.py`: `from_logits`); a
`keras.Sequential`'s `_functional` graph (`tasks/train/stage_plan.py`: its operations in
order); and the MLflow server's store in `tasks/track/ui.py` (`_get_tracking_store`, read
for the runs table's saved views).
"""

from __future__ import annotations

from typing import Any

WRITTEN_FOR = {"tensorflow": "2.21.0", "python": "3.11"}
_MARK = "tfscale_no_autotune"


def device_datasets_without_autotune() -> None:
    """Turns tf.data's autotuning off for the per-device datasets of every distributed
    iterator in this process (idempotent).

    `MultiDeviceIterator` builds each device's dataset with default options in
    `multi_device_iterator_ops._create_device_dataset` (TensorFlow 2.21), so each runs
    tf.data's autotuning thread, which sleeps for a period that doubles up to 60 s; deleting
    the iterator waits for that sleep to end (measured 14-38 s after a one-minute training).
    The function has no public option, so it is wrapped here.
    """
    import tensorflow as tf
    from tensorflow.python.data.ops import multi_device_iterator_ops as ops

    create = ops._create_device_dataset
    if getattr(create, _MARK, False):
        return

    def create_without_autotune(*args: Any, **kwargs: Any) -> Any:
        options = tf.data.Options()
        options.autotune.enabled = False
        return create(*args, **kwargs).with_options(options)

    setattr(create_without_autotune, _MARK, True)
    ops._create_device_dataset = create_without_autotune


def run_exit_handlers() -> None:
    """Runs (and clears) the `atexit` handlers now, as interpreter exit would (CPython 3.11:
    `atexit._run_exitfuncs`), for a process that then ends with `os._exit`."""
    import atexit

    atexit._run_exitfuncs()


def wait_for_cluster_tasks(barrier: str, timeout_s: float) -> None:
    """Blocks until every task of this process's collective cluster reaches `barrier`:
    the coordination service's barrier that MultiWorkerMirroredStrategy sets up
    (`context.wait_at_barrier`, TensorFlow 2.21, private). Raises when a task is lost or
    `timeout_s` passes first, or when this process has no coordination service."""
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(barrier, int(timeout_s * 1000))


def input_pipelines_of(strategy: Any) -> int:
    """How many input pipelines (worker processes) a strategy reads with: the
    `extended._num_workers` of the multi-worker strategies (TensorFlow 2.21), 1 otherwise."""
    return getattr(strategy.extended, "_num_workers", 1)


def cluster_resolver_of(strategy: Any) -> Any:
    """A strategy's cluster resolver, or None: `cluster_resolver` where the strategy exposes
    it, and ParameterServerStrategy's private `_cluster_resolver` (TensorFlow 2.21), which
    it keeps without exposing."""
    return getattr(strategy, "cluster_resolver", None) or getattr(
        strategy, "_cluster_resolver", None
    )
