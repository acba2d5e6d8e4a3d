"""The one training loop for every strategy: a custom loop around `strategy.run`.

Keras 3 `fit` fails under MultiWorkerMirrored and ParameterServer strategies, and the
optimizer's own gradient accumulation fails under Mirrored; this loop does neither.
It accumulates gradients over micro-batches inside each step, scales the loss under
mixed_float16, checkpoints every epoch and resumes from the last completed one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tfscale.tasks.core import class_weights
from tfscale.tasks.core.errors import UsageError, UserError
from tfscale.tasks.core.files import write_json_atomic
from tfscale.tasks.core.process import raise_if_stopped, stops_noted, use_precision
from tfscale.tasks.core.progress import status
from tfscale.tasks.data.inputs import Reading, build_dataset
from tfscale.tasks.data.manifest import Manifest
from tfscale.tasks.distribute.builders import cluster_spec_of, replicas_of
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.distribute.strategy import StrategyChoice, build_strategy
from tfscale.tasks.settings.config import TrainConfig
from tfscale.tasks.train import callbacks
from tfscale.tasks.train.evaluation import record_final
from tfscale.tasks.train.keras_meaning import attach, own_train_step
from tfscale.tasks.train.model_inputs import as_model_takes
from tfscale.tasks.train.models import model_for_data
from tfscale.tasks.train.noise_estimates import AdaptiveGain, static_gain
from tfscale.tasks.train.objectives import Built, Objective
from tfscale.tasks.train.optimizers import base_rate, compiled_optimizer, make_optimizer
from tfscale.tasks.train.optimizers import describe as describe_optimizer
from tfscale.tasks.train.result import TrainResult, examples_per_s
from tfscale.tasks.train.steps import GradientNoise, adam_of, make_warmup_schedule, replica_step
from tfscale.tasks.train.to_target import (
    Evaluation,
    HeldOut,
    TargetClock,
    interval_examples,
    target_of,
)
from tfscale.tasks.train.user_models import example_batch, example_labels, parameter_count

log = logging.getLogger(__name__)


def batch_sizes(cfg: TrainConfig, replicas: int) -> tuple[int, int]:
    """(per-replica, global) batch: weak scaling grows the global batch, strong keeps it."""
    if cfg.scaling == "weak":
        return cfg.per_replica_batch, cfg.per_replica_batch * replicas
    per_replica = max(cfg.per_replica_batch // replicas, 1)
    return per_replica, per_replica * replicas


@dataclass
class Trained:
    """What training leaves for the steps after it (measuring, in the same process): the
    strategy, model and optimizer it trained (`setup`) and its figures (`result`)."""

    setup: TrainingSetup
    result: TrainResult


def train_model(run: Run, *, resolver: Any = None) -> Trained:
    """Trains `run.train.model` on the manifest's train split under the run's strategy,
    resuming from its run directory's last checkpoint (mid-epoch when a preemption saved
    it there). Only the chief (`run.role`) writes the model and history.

    A preemptible role (a worker process's main thread) saves a checkpoint at the current
    step on every worker on SIGTERM and exits with `EXIT_PREEMPTED` (TensorFlow's
    `PreemptionCheckpointHandler`). `resolver` is an in-process cluster's, when there is one.
    Any other role notes a stop (`process.stops_noted`): one whose exception was swallowed
    on its way (a callback's `except BaseException`) ends the training at its next graph
    call all the same.
    """
    if run.role.preemptible:
        return _train(run, resolver)
    with stops_noted():
        return _train(run, resolver)


def _train(run: Run, resolver: Any) -> Trained:
    cfg, choice, run_dir, chief = run.train, run.choice, run.run_dir, run.role.chief
    timeout_s = run.config.cluster.collective_timeout_s
    setup = set_up_training(cfg, run.manifest, choice, resolver, timeout_s)
    if cfg.loop == "fit":
        return _train_with_fit(run, setup)
    step, manager = _restored(setup, run_dir, chief)
    resumed_step = int(step.numpy())
    preemption = _preemption_hook(setup.strategy, manager, step) if run.role.preemptible else None
    after_steps = _StepCounter(step, resumed_step, preemption)
    start_epoch, done_in_epoch = divmod(resumed_step, setup.steps)
    history = _read_history(run_dir)[:start_epoch]
    dataset_fn = train_dataset_fn(
        cfg, setup.manifest, run.data_dir, setup.per_replica * setup.accum_steps
    )
    clock = _target_clock(run, setup, resumed_step)
    watch = _watch(setup, choice, cfg, clock, _user_callbacks(run, setup))
    run_epoch = setup.epoch_runner(choice, dataset_fn)  # recording where `watch.noise` is set
    after_steps.on_call = _batch_hooks(watch.called, run_epoch, setup.steps)
    watch.called.train_begin()
    for epoch in range(start_epoch, cfg.epochs):
        steps = setup.steps - (done_in_epoch if epoch == start_epoch else 0)
        after_steps.epoch_ends_at = after_steps.count + steps
        watch.called.epoch_begin(epoch)
        history.append(
            _timed_epoch(run_epoch, epoch + 1, steps, setup.step_examples, after_steps, watch)
        )
        # the epoch's record before its checkpoint: a run killed between the two resumes from
        # the previous one, cutting the history to it (the other order lost the record)
        if chief:
            _write_json(run_dir / "evaluations.json", [asdict(e) for e in clock.evaluations])
            _write_json(run_dir / "history.json", history)
        manager.save(checkpoint_number=after_steps.count)
        after_steps.check_preemption()  # at an epoch's end: after its record is written
        stopped = watch.called.epoch_end(epoch, history[-1])  # by a callback of the model's
        if stopped or (cfg.stop_at_target and clock.reached):
            break
    watch.close()
    model_path = _saved(run, setup, manager)
    result = _result(setup, choice, run_dir, model_path, history, resumed_step)
    more = {"gradient_noise": watch.windows, "warmup_epochs": cfg.warmup_epochs}
    return Trained(setup, _with_held_out(result, clock, **more))


def _user_callbacks(run: Run, setup: TrainingSetup) -> callbacks.Called:
    """The callbacks the model's function gave (`tasks.train.callbacks`), over this
    training, with the held-out split's loss and score as `fit(validation_data=)` logs
    them where there is a held-out split."""
    given = callbacks.of(setup.model)
    held_out, score = None, setup.objective.label.score
    if given and run.manifest.splits.get("test", 0):
        batch = run.config.evaluate.batch_size
        loss = HeldOut(setup.built, setup.manifest, run.data_dir, batch, "loss")
        scored = HeldOut(setup.built, setup.manifest, run.data_dir, batch, score)
        held_out = lambda: (loss.accuracy(), scored.accuracy())  # noqa: E731
    params = {"verbose": 0, "epochs": run.train.epochs, "steps": setup.steps}  # as fit's
    return callbacks.Called(
        setup.model, setup.optimizer, params, held_out, score, setup.step_examples
    )


def _fit_callbacks(
    run: Run, setup: TrainingSetup, records: Any, watch: _Watch
) -> tuple[list[Any], Any]:
    """`fit`'s callbacks: the noise scale's recorder where it is on, the epochs' `records`,
    the callbacks the model's function gave; and the held-out batches `fit` evaluates each
    epoch for those (`validation_data`; None without them or a held-out split)."""
    from tfscale.tasks.train.fit_loop import NoiseRecording

    given = callbacks.of(setup.model)
    ours = [NoiseRecording(watch.noise)] if watch.noise is not None else []
    if not given or not run.manifest.splits.get("test", 0):
        return [*ours, records, *given], None
    from tfscale.tasks.data.inputs import build_dataset

    batch = run.config.evaluate.batch_size
    held_out = build_dataset(setup.manifest, run.data_dir, "test", batch, training=False)
    labels = setup.objective.keras_labels
    return [*ours, records, *given], held_out.map(lambda x, y: (x, labels(y)))


def _batch_hooks(called: callbacks.Called, run_epoch: Any, steps: int) -> Any:
    """What the step counter calls after each graph call (its steps' first and last
    count): the callbacks' batch hooks, where a callback has any and the runner reads
    its running sums (`steps.make_epoch_runner`); other runners', once a part."""
    running = getattr(run_epoch, "running", None)
    called.per_call = running is not None  # else once a part (`Called.epoch_part`)
    if not called.batch_hooks or running is None:
        return None
    return lambda first, last: called.batch(first % steps, (last - 1) % steps, running)


def _with_held_out(result: TrainResult, clock: TargetClock, **more: Any) -> TrainResult:
    """The result with its held-out evaluations and time to target (and `more`)."""
    return dataclasses.replace(
        result,
        to_target=clock.result().to_dict() if clock.on else {},
        evaluations=[asdict(e) for e in clock.evaluations],
        **more,
    )


def _train_with_fit(run: Run, setup: TrainingSetup) -> Trained:
    """Trains `run` with Keras's own `model.fit` (`tasks.train.fit_loop`): one call for
    every epoch, recorded and evaluated on the held-out clock as tfscale's loop records
    its own, checkpointed at each epoch's end in the same checkpoints, so that a stopped
    training goes on from its last finished epoch when run again (`initial_epoch`); the
    gradient noise scale recorded as tfscale's loop records it (`fit_loop.NoiseRecording`)."""
    from tfscale.tasks.train.fit_loop import EpochRecords, compiled_as_given, fit_epochs

    cfg, chief = run.train, run.role.chief
    step, manager = _restored(setup, run.run_dir, chief)
    start_epoch = int(step.numpy()) // setup.steps  # fit checkpoints at epochs' ends only
    resumed_step = start_epoch * setup.steps
    as_given = compiled_as_given(setup.model)
    dataset_fn = train_dataset_fn(cfg, setup.manifest, run.data_dir, setup.global_batch)
    clock = _target_clock(run, setup, resumed_step)

    def written(record: dict[str, float]) -> None:
        if chief:
            _write_json(run.run_dir / "evaluations.json", [asdict(e) for e in clock.evaluations])
            _write_json(run.run_dir / "history.json", records.history)
        # the epoch's checkpoint after its record, as tfscale's loop orders them
        step.assign(int(record["epoch"]) * setup.steps)
        manager.save(checkpoint_number=int(step.numpy()))

    def checked(loss: float, epoch: int, at: int) -> None:
        finite_loss(loss, epoch, at, setup.learning_rate)

    watch = _watch(setup, run.choice, cfg, clock, None)
    score = setup.objective.label.score
    records = EpochRecords(
        clock, setup.steps, setup.step_examples, cfg.stop_at_target, written, score, checked,
        watch.read_window,
    )  # fmt: skip
    records.history.extend(_read_history(run.run_dir)[:start_epoch])
    if not (cfg.stop_at_target and clock.reached):  # a run stopped at its target is done
        fit_epochs(setup, dataset_fn, cfg, _fit_callbacks(run, setup, records, watch), start_epoch)
    watch.close()
    as_given()
    model_path = _saved(run, setup, manager)
    result = _result(setup, run.choice, run.run_dir, model_path, records.history, resumed_step)
    more = {"gradient_noise": watch.windows, "warmup_epochs": cfg.warmup_epochs}
    return Trained(setup, _with_held_out(result, clock, loop="fit", **more))


def _watch(
    setup: TrainingSetup, choice: StrategyChoice, cfg: TrainConfig, clock: Any, called: Any
) -> _Watch:
    """What watches the epochs: the held-out `clock`, the gradient noise recorder where
    the step records it, AdaScale's gain where the rule adapts to it, and the model's
    callbacks (`called`)."""
    noise = _gradient_noise(setup, choice, cfg)
    gain = None
    if setup.lr_gain is not None and noise is not None:
        sqrt = setup.lr_scaling == "auto"  # Adam's: the square root of AdaScale's gain
        gain = AdaptiveGain(setup.lr_gain, setup.base_batch, setup.step_examples, sqrt)
    return _Watch(clock, noise, cfg.stop_at_target, gain, setup.learning_rate, called=called)


def _saved(run: Run, setup: TrainingSetup, manager: Any) -> Path:
    """The trained model's path: the chief saves it there (and records its final
    evaluation where the model evaluates outside the strategy); another worker removes
    its checkpoints."""
    model_path = run.run_dir / "model.keras"
    if run.role.chief:
        setup.model.save(model_path)
        if run.choice.spec.evaluated_after and run.manifest.splits.get("test", 0):
            record_final(
                setup.built,
                model_path,
                setup.manifest,
                run.data_dir,
                run.config.evaluate.batch_size,
            )
    elif manager is not None:
        shutil.rmtree(manager.directory, ignore_errors=True)
    return model_path


def _target_clock(run: Run, setup: TrainingSetup, resumed_step: int) -> TargetClock:
    """The held-out evaluations of this training (`tasks.train.to_target`), with those a
    resumed training recorded before its checkpoint."""
    evaluate = run.config.evaluate
    train_examples = run.manifest.splits["train"]
    every = interval_examples(evaluate.every_epochs, train_examples)
    has_test = run.manifest.splits.get("test", 0) > 0
    label = run.manifest.spec.label
    target = target_of(evaluate, label)
    held_out = (
        HeldOut(setup.built, setup.manifest, run.data_dir, evaluate.batch_size, target.metric)
        if every and has_test
        else None
    )
    path = run.run_dir / "evaluations.json"
    earlier = [Evaluation(**e) for e in json.loads(path.read_text())] if path.exists() else []
    earlier = [e for e in earlier if e.steps <= resumed_step]
    return TargetClock(
        held_out, target, every, setup.step_examples, train_examples, earlier, label.score
    )


def _restored(setup: TrainingSetup, run_dir: Path, chief: bool) -> tuple[Any, Any]:
    """The step counter and checkpoint manager of a training, restored from the run
    directory's last checkpoint when there is one (and said so on the console)."""
    with setup.strategy.scope():
        step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        checkpoint = tf.train.Checkpoint(model=setup.model, optimizer=setup.optimizer, step=step)
    manager = _checkpoint_manager(checkpoint, run_dir, setup.strategy, chief)
    latest = _latest_checkpoint(run_dir, manager)
    if latest:
        checkpoint.restore(latest)
        status("resuming", _resumed_from(latest, int(step.numpy()), setup.steps))
    return step, manager


class _StepCounter:
    """The `after_steps` hook of the training loop: counts completed steps into the
    checkpointed `step` (once per graph call, not per step), then checks for preemption,
    except after an epoch's last call: there the loop checks once the epoch is recorded."""

    def __init__(self, step: tf.Variable, count: int, check: Callable[[], None] | None):
        self.step, self.count, self.check = step, count, check
        self.epoch_ends_at = 0
        self.on_call: Callable[[int, int], None] | None = None  # (first, last) step counts

    def __call__(self, steps: int) -> None:
        raise_if_stopped()  # before the call is counted: its steps are the next run's
        self.count += steps
        self.step.assign(self.count)
        if self.on_call is not None:
            self.on_call(self.count - steps, self.count)
        if self.count < self.epoch_ends_at:
            self.check_preemption()

    def check_preemption(self) -> None:
        if self.check is not None:
            self.check()


def _preemption_hook(strategy: Any, manager: Any, step: Any) -> Callable[[], None] | None:
    """`save_checkpoint_if_preempted` of a PreemptionCheckpointHandler over the run's
    checkpoints, for strategies whose workers agree on a step (not ParameterServer) in the
    main thread (where signal handlers live); None elsewhere."""
    import sys
    import threading

    resolver = getattr(strategy, "cluster_resolver", None)
    if threading.current_thread() is not threading.main_thread():
        return None
    if resolver is not None and "ps" in resolver.cluster_spec().as_dict():
        return None
    from tfscale.tasks.distribute.cluster import EXIT_PREEMPTED

    def exit_preempted() -> None:
        print(
            f"preempted: checkpoint at step {int(step.numpy())} saved in {manager.directory}; "
            f"exiting {EXIT_PREEMPTED}",
            flush=True,
        )
        sys.exit(EXIT_PREEMPTED)

    config = tf.distribute.experimental.TerminationConfig(exit_fn=exit_preempted)
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        resolver, manager, termination_config=config
    )
    return handler.save_checkpoint_if_preempted


def train_dataset_fn(
    cfg: TrainConfig,
    manifest: Manifest,
    data_dir: str,
    batch: int,
    transform: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None,
) -> Callable[[tf.distribute.InputContext | None], tf.data.Dataset]:
    """The training input for each input pipeline (the strategy says which one it is),
    repeated, with each example's weight where the data has one (`(x, y, w)` batches);
    `transform` (a probe's slowed pipeline) applies before the repeat."""

    def dataset_fn(ctx: tf.distribute.InputContext | None) -> tf.data.Dataset:
        reading = Reading(
            pipelines=ctx.num_input_pipelines if ctx else 1,
            pipeline_id=ctx.input_pipeline_id if ctx else 0,
            seed=cfg.seed,
            cache=cfg.cache,
            shuffle_buffer=cfg.shuffle_buffer,
            weighted=True,
        )
        dataset = build_dataset(manifest, data_dir, "train", batch, True, reading)
        return (transform(dataset) if transform else dataset).repeat()

    return dataset_fn


@dataclass
class _Watch:
    """What a training watches besides its loss: the held-out split against the target
    (`clock`), the gradient noise scale's norms (`noise`, None when off; a window of them
    read at each evaluation, or each epoch's end without evaluations), and whether to stop
    at the target."""

    clock: TargetClock
    noise: GradientNoise | None
    stop_at_target: bool
    gain: AdaptiveGain | None = None  # an adaptive learning-rate rule's, fed each window
    learning_rate: float = 0.0  # the training's (named when its loss stops being a number)
    windows: list[dict[str, Any]] = field(default_factory=list)
    called: Any = None  # the user's callbacks (`callbacks.Called`), told of each part

    def read_window(self, step: int) -> None:
        """The noise scale's norms since the last window, to `step` (where it is recorded),
        and an adaptive rule's gain from them."""
        if self.noise is None:
            return
        window = {"end_step": step, **self.noise.read()}
        if self.gain is not None:
            window["lr_gain"] = self.gain.update(window)
        self.windows.append(window)

    def close(self) -> None:
        """The training ended: its callbacks told; later steps (the measuring rounds')
        plain, recording no noise scale."""
        if self.called is not None:
            self.called.train_end()
        if self.noise is not None:
            self.noise.optimizer.noise = None


def _gradient_noise(setup: TrainingSetup, choice: StrategyChoice, cfg: TrainConfig):
    """The gradient noise scale's recorder, set on the optimizer, where the config asks for
    it and the strategy's step is `replica_step` under `strategy.run` (not a parameter
    server's or a pipeline's)."""
    if not cfg.noise_scale or not choice.spec.records_noise:
        return None
    if own_train_step(setup.model):
        status(
            "noise scale",
            "not recorded: the model's own train_step computes its gradients, so tfscale "
            "sees no batch smaller than the all-reduced one",
        )
        return None
    adam = adam_of(setup.optimizer)
    noise = GradientNoise(
        setup.strategy, adam, setup.replicas, setup.per_replica, setup.accum_steps,
        setup.step_examples, cfg.noise_scale_every,
    )  # fmt: skip
    if not noise.on:
        return None
    adam.noise = noise
    return noise


def _timed_epoch(
    run_epoch,
    epoch: int,
    steps: int,
    step_examples: int,
    after_steps: _StepCounter,
    watch: _Watch,
) -> dict[str, float]:
    """One epoch of `steps` steps, cut where the held-out split is evaluated (`watch.clock`);
    its seconds are training's alone. With `watch.stop_at_target` it ends at the evaluation
    that reaches the target."""
    clock = watch.clock
    first = after_steps.count
    clock.start()
    loss = correct = seconds = 0.0
    done = 0
    evaluate_at = clock.cuts(first, first + steps)
    for cut in sorted({*evaluate_at, first + steps}):
        done_before = done
        started = time.perf_counter()
        part_loss, part_correct = run_epoch(cut - first - done, after_steps)
        seconds += time.perf_counter() - started
        loss, correct, done = loss + part_loss, correct + part_correct, cut - first
        finite_loss(part_loss, epoch, cut, watch.learning_rate)
        if watch.called is not None:
            watch.called.epoch_part(part_loss, part_correct, (first + done_before, cut))
        if cut in evaluate_at or not clock.on:
            watch.read_window(cut)
        if cut in evaluate_at:
            clock.evaluate(cut)
            if watch.stop_at_target and clock.reached:
                break
    examples = done * step_examples
    return clock.epoch_record(epoch, first, loss / done, correct / examples, seconds, examples)


def finite_loss(loss: float, epoch: int, step: int, learning_rate: float) -> None:
    """Stops a training whose loss is no longer a number (NaN or infinite, summed over the
    steps up to `step`): every step after it would train on weights that mean nothing, and
    its figures would be measured on them."""
    if math.isfinite(loss):
        return
    raise UserError(
        f"the training loss became {loss} in epoch {epoch}, by step {step}: the model's "
        "weights or outputs no longer hold finite numbers, so the training stopped there",
        f"lower the learning rate (--learning-rate; this training's was {learning_rate:.3g}), "
        "clip the gradients (clipnorm on the model's optimizer), or look for extreme values "
        "in the features",
    )


def _result(
    setup: TrainingSetup,
    choice: StrategyChoice,
    run_dir: Path,
    model_path: Path,
    history: list[dict[str, float]],
    resumed_step: int,
) -> TrainResult:
    """The run's figures (throughput: `examples_per_s`)."""
    return TrainResult(
        run_dir=str(run_dir),
        model_path=str(model_path),
        strategy=choice.kind,
        reason=choice.reason,
        replicas=setup.replicas,
        workers=setup.workers,
        precision=choice.precision,
        per_replica_batch=setup.per_replica,
        global_batch=setup.global_batch,
        grad_accum_steps=setup.accum_steps,
        learning_rate=setup.learning_rate,
        lr_scaling=setup.lr_scaling,
        steps_per_epoch=setup.steps,
        jit_compile=choice.jit_compile,
        history=history,
        examples_per_s=examples_per_s(history),
        train_seconds=sum(h["seconds"] for h in history),
        resumed_from_epoch=resumed_step // setup.steps,
        resumed_from_step=resumed_step,
        weights_digest=weights_digest(setup.model),
        model_parameters=parameter_count(setup.model),
        optimizer=describe_optimizer(setup.optimizer),
        class_weight=class_weights.shown(setup.objective.class_weights),
        sample_weight=setup.manifest.spec.weight or "none",
        **_stage_figures(setup),
    )


def _stage_figures(setup: TrainingSetup) -> dict[str, Any]:
    """A pipeline's stages, cut and bytes per device (none for other strategies)."""
    plan = getattr(setup.strategy, "plan", None)
    if plan is None:
        return {}
    from tfscale.tasks.train.stage_models import bytes_by_device

    placed = bytes_by_device([*setup.model.weights, *setup.optimizer.variables])
    return {
        "stages": len(setup.strategy.devices),
        "micro_batches": setup.strategy.micro_batches,
        "splits": setup.strategy.splits,
        "stage_plan": plan.to_dict(),
        "device_bytes": placed,
        "device_bytes_max": max(placed.values()),
    }


def weights_digest(model: keras.Model) -> str:
    """A hash of every weight's value: equal digests mean identical models."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(keras.ops.convert_to_numpy(weight.value).tobytes())
    return digest.hexdigest()[:16]


@dataclass
class TrainingSetup:
    """The strategy, model and optimizer of a run, with its batch arithmetic."""

    strategy: Any
    model: keras.Model
    optimizer: Any
    replicas: int  # from the built strategy, never from the config
    workers: int
    per_replica: int
    global_batch: int
    accum_steps: int
    step_examples: int
    steps: int
    learning_rate: float
    steps_per_call: int = 1
    lr_scaling: str = "none"  # the rule the rate follows (`learning_rate_rule`)
    lr_gain: Any = None  # an adaptive rule's gain variable (`noise_estimates.AdaptiveGain`)
    base_batch: int = 0  # the batch the base rate is for
    loop: str = "tfscale"  # `train.loop`: the epoch runner's, tfscale's or Keras's `fit`
    manifest: Any = None  # the run's, as the model takes its features (`as_model_takes`)
    objective: Objective | None = None  # what the model is trained for, built with it

    @property
    def built(self) -> Built:
        """The model and its objective, as the steps take them."""
        return Built(self.model, self.objective)

    def epoch_runner(self, choice: StrategyChoice, dataset_fn: Callable) -> Callable:
        """The strategy kind's epoch runner over `dataset_fn` (each replica's batches), or
        with `loop` fit, one of `fit` calls: `run(steps)` -> (loss, correct)."""
        if self.loop == "fit":
            from tfscale.tasks.train.fit_loop import make_fit_runner

            return make_fit_runner(self, dataset_fn)
        return choice.spec.epoch_runner(self, dataset_fn, choice.jit_compile)


def local_copy(cfg: TrainConfig, manifest: Manifest, accum_steps: int) -> Callable[..., Any]:
    """A copy of the run's model and its optimizer's kind outside any strategy (the default
    one: no replicas, no sync), as one training step on a batch, returning its loss: the
    step with no communication, which `tasks.measure.in_place` times beside the real one."""
    with tf.distribute.get_strategy().scope():
        built = model_for_data(cfg.model, manifest.spec)
        optimizer = make_optimizer(compiled_optimizer(built.model), 1e-3)
        optimizer.build(built.model.trainable_variables)

    def step(*batch: Any) -> Any:  # (features, labels), and weights where the data has them
        effective = int(batch[1].shape[0])
        return replica_step(built, optimizer, batch, accum_steps, effective)[0]

    return step


def set_up_training(
    cfg: TrainConfig,
    manifest: Manifest,
    choice: StrategyChoice,
    resolver: Any = None,
    collective_timeout_s: float = 60.0,
) -> TrainingSetup:
    """Sets the run's precision policy, then builds the strategy, a seeded model and its
    optimizer under the strategy's scope.

    The learning rate grows with the effective global batch as `train.lr_scaling` says
    (`learning_rate_rule`), reached after `cfg.warmup_epochs` of warm-up; under
    mixed_float16 the optimizer scales the loss.
    """
    use_precision(choice.precision)
    strategy = build_strategy(choice, resolver, collective_timeout_s)
    replicas, workers = replicas_of(choice.spec, strategy)
    if (replicas, workers) != (choice.replicas, choice.workers):
        log.info(
            "the strategy has %d replicas on %d workers (the hardware report expected %d on %d)",
            replicas, workers, choice.replicas, choice.workers,
        )  # fmt: skip
    per_replica, global_batch = batch_sizes(cfg, replicas)
    k = cfg.grad_accum_steps
    effective = global_batch * k
    step_examples = choice.spec.step_examples(per_replica, global_batch, k)
    steps = manifest.splits["train"] // step_examples
    if steps < 1:
        raise UsageError(
            f"train split has {manifest.splits['train']} examples, fewer than one global batch "
            f"of {step_examples}; lower --batch-size-per-replica or --grad-accum-steps."
        )
    base_batch = cfg.per_replica_batch * k  # the batch the base rate is for
    rule = learning_rate_rule(cfg, choice, effective / base_batch)
    (model, objective), optimizer, rate = _model_and_optimizer(
        cfg, manifest, choice, strategy, (base_batch, effective), rule, steps
    )
    return TrainingSetup(
        strategy, model, optimizer, replicas, workers, per_replica, global_batch, k,
        step_examples, steps, rate.value, cfg.steps_per_call, rate.rule, rate.gain, base_batch,
        cfg.loop, as_model_takes(manifest, model), objective,
    )  # fmt: skip


@dataclass(frozen=True)
class Rate:
    """The learning rate a training warms up to (`value`), the rule that scaled it, and
    an adaptive rule's gain variable (else None)."""

    rule: str
    adaptive: bool = False
    value: float = 0.0
    gain: Any = None


def learning_rate_rule(cfg: TrainConfig, choice: StrategyChoice, scale: float) -> Rate:
    """The rule `train.lr_scaling` comes to for a global batch `scale` times the base
    rate's, and whether it adapts to the noise scale as the training runs: AdaScale's rules
    need the noise scale recorded (`StrategyKind.records_noise`, `train.noise_scale`);
    without it adascale is linear and auto sqrt. At the base batch every rule is 1: `none`."""
    rule = cfg.lr_scaling
    if scale == 1:
        return Rate("none")
    if rule not in ("auto", "adascale"):
        return Rate(rule)
    if cfg.noise_scale and choice.spec.records_noise:
        return Rate(rule, adaptive=True)
    return Rate("linear" if rule == "adascale" else "sqrt")


def _model_and_optimizer(
    cfg: TrainConfig,
    manifest: Manifest,
    choice: StrategyChoice,
    strategy: Any,
    batches: tuple[int, int],
    rule: Rate,
    steps: int,
) -> tuple[Built, Any, Rate]:
    """A seeded model placed as the strategy wants it, with its objective, and its
    optimizer (the model's compiled one, else Adam: `tasks.train.optimizers`) warming up over
    `cfg.warmup_epochs` from the base rate to it scaled by `rule` for the effective batch
    against the base rate's batch (`batches`: the base rate's, the effective one), scaling
    the loss under mixed_float16, built in its scope; an adaptive rule's rate times a gain
    variable the noise scale sets. A compiled optimizer
    whose rate is a schedule keeps it: rule `none`."""
    base_batch, effective_batch = batches
    keras.utils.set_random_seed(cfg.seed)
    with strategy.scope():
        ps_tasks = len(cluster_spec_of(strategy).get("ps", []))
        made: list[Built] = []  # the objective built with the model the strategy places

        def build() -> keras.Model:
            made.append(model_for_data(cfg.model, manifest.spec, ps_tasks))
            return made[-1].model

        model = choice.spec.place_model(strategy, build, cfg.seed, effective_batch)
        callbacks.configured(model, cfg.callbacks)  # beside any the model's function gave
        callbacks.check(model, manifest, cfg)
        built = Built(model, _class_weighted(made[-1].objective, cfg))
        compiled = compiled_optimizer(model)
        base = base_rate(compiled, cfg.learning_rate)
        if base is None:  # the user's schedule, as it is
            optimizer = make_optimizer(compiled, None)
            rate = Rate("none", value=float(optimizer.learning_rate))
        else:
            gain = tf.Variable(1.0, trainable=False, name="lr_gain") if rule.adaptive else None
            value = base * static_gain(rule.rule, effective_batch / base_batch)
            schedule = make_warmup_schedule(base, value, cfg.warmup_epochs * steps, gain)
            if callbacks.of(model) and not callbacks.rate_setter(model, cfg):  # theirs to set
                schedule = value  # the same rate, as a number a callback may set
            optimizer = make_optimizer(compiled, schedule)
            rate = dataclasses.replace(rule, value=value, gain=gain)
        if choice.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
        spec = as_model_takes(manifest, model).spec
        attach(built, optimizer, example_batch(spec), example_labels(spec))
    return built, optimizer, rate


def _class_weighted(objective: Objective, cfg: TrainConfig) -> Objective:
    """The objective with the config's class weights (`train.class_weight`), which the
    run has made explicit (`distribute.run.Run`: `balanced` read off the data once)."""
    if cfg.class_weight == "none":
        return objective
    if class_weights.parsed(cfg.class_weight) == "balanced":
        raise ValueError("train.class_weight balanced is made explicit by the run (Run)")
    names = objective.label.class_names
    weights = class_weights.resolved(cfg.class_weight, objective.kind, names)
    return dataclasses.replace(objective, class_weights=weights)


def _checkpoint_manager(checkpoint, run_dir: Path, strategy, is_chief: bool):
    directory = run_dir / "checkpoints"
    if not is_chief:  # other workers must save too (collectives), but somewhere private
        task_id = strategy.cluster_resolver.task_id if strategy.cluster_resolver else 0
        directory = run_dir / f".worker-{task_id}-checkpoints"
    return tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=2)


def _latest_checkpoint(run_dir: Path, manager: Any) -> str | None:
    """Where every worker resumes from: the chief's latest checkpoint when this worker can
    see it (a shared run directory), else its own. Other workers delete theirs once they
    finish, so after a failure past that point only the chief's says where training got."""
    return tf.train.latest_checkpoint(str(run_dir / "checkpoints")) or manager.latest_checkpoint


def _resumed_from(checkpoint: str, step: int, steps_per_epoch: int) -> str:
    """Where a resumed training goes on, as its console line says it."""
    epoch, into = divmod(step, steps_per_epoch)
    where = (
        f"epoch {epoch + 1}, {into} of its {steps_per_epoch} steps done"
        if into
        else f"the start of epoch {epoch + 1}"
    )
    return f"from step {step} ({where}), checkpoint {checkpoint}"


def _read_history(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "history.json"
    return json.loads(path.read_text()) if path.exists() else []


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)  # the first epoch's record may come first
    write_json_atomic(path, value)
