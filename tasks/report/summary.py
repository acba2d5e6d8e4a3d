"""The headline numbers: distributed against single-device baseline, and a chart of them."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tfscale.tasks.core.fields import EACH, PARAM, UNTRACKED, tracked_as
from tfscale.tasks.core.files import write_json_atomic
from tfscale.tasks.core.run_layout import METRICS
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.execute.run_files import load_exported
from tfscale.tasks.measure.autotune import TIMED_IN
from tfscale.tasks.measure.diagnosis import Diagnosis
from tfscale.tasks.measure.probes import RoundRates
from tfscale.tasks.measure.rounds import RoundsEnded, Spread, interval_95, least_rounds
from tfscale.tasks.report.target_comparison import (
    NO_TARGET,
    VERDICT_SEEDS,
    target_figures,
    undecided,
)
from tfscale.tasks.settings.kinds import SpreadOver, shape_text
from tfscale.tasks.train.evaluation import EvalResult
from tfscale.tasks.train.result import TrainResult
from tfscale.tasks.train.to_target import Target, target_of, target_text


@dataclass(frozen=True)
class ScalingSummary(SpreadOver):
    strategy: str = field(metadata=PARAM)
    replicas: int = field(metadata=PARAM)
    precision: str = field(metadata=PARAM)
    scaling: str = field(metadata=PARAM)
    baseline_examples_per_s: float
    distributed_examples_per_s: float
    speedup: float
    scaling_efficiency: float
    # held-out accuracy `target_accuracy` reached while training (`tasks.train.to_target`): each
    # training's examples to it and its time on the clock (MLPerf's), and the time-to-target
    # speedup = the examples/s speedup x the baseline's examples to target over the
    # distributed's (with the speedup's range); None where a training did not reach it
    target_accuracy: float | None  # the target's value (of `target_metric`; None: no target)
    examples_to_target_baseline: int | None
    examples_to_target_distributed: int | None
    time_to_target_s_baseline: float | None
    time_to_target_s_distributed: float | None
    test_accuracy: float
    test_loss: float
    reason: str = field(metadata=tracked_as("strategy_reason"))  # the parent's tag of it
    # the label kind's held-out metrics beside accuracy (AUC; a real value's mean absolute
    # error, where `test_accuracy` is NaN)
    test_metrics: dict[str, float] = field(
        default_factory=dict, metadata={**EACH, **tracked_as("test")}
    )
    target_metric: str = field(default="accuracy", metadata=PARAM)  # `evaluate.target_metric`
    bottleneck: str = ""
    bottleneck_evidence: str = ""
    advice: list[str] = field(default_factory=list)
    # weak scaling: speedup = speedup_from_batch x speedup_from_devices, where the batch part
    # is one device at the global batch over one device at the per-replica batch
    speedup_from_batch: float | None = None
    speedup_from_devices: float | None = None
    # how it would scale on more devices and other links (`tasks.report.forecast_report.headline`)
    forecast: str = ""
    # where the throughputs come from: alternating rounds of both configurations in one
    # process (with the speedup's lowest and highest round), or the two trainings' epochs
    measured_over: str = "the two trainings' epochs"
    speedup_low: float | None = None
    speedup_high: float | None = None
    # what else used the machine while the rounds ran, when it was material ('' otherwise)
    interference: str = ""
    # what to train with on this hardware, from the speedup's range over the rounds
    recommendation: str = ""
    # a pipeline: the model cut into this many stages (one device each), not replicated
    stages: int = field(default=1, metadata=PARAM)
    micro_batches: int = field(default=1, metadata=PARAM)
    splits: str = ""
    time_to_target_speedup: float | None = None
    time_to_target_speedup_low: float | None = None
    time_to_target_speedup_high: float | None = None
    # one seed: the seed spread its interval assumed, in words (`assuming a 37% seed spread,
    # not measured here`)
    seed_spread_assumed: str = ""
    to_target: str = ""  # the time-to-target answer in a sentence (`target_sentence`)
    seeds: int = field(default=1, metadata=PARAM)  # each training's, for the time to target
    # the baseline's gradient noise scale (B_simple of the raw gradient: the ratio of its
    # windows' averaged |G|^2 and tr(S) up to the target, with a bootstrap's 95% interval;
    # `noise_scale_adam`, of the gradient as Adam preconditions it), and the examples to
    # target it predicts at the distributed run's global batch for the rate its rule gave
    # it (`predicted_for_rule`; `tasks.measure.noise_trajectory.rule_steps`): a point where the
    # rule needs no more (adascale), else the range from a base rate far below its optimum
    # to one at it (`_low`, `_high`)
    noise_scale: float | None = None
    noise_scale_low: float | None = None
    noise_scale_high: float | None = None
    noise_scale_adam: float | None = None
    predicted_examples_to_target_distributed: float | None = None
    predicted_examples_to_target_low: float | None = None
    predicted_examples_to_target_high: float | None = None
    predicted_for_rule: str = ""
    # examples to target of each seed: [baseline's, distributed's] (None: not reached)
    examples_to_target_by_seed: list[list[float | None]] = field(default_factory=list)
    # the result in one sentence (`answer_text`): what ran, its speedup, its time to target
    # and what to use; the console's first line and the Prefect artifact's heading
    answer: str = ""
    # what `auto` measured to choose the run's setting (`StrategyChoice.measured`): each
    # candidate's label and examples/s (median, lowest, highest round), the chosen first
    candidates: list[list] = field(default_factory=list)
    # `the fastest of 2`, and the hardware's proposal's reason when `auto` measured: both
    # within `reason` (the run's strategy_reason) already
    candidates_verdict: str = field(default="", metadata=UNTRACKED)
    proposed: str = field(default="", metadata=UNTRACKED)
    mlflow_run_id: str = field(default="", metadata=UNTRACKED)  # the study's parent run
    # the training loop (`train.loop`): tfscale's, or the user's `fit`; with fit, tfscale's
    # loop over fit at the run's setting, from the same rounds
    loop: str = field(default="tfscale", metadata=PARAM)
    tfscale_over_fit: float | None = None
    tfscale_over_fit_low: float | None = None
    tfscale_over_fit_high: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def speedup_text(self) -> str:
        """`1.21x (1.15-1.27)` with the rounds' range, `1.21x` without."""
        if self.speedup_low is None or self.speedup_high is None:
            return f"{self.speedup:.2f}x"
        return Spread(self.speedup, self.speedup_low, self.speedup_high).text()


def compare_runs(
    trainings: tuple[TrainResult, TrainResult],
    evaluation: EvalResult,
    diagnosis: Diagnosis | None,
    scaling: str,
    target: float | Target,
    repeats: tuple[list[dict], list[dict]] = ([], []),
    subject: str = "",
) -> ScalingSummary:
    """Speedup is the distributed training's examples/s over the baseline's (`trainings`:
    the baseline, the distributed run); efficiency divides by the devices (replicas, or a
    pipeline's stages; 1.0 is linear scaling).

    When the diagnosis measured both configurations in alternating rounds (a run in this
    process), every figure comes from those rounds: the throughputs are their medians, the
    speedup and its split the medians of the per-round ratios, with the speedup's range.
    Otherwise (a run across processes) the throughputs are the two trainings' own.
    `target`: what they aimed at where they recorded none (`_aimed`)."""
    baseline, distributed = trainings
    rounds = diagnosis.round_rates if diagnosis else None
    if rounds is not None and rounds.speedup is not None:
        figures = _figures_of_rounds(rounds, distributed.shape)
    else:
        figures = _figures_of_trainings(baseline, distributed, diagnosis)
    target_accuracy, metric = _aimed(baseline, target)
    speed, kind = _speedup_for_time(rounds, baseline, distributed, figures["speedup"])
    target = target_figures(baseline, distributed, (target_accuracy, metric), speed, repeats, kind)
    if figures.get("recommendation"):
        figures["recommendation"] += _to_target_caveat(target, distributed.shape)
    summary = ScalingSummary(
        strategy=distributed.strategy,
        replicas=distributed.replicas,
        precision=distributed.precision,
        scaling=scaling,
        scaling_efficiency=figures["speedup"] / distributed.devices,
        stages=distributed.stages,
        micro_batches=distributed.micro_batches,
        splits=distributed.splits,
        target_accuracy=target_accuracy,
        target_metric=metric,
        **target,
        test_accuracy=evaluation.test_accuracy,
        test_loss=evaluation.test_loss,
        test_metrics=dict(getattr(evaluation, "metrics", {}) or {}),
        reason=distributed.reason,
        loop=distributed.loop,
        **_bottleneck_fields(diagnosis),
        **figures,
    )
    return dataclasses.replace(summary, answer=answer_text(summary, subject))


def _aimed(baseline: TrainResult, target: float | Target) -> tuple[float | None, str]:
    """The target's value and metric as the trainings recorded them; what they did not
    record, `target`'s (a `Target`; a number: an accuracy to reach)."""
    given = target if isinstance(target, Target) else Target("accuracy", target)
    recorded = baseline.to_target or {}
    return recorded.get("target", given.value), recorded.get("metric", given.metric)


def _bottleneck_fields(diagnosis: Diagnosis | None) -> dict[str, Any]:
    if diagnosis is None:
        return {"bottleneck": "", "bottleneck_evidence": "", "advice": []}
    return {
        "bottleneck": diagnosis.bottleneck,
        "bottleneck_evidence": diagnosis.evidence,
        "advice": list(diagnosis.advice),
    }


def test_row(summary: ScalingSummary, bold: bool = False) -> tuple[str, str]:
    """`("test accuracy", "0.9639 (loss 0.1085)")`, with AUC where the label is binary;
    for a real-valued label, its mean absolute error."""
    mark = "**" if bold else ""
    loss = f"(loss {summary.test_loss:.4f})"
    error = summary.test_metrics.get("mean_absolute_error")
    if math.isnan(summary.test_accuracy) and error is not None:
        return "test mean abs. error", f"{mark}{error:.4f}{mark} {loss}"
    auc = summary.test_metrics.get("auc")
    extra = f", AUC {auc:.4f}" if auc is not None else ""
    return "test accuracy", f"{mark}{summary.test_accuracy:.4f}{mark}{extra} {loss}"


def answer_text(summary: ScalingSummary, subject: str = "") -> str:
    """The result in one sentence: what ran (`subject`: `cnn on digits`), its examples/s
    speedup with its interval, its time to the target with its interval, and what to use:
    `2 replicas (mirrored, float32; cnn on digits) ran 1.19x (1.15-1.23) as fast as one
    device in examples/s but reached 96% held-out accuracy 0.92x (0.89-0.95) as fast: one
    device finishes sooner (5 seeds)`. The time to the target decides where its interval
    over `VERDICT_SEEDS` or more seeds lies on one side of 1; with fewer it says so."""
    s = summary
    shape = s.shape
    loop = ", Keras's fit" if s.loop == "fit" else ""
    what = f"{shape} ({s.strategy}, {s.precision}{loop}{'; ' + subject if subject else ''})"
    speed = spread_of(s.speedup, s.speedup_low, s.speedup_high)
    head = f"{what} ran {s.speedup_text} as fast as one device in examples/s"
    target = target_text(s.target_metric, s.target_accuracy)
    by_speed = speed_choice(s) or "either: its interval holds 1"
    time = time_spread(s)
    if time is None:
        why = s.to_target.partition(": ")[2]
        if NO_TARGET in why:
            return f"{head}: {by_speed}; no time to target: {NO_TARGET} {target}"
        return f"{head}: {by_speed}" + (f"; to {target}, not compared: {why}" if why else "")
    join = (
        "but"
        if (time.below(1.0) and speed.above(1.0)) or (time.above(1.0) and speed.below(1.0))
        else "and"
    )
    reached = f"{head} {join} reached {target} {time.text()} as fast"
    if decisive_time(s) is None:  # too few seeds to tell
        return f"{reached}: for examples/s {by_speed}; {undecided(s.seeds)}"
    if time.above(1.0):
        return f"{reached}: use {shape}, they finish sooner ({s.seeds} seeds)"
    if time.below(1.0):
        return f"{reached}: one device finishes sooner ({s.seeds} seeds)"
    faster = speed_choice(s).removeprefix("use ")
    either = f"{faster} for examples/s; " if faster else ""
    held = "neither surely finishes sooner, its interval holds 1"
    return f"{reached}: {either}{held} ({s.seeds} seeds)"


def speed_choice(s: ScalingSummary) -> str:
    """What examples/s favours: `use 2 replicas` or `use one device` where the speedup's
    interval lies on one side of 1; "" where it holds 1."""
    speed = spread_of(s.speedup, s.speedup_low, s.speedup_high)
    return f"use {s.shape}" if speed.above(1.0) else "use one device" if speed.below(1.0) else ""


def finishes_sooner(s: ScalingSummary) -> str:
    """Who finishes sooner by the time to target's interval over `VERDICT_SEEDS` or more
    seeds (`2 replicas finish sooner`, `one device finishes sooner`, `neither surely
    finishes sooner`); with fewer, that they are too few to tell (`undecided`)."""
    decisive = decisive_time(s)
    if decisive is None:
        return undecided(s.seeds)
    if decisive.above(1.0):
        return f"{s.shape} finish sooner"
    if decisive.below(1.0):
        return "one device finishes sooner"
    return "neither surely finishes sooner"


def decisive_time(s: ScalingSummary) -> Spread | None:
    """The time-to-target interval a verdict of who finishes sooner reads: its 95% interval
    over `VERDICT_SEEDS` or more seeds a side; None with fewer (no verdict: with one, the
    seed spread is assumed; with 2, its t has 2 degrees of freedom) or where the time to
    target was not compared."""
    return time_spread(s) if s.seeds >= VERDICT_SEEDS else None


def loop_text(s: ScalingSummary) -> str:
    """`your fit on 2 replicas ran 1.10x (1.02-1.18) one device's; tfscale's loop runs 1.80x
    (1.70-1.90) your fit at that setting (the same rounds)`."""
    head = f"your fit on {s.shape} ran {s.speedup_text} one device's"
    if s.tfscale_over_fit is None:
        return f"{head} (Keras's model.fit trained both)"
    ours = spread_of(s.tfscale_over_fit, s.tfscale_over_fit_low, s.tfscale_over_fit_high)
    return f"{head}; tfscale's loop runs {ours.text()} your fit at that setting (the same rounds)"


def time_spread(s: ScalingSummary) -> Spread | None:
    """The time-to-target speedup with its interval; None where it was not compared."""
    point, low, high = (
        s.time_to_target_speedup,
        s.time_to_target_speedup_low,
        s.time_to_target_speedup_high,
    )
    return None if None in (point, low, high) else Spread(point, low, high)


def time_verdict(summary: ScalingSummary) -> str:
    """`; to 96% held-out accuracy 0.96x (0.70-1.31): neither surely finishes sooner`, so
    a heading never says a speedup above a line that says one device finishes sooner; ""
    where the time to target was not compared."""
    s = summary
    time = time_spread(s)
    if time is None:
        return ""
    target = target_text(s.target_metric, s.target_accuracy)
    return f"; to {target} {time.text()}: {finishes_sooner(s)}"


def _to_target_caveat(target: dict[str, Any], shape: str) -> str:
    """Where the time to target disagrees with examples/s over its whole range: `; to the
    target, though, 2 replicas took longer: 0.89x (0.83-0.93)` (over how many seeds)."""
    high, low = target.get("time_to_target_speedup_high"), target.get("time_to_target_speedup_low")
    if high is None or low is None:
        return ""
    if target.get("seeds", 1) < VERDICT_SEEDS or low <= 1.0 <= high:
        return ""  # too few seeds to tell, or its interval holds 1
    spread = Spread(target["time_to_target_speedup"], low, high).text()
    over = f"{target['seeds']} seeds"
    if high < 1.0:
        return f"; to the target, though, {shape} took longer: {spread} ({over})"
    return f"; to the target too: {spread} ({over})"


def _speedup_for_time(
    rounds: RoundRates | None, baseline: TrainResult, distributed: TrainResult, point: float
) -> tuple[Spread, str]:
    """The examples/s speedup as the time to target takes it, and what its interval is in
    words: a 95% interval of the rounds' own ratios (a run across processes: the epochs',
    `epoch_ratios`) that `rounds.interval_95` gives, a t-interval on their logs below 6,
    never their lowest to highest, which the time's interval reads as +-1.96 sigma; the
    point alone (`point`) where there is one ratio or none, its doubt unknown."""
    if rounds is not None and rounds.speedup is not None:
        found = interval_95(rounds.speedup_by_round, "rounds")
    else:
        found = interval_95(epoch_ratios(baseline, distributed), "epochs")
    return found or (Spread(point, point, point), "")


def spread_of(median: float, low: float | None, high: float | None) -> Spread:
    """`median` with its range, the median itself where a bound is missing."""
    return Spread(median, median if low is None else low, median if high is None else high)


def _figures_of_rounds(rounds: RoundRates, shape: str) -> dict[str, Any]:
    """The throughputs, the speedup with its range and its split, from alternating rounds."""
    speedup, from_batch, from_devices = rounds.speedup, rounds.from_batch, rounds.from_devices
    return {
        "baseline_examples_per_s": rounds.spread(rounds.baseline).median,
        "distributed_examples_per_s": rounds.spread("end_to_end").median,
        "speedup": speedup.median,
        "speedup_low": speedup.low,
        "speedup_high": speedup.high,
        "speedup_from_batch": from_batch.median if from_batch else None,
        "speedup_from_devices": from_devices,
        "measured_over": f"{len(rounds.rates['end_to_end'])} alternating rounds"
        + (f", {RoundsEnded(**rounds.settled).text()}" if rounds.settled else "")
        + _t_clause(len(rounds.rates["end_to_end"]))
        + " (the trainings' own examples/s are on their stage lines and MLflow child runs)",
        "interference": rounds.interfered,
        "recommendation": recommend_devices(speedup, shape),
        **_loops(rounds.tfscale_over_fit),
    }


def _t_clause(rounds: int) -> str:
    """What the speedup's interval is where the rounds are too few for the median's
    (`rounds.ratio_95`): their lowest to highest is no 95% interval."""
    if not 2 <= rounds < least_rounds():
        return ""
    return "; the speedup's interval a 95% t-interval on the logs of the rounds' ratios"


def _loops(ours: Spread | None) -> dict[str, Any]:
    """tfscale's loop over the user's `fit`, where the rounds timed both."""
    if ours is None:
        return {}
    return {"tfscale_over_fit": ours.median, "tfscale_over_fit_low": ours.low,
            "tfscale_over_fit_high": ours.high}  # fmt: skip


def recommend_devices(speedup: Spread, replicas: int | str, over: str = "round") -> str:
    """One device or several (`replicas`: a count, or what the run spread over, as
    `2 stages x 4 micro-batches`), where the speedup's 95% interval over the rounds lies
    on one side of 1 (or, over the trainings' epochs, `over="epoch"`, every epoch agrees);
    neither where it does not."""
    if isinstance(replicas, int):
        replicas = shape_text(replicas)
    rounds = over == "round"
    side = "its 95% interval {} 1" if rounds else f"{{}} in every {over}"
    if speedup.below(1.0):
        why = side.format("below") if rounds else side.format("faster")
        return (
            f"one device: it trained {1 / speedup.median:.2f}x as fast as {replicas}, "
            f"{why} (--strategy one_device)"
        )
    if speedup.above(1.0):
        why = side.format("above") if rounds else side.format("faster")
        return f"{replicas}: {speedup.text()} one device's speed, {why}"
    both = "its 95% interval holds 1" if rounds else f"on both sides of 1 over the {over}s"
    return f"either: {replicas} ran at {speedup.text()} one device's speed, {both}"


def _figures_of_trainings(
    baseline: TrainResult, distributed: TrainResult, diagnosis: Diagnosis | None
) -> dict[str, Any]:
    """The throughputs and speedup of the two trainings themselves (a run across processes,
    whose configurations cannot alternate in one process). With two or more epochs after
    the first on both sides, the speedup is the median of the epoch-by-epoch ratios, with
    their range; the epochs ran one training after the other, and the note says so."""
    ratio = distributed.examples_per_s / baseline.examples_per_s
    batch_effect = diagnosis.batch_effect if diagnosis else None
    figures: dict[str, Any] = {
        "baseline_examples_per_s": baseline.examples_per_s,
        "distributed_examples_per_s": distributed.examples_per_s,
    }
    by_epoch = epoch_ratios(baseline, distributed)
    if len(by_epoch) >= 2:
        speedup = Spread.of(by_epoch)
        ratio = speedup.median
        figures.update(
            speedup_low=speedup.low,
            speedup_high=speedup.high,
            measured_over=f"{len(by_epoch)} epochs of each training, epoch by epoch after "
            "the first (the trainings ran one after the other, in processes of their own: no "
            "alternating rounds)",
            recommendation=recommend_devices(speedup, distributed.shape, over="epoch"),
        )
    return {
        **figures,
        "speedup": ratio,
        "speedup_from_batch": batch_effect,
        "speedup_from_devices": ratio / batch_effect if batch_effect else None,
    }


def epoch_ratios(baseline: TrainResult, distributed: TrainResult) -> list[float]:
    """The distributed training's examples/s over the baseline's, epoch k against epoch k,
    for the epochs after the first (which traces) that both trained in full."""
    rates = [
        {e["epoch"]: e["examples_per_s"] for e in r.history if e["epoch"] > 1 and e["seconds"]}
        for r in (baseline, distributed)
    ]
    return [rates[1][k] / rates[0][k] for k in sorted(rates[0].keys() & rates[1].keys())]


def compare_exported(
    baseline_dir: Path,
    model_dir: Path,
    evaluation: EvalResult,
    scaling: str,
    target: float | Target,
) -> ScalingSummary:
    """The study's comparison for exported runs (the DVC stages), also written as
    `scaling.json` beside the distributed model."""
    diagnosis_path = model_dir / "diagnosis.json"
    diagnosis = (
        Diagnosis(**json.loads(diagnosis_path.read_text())) if diagnosis_path.exists() else None
    )
    summary = compare_runs(
        (load_exported(baseline_dir), load_exported(model_dir)),
        evaluation,
        diagnosis,
        scaling,
        target,
    )
    write_json_atomic(model_dir / "scaling.json", summary.to_dict())
    return summary


def plot_speedup(
    summary: ScalingSummary, baseline: TrainResult, distributed: TrainResult, path: Path
) -> Path:
    """The speedup chart (`speedup_figure`) as a PNG at `path`."""
    from tfscale.tasks.core.plots import pyplot

    fig = speedup_figure(summary, baseline, distributed)
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return path


def speedup_figure(summary: ScalingSummary, baseline: TrainResult, distributed: TrainResult) -> Any:
    """Throughput bars with the ideal (linear) line, and per-epoch throughput curves; every
    label inside the figure (`tasks.core.plots.texts_outside`)."""
    from tfscale.tasks.core.plots import pyplot

    plt = pyplot()

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(11, 4))
    names = ["baseline\n(1 device)", f"{summary.strategy}\n({summary.shape})"]
    values = [summary.baseline_examples_per_s, summary.distributed_examples_per_s]
    bars.bar(names, values, color=["#999999", "#1f77b4"])
    ideal = summary.baseline_examples_per_s * summary.devices
    bars.axhline(
        ideal,
        color="#d62728",
        linestyle="--",
        label=f"ideal ({summary.devices}x baseline)",
    )
    bars.set_ylim(0, 1.25 * max(ideal, *values))  # the legend above the ideal line
    bars.set_ylabel("examples/s (median)")  # over what: the summary's `measured over`
    bars.set_title(f"speedup {summary.speedup_text}, efficiency {summary.scaling_efficiency:.2f}")
    bars.legend()
    for result, label in ((baseline, "baseline"), (distributed, summary.strategy)):
        epochs = [h["epoch"] for h in result.history]
        curves.plot(epochs, [h["examples_per_s"] for h in result.history], marker="o", label=label)
    curves.set_xlabel("epoch")
    curves.set_ylabel("examples/s")
    curves.set_title("throughput per epoch (epoch 1 includes tracing)")
    curves.legend()
    fig.tight_layout()
    return fig


def strategy_text(summary: ScalingSummary) -> str:
    """`mirrored, 2 replicas, mixed_bfloat16, weak scaling: the fastest of 2 measured
    (below); proposed from the hardware: CPU only, ...`, or the selection's reason where
    `auto` measured nothing."""
    setting = f"{summary.strategy}, {summary.shape}, {summary.precision}, {summary.scaling} scaling"
    if not summary.candidates:
        return f"{setting}: {summary.reason}" if summary.reason else setting
    return (
        f"{setting}, chosen by measuring ({summary.candidates_verdict}; the candidates "
        f"below); proposed from the hardware: {summary.proposed}"
    )


def candidates_table(summary: ScalingSummary) -> list[str]:
    """What `auto` measured, a candidate a line, the chosen first:

    ```
    candidate                            examples/s  lowest-highest round
    2 replicas, mixed_bfloat16, XLA off      42,604  38,281-44,536  chosen
    ```"""
    if len(summary.candidates) < 2:
        return []
    head = ("candidates", "examples/s", f"lowest-highest of {TIMED_IN}")
    rows = [
        (label, f"{median:,.0f}", f"{low:,.0f}-{high:,.0f}" + ("  chosen" if i == 0 else ""))
        for i, (label, median, low, high) in enumerate(summary.candidates)
    ]
    first = max(len(r[0]) for r in (head, *rows))
    second = max(len(r[1]) for r in (head, *rows))
    return [f"{a:<{first}}  {b:>{second}}  {c}" for a, b, c in (head, *rows)]


def format_markdown(summary: ScalingSummary, dataset: str, link: tuple[str, str]) -> str:
    """The summary as Markdown, headed by the answer, every row labelled (a Prefect
    artifact, and the MLflow run's description), with `link` (words, address) to MLflow."""
    advice = summary.advice
    rows = [
        ("speedup", f"**{summary.speedup_text}**{split_text(summary)}"),
        ("measured over", summary.measured_over),
        *([("interference", summary.interference)] if summary.interference else []),
        ("scaling efficiency", f"**{summary.scaling_efficiency:.2f}** (1.00 is linear)"),
        ("to target", summary.to_target),
        test_row(summary, bold=True),
        ("bottleneck", f"{summary.bottleneck}: {summary.bottleneck_evidence}"),
        *[(f"advice {i + 1}" if len(advice) > 1 else "advice", a) for i, a in enumerate(advice)],
        *([("use", summary.recommendation)] if summary.recommendation else []),
        *([("forecast", summary.forecast)] if summary.forecast else []),
        (
            "throughput",
            f"baseline {summary.baseline_examples_per_s:,.0f} examples/s, distributed "
            f"{summary.distributed_examples_per_s:,.0f}",
        ),
        ("strategy", strategy_text(summary)),
        *[
            (
                f"candidate: {label}",
                Spread(median, low, high).text(" examples/s", 0)
                + (" **chosen**" if i == 0 else ""),
            )
            for i, (label, median, low, high) in enumerate(summary.candidates)
        ],
        ("MLflow", f"[{link[0]}]({link[1]})"),
    ]
    head = (
        f"## {dataset}: {summary.speedup_text} on {summary.shape} "
        f"({summary.strategy}, {summary.precision}, {summary.scaling} scaling)"
        f"{time_verdict(summary)}"
    )
    answer = f"{summary.answer}\n\n" if summary.answer else ""
    table = "\n".join(f"| {k} | {v.replace('|', '/')} |" for k, v in rows)
    return f"{head}\n\n{answer}| figure | value |\n|---|---|\n{table}\n"


def split_text(summary: ScalingSummary) -> str:
    if summary.speedup_from_batch is None or summary.speedup_from_devices is None:
        return ""
    return (
        f" = {summary.speedup_from_batch:.2f}x from the larger global batch (one device) "
        f"x {summary.speedup_from_devices:.2f}x from more devices"
    )


@dataclass(frozen=True)
class StudyRecord:
    """What one scaling study was about and what it produced: what tracking logs."""

    run: Run  # what it trained: config, data, hardware, strategy choice
    baseline: TrainResult
    distributed: TrainResult
    evaluation: EvalResult
    diagnosis: Diagnosis
    summary: ScalingSummary
    files: dict[str, Path]
    # the forecast's fitted constants and predictions (`tasks.report.forecast.forecast_metrics`)
    forecast: dict[str, float] = field(default_factory=dict)


def summarize_study(
    run: Run,
    trainings: tuple[TrainResult, TrainResult],
    evaluation: EvalResult,
    diagnosis: Diagnosis,
    repeats: tuple[list[dict], list[dict]] = ([], []),
) -> StudyRecord:
    """Compares the `trainings` (the baseline, the distributed run) and writes the chart,
    the evaluation and (where the all-reduce was measured) the forecast beside the
    distributed model; the diagnosis, written by the training's run
    (`tasks.execute.trainings`), is listed with them."""
    baseline, distributed = trainings
    subject = f"{run.train.model} on {run.manifest.dataset}"
    target = target_of(run.config.evaluate, run.manifest.spec.label)
    summary = compare_runs(
        trainings, evaluation, diagnosis, run.train.scaling, target, repeats, subject
    )
    choice = run.choice
    summary = dataclasses.replace(
        summary,
        candidates=[list(c) for c in choice.measured],
        candidates_verdict=choice.measured_verdict,
        proposed=choice.proposed,
    )
    class_names = run.manifest.feature["class_names"]
    files = _study_files(summary, trainings, evaluation, class_names)
    summary, forecast = _with_forecast(summary, distributed, run.train.scaling, files)
    (Path(distributed.run_dir) / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2))
    return StudyRecord(run, baseline, distributed, evaluation, diagnosis, summary, files, forecast)


def _study_files(
    summary: ScalingSummary,
    trainings: tuple[TrainResult, TrainResult],
    evaluation: EvalResult,
    class_names: list[str],
) -> dict[str, Path]:
    """The evaluation and the speedup chart, written beside the distributed model, with
    the trainings' metrics and the diagnosis already there."""
    from tfscale.tasks.train.evaluation import write_evaluation

    baseline, distributed = trainings
    out_dir = Path(distributed.run_dir)
    return {
        "evaluation": write_evaluation(evaluation, out_dir, class_names),
        # classes only: a real-valued label has no confusion matrix
        **(
            {"confusion_matrix": out_dir / "confusion_matrix.png"}
            if evaluation.confusion_matrix
            else {}
        ),
        "speedup_chart": plot_speedup(summary, baseline, distributed, out_dir / "speedup.png"),
        "baseline_metrics": Path(baseline.run_dir) / METRICS,
        "distributed_metrics": out_dir / METRICS,
        "diagnosis": out_dir / "diagnosis.txt",
    }


def _with_forecast(
    summary: ScalingSummary, distributed: TrainResult, scaling: str, files: dict[str, Path]
) -> tuple[ScalingSummary, dict[str, float]]:
    """Where the distributed run measured its all-reduce: the forecast of how it would
    scale, its files added to `files`, its headline on the summary, and its figures."""
    if not distributed.probes.get("comm_s_by_bytes"):
        return summary, {}
    out_dir = Path(distributed.run_dir)
    from tfscale.tasks.report.forecast import DEFAULT_WORKERS, RUN_PRESETS, forecast_metrics
    from tfscale.tasks.report.forecast_report import forecast_run, headline

    study = dataclasses.asdict(summary)  # its baseline calibrates the rule's rate
    predicted, written = forecast_run(
        out_dir, list(DEFAULT_WORKERS), [], list(RUN_PRESETS), scaling, study=study
    )
    files.update(zip(("forecast", "forecast_speedup", "forecast_efficiency"), written, strict=True))
    return dataclasses.replace(summary, forecast=headline(predicted)), forecast_metrics(predicted)
