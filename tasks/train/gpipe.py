"""Pipeline parallelism, the step: GPipe's schedule. Each step splits the batch into M
micro-batches and runs stage s of micro-batch m under stage s's device (`pipeline_step`);
TensorFlow's executor runs an op as soon as its inputs are ready, so stage s of micro-batch
m+1 overlaps stage s+1 of micro-batch m. Backward runs stage by stage from the last, the
gradients of every micro-batch are summed, and one update is applied: the same update one
device makes on the whole batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfscale.tasks.train.objectives import Objective
from tfscale.tasks.train.stage_models import StagedDevices, stage_models


def pipeline_step(
    stages: list[Any],
    devices: list[str],
    optimizer: Any,
    micro_batches: int,
    effective_batch: int,
    objective: Objective,
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """`step(images, labels) -> (loss, correct)`: one update from `micro_batches`
    micro-batches run through the stages (GPipe: every forward, then every backward), for
    use inside a `tf.function`."""
    import keras
    import tensorflow as tf

    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def loss_of(labels: Any, logits: Any) -> tuple[Any, Any]:
        """The micro-batch's share of the batch's loss, and what the optimizer takes."""
        per_example = objective.loss(labels, logits)
        weights = objective.sample_weights(labels)  # class weights, as fit applies them
        if weights is not None:
            per_example = per_example * weights
        loss = tf.reduce_sum(per_example) / effective_batch
        return loss, optimizer.scale_loss(loss) if scaled else loss

    def step(images, labels):
        kept = []  # per micro-batch: each stage's (tape, its input, its output)
        total_loss, correct = 0.0, 0.0
        for x, y in zip(
            tf.split(images, micro_batches), tf.split(labels, micro_batches), strict=True
        ):
            records, logits, loss = _forward(stages, devices, x, lambda out, y=y: loss_of(y, out))
            kept.append(records)
            total_loss += loss
            correct += tf.reduce_sum(objective.score(y, logits))
        sums = _backward(stages, devices, kept)
        variables = [v for stage in stages for v in stage.trainable_variables]
        optimizer.apply([g for part in sums for g in part], variables)
        return total_loss, correct

    return step


def _forward(
    stages: list[Any], devices: list[str], x: Any, loss_of: Callable[[Any], tuple[Any, Any]]
) -> tuple[list[tuple], Any, Any]:
    """One micro-batch through every stage, each under its device and taped: each stage's
    (tape, its input, its output; the last stage's output is the loss the optimizer takes),
    the logits, and the loss."""
    import tensorflow as tf

    records, last = [], len(stages) - 1
    for s, stage in enumerate(stages):
        with tf.device(devices[s]):
            x = tf.identity(x)  # the activation moves to this stage's device
            with tf.GradientTape() as tape:
                if x.dtype.is_floating:  # the first stage's input may be uint8 images
                    tape.watch(x)
                out = stage(x, training=True)
                if s == last:
                    loss, target = loss_of(out)
        records.append((tape, x, target if s == last else out))
        x = out
    return records, out, loss


def _backward(stages: list[Any], devices: list[str], kept: list[list[tuple]]) -> list[list[Any]]:
    """Each stage's gradients, summed over the micro-batches: backward stage by stage from
    the last, each under its device, the input's gradient handed upstream."""
    import tensorflow as tf

    sums: list[list[Any] | None] = [None] * len(stages)
    for records in reversed(kept):
        upstream = None
        for s in reversed(range(len(stages))):
            tape, x_in, out = records[s]
            variables = stages[s].trainable_variables
            with tf.device(devices[s]):
                grads = tape.gradient(out, [x_in, *variables], output_gradients=upstream)
            upstream = grads[0]
            sums[s] = (
                grads[1:]
                if sums[s] is None
                else [a + b for a, b in zip(sums[s], grads[1:], strict=True)]
            )
    return sums


def make_pipeline_epoch_runner(
    setup: Any,
    dataset_fn: Callable,
    jit_compile: bool = False,  # refused for this strategy by `select_strategy`
) -> Callable[..., tuple[float, float]]:
    """An epoch runner for a pipeline over a run's `setup` (as `make_epoch_runner`'s, its
    strategy the `StagedDevices`): up to its steps a call per graph call, each
    `pipeline_step` over `micro_batches x accum_steps` micro-batches."""
    import tensorflow as tf

    from tfscale.tasks.train.steps import run_in_calls

    strategy: StagedDevices = setup.strategy
    optimizer, accum_steps, effective_batch = (
        setup.optimizer,
        setup.accum_steps,
        setup.step_examples,
    )
    model, objective = setup.built
    stages = stage_models(model, strategy.plan)
    iterator = iter(dataset_fn(None))
    # a column split places its own parts' ops; a pipeline places each stage
    devices = strategy.devices if strategy.splits == "stages" else [None]
    step = pipeline_step(
        stages,
        devices,
        optimizer,
        strategy.micro_batches * accum_steps,
        effective_batch,
        objective,
    )
    sums = [tf.Variable(0.0, trainable=False) for _ in range(2)]

    @tf.function
    def train_steps(n):
        for _ in tf.range(n):
            images, labels = next(iterator)
            loss, correct = step(images, labels)
            sums[0].assign_add(loss)
            sums[1].assign_add(correct)

    def run_epoch(steps: int, after_steps: Callable[[int], None] = lambda n: None):
        for total in sums:
            total.assign(0.0)
        run_in_calls(train_steps, steps, setup.steps_per_call, after_steps)
        return float(sums[0].numpy()), float(sums[1].numpy())

    return run_epoch
