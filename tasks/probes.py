"""Running the diagnosis probes: input-only, compute-only and end-to-end throughput on the
same model, batch and devices as a run."""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

from tasks.config import TrainConfig
from tasks.manifest import Manifest
from tasks.strategy import StrategyChoice
from tasks.training import set_up_training, train_dataset_fn

Transform = Callable[[tf.data.Dataset], tf.data.Dataset]


def measure_rate(step: Callable[[], object], examples_per_step: int, steps: int) -> float:
    """Examples/s of `step` after two warm-up calls (tracing)."""
    for _ in range(2):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        result = step()
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)  # sync
    return examples_per_step * steps / (time.perf_counter() - started)


def input_only_rate(dataset: tf.data.Dataset, batch: int, steps: int) -> float:
    iterator = iter(dataset)
    return measure_rate(lambda: next(iterator)[1], batch, steps)


def probe_rates(
    cfg: TrainConfig,
    manifest: Manifest,
    data_dir: str,
    choice: StrategyChoice,
    steps: int,
    transform: Transform | None,
    compute_only: bool = False,
) -> dict:
    setup = set_up_training(cfg, manifest, choice)
    batch = setup.per_replica * setup.accum_steps

    pipeline = train_dataset_fn(cfg, manifest, data_dir, batch, transform)

    def one_batch(ctx: tf.distribute.InputContext | None) -> tf.data.Dataset:
        return pipeline(ctx).take(1).cache().repeat()

    def runner(dataset_fn):
        run_epoch = setup.epoch_runner(choice, dataset_fn)
        return lambda: run_epoch(1)

    compute_step = runner(one_batch)
    # compute-only is the ceiling the devices allow: the best of three blocks, so a slow
    # spell on a shared machine does not pull it (and the step time) off
    compute = max(
        measure_rate(compute_step, setup.step_examples, max(steps // 3, 1)) for _ in range(3)
    )
    rates = {"compute": compute, "step_s": setup.step_examples / compute}
    if not compute_only:
        rates["e2e"] = measure_rate(runner(pipeline), setup.step_examples, steps)
        rates["input"] = input_only_rate(
            pipeline(None), batch, steps * setup.strategy.num_replicas_in_sync
        )
    return rates
