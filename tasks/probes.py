"""Running the diagnosis probes: input-only, compute-only and end-to-end throughput on the
same model, batch and devices as a run."""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

from tasks.config import TrainConfig
from tasks.diagnosis import Diagnosis, classify, input_only_rate, measure_rate, recommend
from tasks.inputs import build_dataset
from tasks.manifest import Manifest
from tasks.steps import make_step
from tasks.strategy import StrategyChoice, baseline_choice
from tasks.training import build_training

IN_PROCESS = ("one_device", "mirrored", "tpu")
Transform = Callable[[tf.data.Dataset], tf.data.Dataset]


def diagnose_run(
    cfg: TrainConfig,
    manifest: Manifest,
    data_dir: str,
    choice: StrategyChoice,
    cpu_flags: list[str],
    end_to_end: float | None = None,
    steps: int = 30,
    input_transform: Transform | None = None,
) -> Diagnosis:
    """Measures the three throughputs and classifies the run.

    Strategies that run out of process (multi_worker, parameter_server) are probed on one
    device here; their end-to-end rate comes from the run (`end_to_end`) and is compared
    with the ideal, N times the single-replica compute-only rate.
    """
    started = time.perf_counter()
    probe_choice = choice if choice.kind in IN_PROCESS else baseline_choice(choice)
    rates = _probe(cfg, manifest, data_dir, probe_choice, steps, input_transform)
    compute_1 = None
    if probe_choice.replicas > 1:
        compute_1 = _probe(
            cfg,
            manifest,
            data_dir,
            baseline_choice(choice),
            steps,
            input_transform,
            compute_only=True,
        )["compute"]
    if choice.kind not in IN_PROCESS:
        compute_1 = rates["compute"]
        rates["compute"] *= choice.replicas  # ideal scaling of the single-replica step
        rates["input"] *= choice.replicas  # each worker has its own input pipeline
        rates["e2e"] = end_to_end or rates["e2e"]
    bottleneck, evidence = classify(
        rates["input"], rates["compute"], rates["e2e"], rates["step_s"], choice.replicas, compute_1
    )
    return Diagnosis(
        bottleneck=bottleneck,
        input_examples_per_s=rates["input"],
        compute_examples_per_s=rates["compute"],
        end_to_end_examples_per_s=rates["e2e"],
        compute_1_replica_examples_per_s=compute_1,
        replicas=choice.replicas,
        step_seconds=rates["step_s"],
        evidence=evidence,
        advice=recommend(bottleneck, cfg, manifest, choice, cpu_flags),
        seconds=time.perf_counter() - started,
    )


def _probe(
    cfg: TrainConfig,
    manifest: Manifest,
    data_dir: str,
    choice: StrategyChoice,
    steps: int,
    transform: Transform | None,
    compute_only: bool = False,
) -> dict:
    setup = build_training(cfg, manifest, choice)
    batch = setup.per_replica * setup.accum_steps

    def pipeline(ctx: tf.distribute.InputContext | None) -> tf.data.Dataset:
        ds = build_dataset(
            manifest,
            data_dir,
            "train",
            batch,
            training=True,
            num_pipelines=ctx.num_input_pipelines if ctx else 1,
            pipeline_id=ctx.input_pipeline_id if ctx else 0,
            seed=cfg.seed,
            cache=cfg.cache,
            shuffle_buffer=cfg.shuffle_buffer,
        )
        return (transform(ds) if transform else ds).repeat()

    def one_batch(ctx: tf.distribute.InputContext | None) -> tf.data.Dataset:
        return pipeline(ctx).take(1).cache().repeat()

    def runner(dataset_fn):
        run_epoch = make_step(
            setup.strategy,
            setup.model,
            setup.optimizer,
            dataset_fn,
            setup.accum_steps,
            setup.step_examples,
        )
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
