"""Running the diagnosis probes: input-only, compute-only and end-to-end throughput on the
same model, batch and devices as a run."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tasks.config import TrainConfig
from tasks.manifest import Manifest
from tasks.strategy import StrategyChoice
from tasks.timing import all_reduce_by_size, gradient_bytes, input_only_rate, measure_rate
from tasks.training import set_up_training, train_dataset_fn

Transform = Callable[[tf.data.Dataset], tf.data.Dataset]


def probe_rates(
    cfg: TrainConfig,
    manifest: Manifest,
    data_dir: str,
    choice: StrategyChoice,
    steps: int,
    transform: Transform | None,
    compute_only: bool = False,
    comm_sizes: bool = False,
) -> dict:
    """Examples/s compute-only (`compute`, and `step_s`), end to end (`e2e`) and input-only
    (`input`) of `cfg` under `choice`; with `comm_sizes`, also the model's `gradient_bytes`
    and its replicas' all-reduce at a few message sizes (`comm_s_by_bytes`, for the
    forecast's cost model)."""
    setup = set_up_training(cfg, manifest, choice)
    batch = setup.per_replica * setup.accum_steps

    pipeline = train_dataset_fn(cfg, manifest, data_dir, batch, transform)

    def one_batch(ctx: tf.distribute.InputContext | None) -> tf.data.Dataset:
        return pipeline(ctx).take(1).cache().repeat()

    # a probe call runs steps as training does: `steps_per_call` per graph call
    per_call = min(setup.steps_per_call, max(steps // 3, 1))
    call_examples = setup.step_examples * per_call

    def runner(dataset_fn):
        run_epoch = setup.epoch_runner(choice, dataset_fn)
        return lambda: run_epoch(per_call)

    compute_step = runner(one_batch)
    # compute-only is the ceiling the devices allow: the best of three blocks, so a slow
    # spell on a shared machine does not pull it (and the step time) off
    block_calls = max(steps // (3 * per_call), 1)
    compute = max(measure_rate(compute_step, call_examples, block_calls) for _ in range(3))
    rates = {"compute": compute, "step_s": setup.step_examples / compute}
    if not compute_only:
        rates["e2e"] = measure_rate(runner(pipeline), call_examples, max(steps // per_call, 1))
        rates["input"] = input_only_rate(
            pipeline(None), batch, steps * setup.strategy.num_replicas_in_sync
        )
    if comm_sizes:
        rates["gradient_bytes"] = gradient_bytes(setup.model)
        rates["comm_s_by_bytes"] = all_reduce_by_size(
            setup.strategy, rates["gradient_bytes"], per_call, block_calls
        )
    return rates
