"""Measuring a run in this process: every configuration its figures need, timed in one
set of alternating rounds (`tasks.measure.rounds`), so the speedup, its split and the bottleneck
all come from the same moments of the machine.

Per round, each a block of up to `steps` training steps (or input batches), sized in the
warm-up round to last about `rounds.BLOCK_SECONDS`:

- `end_to_end` and `compute`: the run's own strategy, fed by the real input pipeline and
  by one cached batch;
- `input`: the run's input pipeline alone;
- with several replicas, one device at the per-replica batch and at the global batch
  (`one_device_replica_batch`, `one_device_global_batch`), each end to end and compute-only
  (`..._compute`): the speedup's baseline is the first under weak scaling and the second
  under strong; the other splits a weak-scaling speedup into the batch's part and the
  devices' part.

Every figure is examples/s, one value per timed round (the warm-up round is left out).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import tensorflow as tf

from tfscale.tasks.core.machine_load import Interference, LoadWatch
from tfscale.tasks.core.progress import RoundsProgress
from tfscale.tasks.data.manifest import Manifest
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.distribute.strategy import StrategyChoice, baseline_choice
from tfscale.tasks.measure import autotune
from tfscale.tasks.measure.autotune import Candidate, Timed
from tfscale.tasks.measure.rounds import (
    MIN_BLOCK_STEPS,
    Settling,
    Spread,
    alternate,
    block_steps,
    half_width,
    ratio,
    ratio_95,
    ratio_interval,
)
from tfscale.tasks.measure.timing import all_reduce_by_size, gradient_bytes
from tfscale.tasks.settings.config import TrainConfig
from tfscale.tasks.train.training import (
    TrainingSetup,
    batch_sizes,
    set_up_training,
    train_dataset_fn,
)

Transform = Callable[[tf.data.Dataset], tf.data.Dataset]
# timed rounds (after one warm-up round): in three sets of five default runs, the medians of
# all 11 rounds spread 1.107, 1.201 and 1.131 (largest speedup over smallest), those of
# their first 7 rounds 1.115, 1.226 and 1.179 (docs/benchmarks-history.md)
ROUNDS = 11


def baseline_name(scaling: str) -> str:
    """The one-device configuration a speedup under `scaling` divides by: one device at the
    per-replica batch under weak scaling, at the global batch under strong."""
    return "one_device_replica_batch" if scaling == "weak" else "one_device_global_batch"


TFSCALE_LOOP = "tfscale_loop"  # with `train.loop: fit`, tfscale's loop at the run's setting


@dataclass(frozen=True)
class RoundRates:
    """Examples/s of each measured configuration, one value per round, in round order."""

    replicas: int
    scaling: str
    step_examples: int  # examples one step of the run consumes (all replicas)
    rates: dict[str, list[float]]
    # the model's gradient bytes and [bytes, seconds] of an all-reduce at a few sizes (for
    # the forecast's cost model; several replicas only)
    gradient_bytes: int = 0
    comm_s_by_bytes: list[list[float]] = field(default_factory=list)
    # what else used the machine during the rounds (`tasks.core.machine_load.Interference`)
    interference: dict = field(default_factory=dict)
    # why the rounds ended (`tasks.measure.rounds.RoundsEnded`): the watched figure's interval
    # narrow enough, or the cap
    settled: dict = field(default_factory=dict)

    @property
    def interfered(self) -> str:
        """A sentence when other load was material during the rounds, else ''."""
        return Interference(**self.interference).text() if self.interference else ""

    def spread(self, name: str) -> Spread:
        return Spread.of(self.rates[name])

    @property
    def medians(self) -> dict[str, float]:
        """Each configuration's median examples/s over the rounds."""
        return {name: statistics.median(values) for name, values in self.rates.items()}

    @property
    def baseline(self) -> str:
        """The one-device configuration the speedup divides by."""
        return baseline_name(self.scaling)

    @property
    def speedup(self) -> Spread | None:
        """The run end to end over one device end to end: the median of the rounds' own
        ratios, with its 95% confidence interval (`rounds.ratio_95`: the order statistics'
        from 6 rounds, a t-interval on the logs of 2 to 5 rounds' ratios, whose lowest to
        highest is no 95% interval; one round, its ratio alone)."""
        if self.replicas == 1:
            return None
        return ratio_95(self.rates["end_to_end"], self.rates[self.baseline])

    @property
    def speedup_by_round(self) -> list[float]:
        """The run end to end over one device end to end, each round's own ratio (empty
        with one device)."""
        if self.replicas == 1:
            return []
        top, bottom = self.rates["end_to_end"], self.rates[self.baseline]
        return [a / b for a, b in zip(top, bottom, strict=True)]

    @property
    def tfscale_over_fit(self) -> Spread | None:
        """With `train.loop: fit`, tfscale's own loop over the user's `fit` at the same
        setting end to end, round by round (None where the rounds did not time it)."""
        if TFSCALE_LOOP not in self.rates:
            return None
        return ratio_95(self.rates[TFSCALE_LOOP], self.rates["end_to_end"])

    @property
    def from_batch(self) -> Spread | None:
        """Weak scaling: one device at the global batch over one device at the per-replica
        batch, the part of the speedup the larger batch brings without more devices."""
        if self.replicas == 1 or self.scaling != "weak":
            return None
        return ratio(self.rates["one_device_global_batch"], self.rates["one_device_replica_batch"])

    @property
    def from_devices(self) -> float | None:
        """Weak scaling: what the devices add beyond the batch (the run over one device at
        the same global batch), as the remainder of the speedup over `from_batch`, so that
        the split multiplies to it: each is a median of its own rounds' ratios
        (`rounds.ratio`), and medians do not multiply."""
        speedup, from_batch = self.speedup, self.from_batch
        if speedup is None or from_batch is None:
            return None
        return speedup.median / from_batch.median

    @property
    def compute_efficiency(self) -> Spread | None:
        """Compute-only throughput over `replicas` x one device's, round by round."""
        if self.replicas == 1:
            return None
        one = [r * self.replicas for r in self.rates[self.baseline + "_compute"]]
        return ratio(self.rates["compute"], one)

    @property
    def input_share(self) -> Spread:
        """End to end over compute-only, round by round: 1 when the input keeps up."""
        return ratio(self.rates["end_to_end"], self.rates["compute"])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def measure_rounds(
    run: Run,
    steps: int,
    transform: Transform | None = None,
    rounds: int = ROUNDS,
    aim: float = 0.0,
) -> RoundRates:
    """Times every configuration of `run` (its training config under its strategy) the
    figures need (module docstring) in alternating rounds of up to `steps` steps each (about
    `rounds.BLOCK_SECONDS` a block): until the watched figure's median round ratio
    (`watched_figure`: the speedup; with one device, the input's share) is known to `aim`
    (+-, relative, 95% confidence), at most `rounds` rounds; `aim` 0 runs all `rounds`."""
    cfg, choice = run.train, run.choice
    setup, calls = _run_blocks(run, (steps, transform))
    devices = max(choice.replicas, choice.stages)  # a split model's devices hold its parts
    what = "the training with its input and without"
    if devices > 1:
        batches = _one_device_blocks(run, (steps, transform), calls)
        what = "the run and one device at batch " + " and ".join(map(str, batches))
    scaling = "strong" if choice.spec.splits else cfg.scaling  # one batch, the model split
    rule = Settling(aim, rounds)
    watched = watched_name(calls, scaling)  # the keys the rounds' values will have
    progress = RoundsProgress(f"{what}, in blocks of up to {steps} steps", watched, rounds, aim)

    def settled(values: dict[str, list[float]]) -> bool:
        figure = watched_figure(values, scaling)
        interval = ratio_interval(*figure)
        progress.round(len(figure[0]), half_width(interval) if interval else None)
        return rule.check(*figure) is not None

    with LoadWatch() as watch, progress:
        rates = alternate(_paired(calls, scaling), rounds, settled)
    verdict = rule.check(*watched_figure(rates, scaling))  # the last round's: never None
    grad_bytes = gradient_bytes(setup.model) if choice.replicas > 1 else 0
    # what the forecast fits: the replicas' all-reduce at 3 sizes
    by_bytes = (
        all_reduce_by_size(setup.strategy, grad_bytes, 1, max(steps, 3)) if grad_bytes else []
    )
    settling = dataclasses.replace(verdict, figure=watched).to_dict()
    load = watch.result.to_dict()
    return RoundRates(
        devices, scaling, setup.step_examples, rates, grad_bytes, by_bytes, load, settling
    )


def _run_blocks(
    run: Run, block: tuple[int, Transform | None]
) -> tuple[TrainingSetup, dict[str, Callable[[], float]]]:
    """The run's set-up and its blocks: end to end, compute-only and the input alone;
    with `train.loop: fit`, tfscale's own loop at the same setting beside the user's fit."""
    steps, transform = block
    cfg, manifest, data_dir, choice = run.train, run.manifest, run.data_dir, run.choice
    setup = set_up_training(cfg, manifest, choice)
    feed = _feed(cfg, manifest, data_dir, setup, transform)
    calls = {
        "end_to_end": _steps_block(setup, choice, feed, steps),
        "compute": _steps_block(setup, choice, _one_batch(feed), steps),
        "input": _input_block(feed, setup, steps),
    }
    if cfg.loop == "fit":
        ours = set_up_training(dataclasses.replace(cfg, loop="tfscale"), manifest, choice)
        ours_feed = _feed(cfg, manifest, data_dir, ours, transform)
        calls[TFSCALE_LOOP] = _steps_block(ours, choice, ours_feed, steps)
    return setup, calls


def _one_device_blocks(
    run: Run, block: tuple[int, Transform | None], calls: dict[str, Callable[[], float]]
) -> list[int]:
    """Adds to `calls` one device's blocks at the run's per-replica batch and at its global
    batch (a split model: the global one only), with input and without; `block`: the steps
    a block and the input's transform. Returns the batches."""
    steps, transform = block
    cfg, manifest, data_dir, choice = run.train, run.manifest, run.data_dir, run.choice
    one = baseline_choice(choice)
    per_replica, global_batch = batch_sizes(cfg, choice.replicas)
    sizes = [("one_device_replica_batch", per_replica), ("one_device_global_batch", global_batch)]
    sizes = sizes[1:] if choice.spec.splits else sizes  # split: one batch
    for name, batch in sizes:
        config = dataclasses.replace(cfg, batch_size_per_replica=batch, scaling="weak")
        setup = set_up_training(config, manifest, one)
        one_feed = _feed(config, manifest, data_dir, setup, transform)
        calls[name] = _steps_block(setup, one, one_feed, steps)
        calls[name + "_compute"] = _steps_block(setup, one, _one_batch(one_feed), steps)
    return [batch for _, batch in sizes]


def watched_figure(values: dict[str, list[float]], scaling: str) -> tuple[list[float], list[float]]:
    """What the rounds go on measuring until it is known well enough, as numerator and
    denominator round by round: the speedup (end to end over the one-device baseline), or
    with one device the input's share (end to end over compute-only), the figure its
    bottleneck turns on. A ratio of two blocks timed in the same round, either way: one
    device's examples/s alone keeps the machine's slow spells (+-5.1% after 25 rounds of
    the digits CNN, where a ratio settles to +-3% in 15-25)."""
    base = baseline_name(scaling)
    return values["end_to_end"], values[base if base in values else "compute"]


def watched_name(names: Collection[str], scaling: str) -> str:
    """What `watched_figure` watches among the configurations `names`, as a sentence names
    it."""
    return "the speedup" if baseline_name(scaling) in names else "the input's share"


def _paired(calls: dict[str, Callable], scaling: str) -> dict[str, Callable]:
    """`calls` in the order a round times them: each of the speedup's configurations next
    to its baseline (end to end, then compute-only), the rest after, the input alone last.
    Two blocks timed back to back share more of the machine's moment than two a few
    blocks apart, so their ratio moves less from round to round."""
    base = baseline_name(scaling)
    first = ["end_to_end", TFSCALE_LOOP, base, "compute", base + "_compute"]
    order = [n for n in first if n in calls] + [n for n in calls if n not in first]
    order.sort(key=lambda name: name == "input")  # stable: only the input moves
    return {name: calls[name] for name in order}


def time_candidates(
    run: Run,
    options: list[Candidate],
    steps: int = autotune.STEPS,
    rounds: int = autotune.ROUNDS,
) -> list[Timed]:
    """Each of `options` (the run's strategy choice with its strategy, precision and XLA
    replaced, its training config with its batch) trained end to end on the real model and
    input for `steps` steps a round, in `rounds` alternating rounds: what
    `tasks.measure.autotune` chooses among."""
    calls = {}
    for option in options:
        candidate, config = option.applied_to(run.choice), option.applied_to_config(run.train)
        setup = set_up_training(config, run.manifest, candidate)
        feed = _feed(config, run.manifest, run.data_dir, setup, None)
        calls[option.label] = _steps_block(setup, candidate, feed, steps)
    rates = alternate(calls, rounds)
    return [Timed(option, tuple(rates[option.label])) for option in options]


def _feed(
    cfg: TrainConfig,
    manifest: Manifest,
    data_dir: str,
    setup: TrainingSetup,
    transform: Transform | None,
) -> Callable:
    """The training input of `setup` (micro-batch groups per replica), as training reads it."""
    return train_dataset_fn(
        cfg, setup.manifest or manifest, data_dir, setup.per_replica * setup.accum_steps, transform
    )


def _one_batch(pipeline: Callable) -> Callable:
    """The input pipeline's first batch, cached and repeated: the step with no input cost."""

    def dataset_fn(ctx: tf.distribute.InputContext | None) -> tf.data.Dataset:
        return pipeline(ctx).take(1).cache().repeat()

    return dataset_fn


def _steps_block(
    setup: TrainingSetup, choice: StrategyChoice, dataset_fn: Callable, steps: int
) -> Callable[[], float]:
    """A call that runs up to `steps` training steps and returns their examples/s (the
    epoch runner reads its sums back, so the time includes the work, not only its
    dispatch). Its first call is the warm-up: it traces, then times a few steps to size
    the blocks that follow (`rounds.block_steps`)."""
    run_epoch = setup.epoch_runner(choice, dataset_fn)

    own = getattr(run_epoch, "clock", None)  # `fit` calls: their steps' own time

    def timed(n: int) -> float:
        started = time.perf_counter()
        run_epoch(n)
        seconds = own.seconds if own is not None else time.perf_counter() - started
        return n * setup.step_examples / seconds

    return _sized(timed, steps, setup.step_examples)


def _sized(timed: Callable[[int], float], most: int, examples: int) -> Callable[[], float]:
    """`timed(n)` (examples/s of n steps) as a block whose first call warms up and sizes
    the later ones to about `rounds.BLOCK_SECONDS`, at most `most` steps.

    The warm-up call ends with one block of the size it chose: after only the few sizing
    steps, the first timed block of the distributed run was still slow once the optimizer
    was `steps.FusedAdam` (the digits CNN on 2 logical CPUs, 8 of 8 pipeline runs: 20.5-24.8k
    ex/s in the first of 11 rounds, 26-31k in every later one; not seen in 4 runs with
    Keras's Adam), which tripled the rounds' spread of the speedup (a coefficient of
    variation of 5.7-6.5% against 1.8-3.1%) and moved its median; with the whole block in
    the warm-up, 1.2%.
    """
    size: list[int] = []

    def block() -> float:
        if size:
            return timed(size[0])
        first = min(most, MIN_BLOCK_STEPS)
        timed(first)  # tracing, the first allocations
        rate = timed(first)
        size.append(block_steps(examples / rate, most))
        return timed(size[0])  # a whole block, still warming up, so the rounds start warm

    return block


def _input_block(pipeline: Callable, setup: TrainingSetup, steps: int) -> Callable[[], float]:
    """A call that reads as many batches as up to `steps` steps consume (one per replica
    and micro-batch group) from the run's input pipeline alone; their examples/s."""
    iterator = iter(pipeline(None))
    replicas = setup.strategy.num_replicas_in_sync
    batch = setup.per_replica * setup.accum_steps

    def timed(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n * replicas):
            labels = next(iterator)[1]
        labels.numpy()
        return n * replicas * batch / (time.perf_counter() - started)

    return _sized(timed, steps, replicas * batch)
