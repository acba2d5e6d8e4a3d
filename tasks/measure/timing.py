"""Timing primitives every probe shares: seconds per call of a traced function with its
work waited for, examples/s, an input pipeline alone, and all-reduces over a strategy's
replicas at the sizes of a model's gradients."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

SUM = tf.distribute.ReduceOp.SUM


def seconds_per_call(call: Callable[[], object], calls: int) -> float:
    """Wall seconds per call of `call` after two warm-up calls (tracing); what `call`
    returns is read back (`.numpy()`), so the time includes the work, not its dispatch."""
    for _ in range(2):
        _wait(call())
    started = time.perf_counter()
    for _ in range(calls):
        result = call()
    _wait(result)
    return (time.perf_counter() - started) / calls


def _wait(value: object) -> None:
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, value)


READS_PER_CALL = 10


def input_only_rate(dataset: tf.data.Dataset, batch: int, steps: int) -> float:
    """Examples/s of `dataset` alone, `steps` batches of `batch` after two warm-up calls.

    The batches are read in a graph, `READS_PER_CALL` a call, as a training's steps read
    them: read one at a time from Python, each tensor of a batch costs a round trip, which
    a training never pays (a 32-column table's batches read 86,000 examples/s that way
    against 95,000 in a graph)."""
    iterator = iter(dataset)

    @tf.function
    def read(n):
        rows = tf.constant(0)
        for _ in tf.range(n):
            rows += tf.shape(tf.nest.flatten(next(iterator))[-1])[0]
        return rows

    calls = max(steps // READS_PER_CALL, 1)
    n = tf.constant(READS_PER_CALL)
    return batch * READS_PER_CALL / seconds_per_call(lambda: read(n), calls)


def all_reduce_seconds(strategy: Any, variables: list, per_call: int, calls: int) -> float:
    """Seconds per all-reduce of tensors shaped as the gradients, across every replica."""
    shapes = [(v.shape, v.dtype) for v in variables]

    def reduce_once():
        ctx = tf.distribute.get_replica_context()
        reduced = ctx.all_reduce(SUM, [tf.zeros(shape, dtype) for shape, dtype in shapes])
        return tf.add_n([tf.reduce_sum(tf.cast(r, tf.float32)) for r in reduced])

    @tf.function
    def reduce_calls():
        total = [strategy.run(reduce_once) for _ in range(per_call)]  # unrolled: each one runs
        return [strategy.experimental_local_results(t)[0] for t in total]

    # the best of three blocks, as for the step: a collective is sensitive to a busy core
    return min(seconds_per_call(reduce_calls, calls) for _ in range(3)) / per_call


def gradient_bytes(model: keras.Model) -> int:
    """Bytes of the model's gradients: one per trainable variable, of its dtype."""
    return int(
        sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.trainable_variables)
    )


def all_reduce_by_size(
    strategy: Any, grad_bytes: int, per_call: int, calls: int
) -> list[list[float]]:
    """[bytes, seconds per all-reduce] of one float32 message at a quarter, one and four
    times the gradients' bytes: the points a latency and bandwidth are fitted to."""
    points = []
    for scale in (0.25, 1.0, 4.0):
        elements = max(int(grad_bytes * scale) // 4, 1)
        seconds = all_reduce_seconds(strategy, [_Shape((elements,), "float32")], per_call, calls)
        points.append([float(elements * 4), seconds])
    return points


@dataclass(frozen=True)
class _Shape:
    """A tensor's shape and dtype, as a variable gives them."""

    shape: tuple[int, ...]
    dtype: str
