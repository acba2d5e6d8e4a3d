"""The study's summary as the console prints it, read at a glance on a 100-column terminal.

The answer first, in at most two lines: each side's speed against one device and what to
use; then a table whose every line fits `COLUMNS` (a long value wraps under its own
column; a link is never broken, so that a terminal can open it); the time to target in
a few lines, its derivation (the noise scale, the MLPerf
clock, what an interval assumed) left to where a reader looks for it, the MLflow run's
description and the run folder's `summary.json` (`ScalingSummary.to_target`, whole).
"""

from __future__ import annotations

from tfscale.tasks.core.progress import wrapped
from tfscale.tasks.report.summary import (
    ScalingSummary,
    candidates_table,
    decisive_time,
    finishes_sooner,
    loop_text,
    speed_choice,
    split_text,
    strategy_text,
    test_row,
    time_spread,
)
from tfscale.tasks.train.to_target import target_text

DERIVED = "more in summary.json and MLflow"  # the whole sentence: the run's summary.json, its page


def answer_lines(s: ScalingSummary) -> list[str]:
    """The answer in at most two lines (ScalingSummary.answer, whole, heads the MLflow run):
    `answer  2 replicas: examples/s 1.34x (1.33-1.37) one device's, to 96% held-out
    accuracy 0.96x (0.65-1.39): use 2 replicas for examples/s; one seed cannot tell which
    finishes sooner`."""
    fit = " on Keras's fit" if s.loop == "fit" else ""
    use = speed_choice(s)
    head = f"{s.shape}{fit}: examples/s {s.speedup_text} one device's"
    time = time_spread(s)
    if time is None:
        why = s.to_target.partition(": ")[2]
        verdict = use or "either: its interval holds 1"
        if why:
            verdict += f"; time to target not compared: {why}"
        return wrapped("answer", f"{head}: {verdict}", len("answer"))
    head += f", to {target_text(s.target_metric, s.target_accuracy)} {time.text()}"
    return wrapped("answer", f"{head}: {_time_verdict(s, use)}", len("answer"))


def _time_verdict(s: ScalingSummary, use: str) -> str:
    """Who finishes sooner, over `target_comparison.VERDICT_SEEDS` or more seeds; below,
    what examples/s favours and that the seeds are too few to tell (the `to target` row
    says how many would narrow it)."""
    decisive, over = decisive_time(s), f"({s.seeds} seeds)"
    if decisive is None:
        few = "one seed" if s.seeds == 1 else f"{s.seeds} seeds"
        first = f"{use} for examples/s; " if use else ""
        return f"{first}{few} cannot tell which finishes sooner"
    if decisive.above(1.0):
        return f"use {s.shape}, they finish sooner {over}"
    if decisive.below(1.0):
        return f"one device finishes sooner {over}"
    first = f"{use} for examples/s; " if use else ""
    return f"{first}neither surely finishes sooner {over}"


def target_brief(s: ScalingSummary) -> str:
    """The `to target` row: the time-to-target speedup and the examples each side took,
    whether it decides, and where the rest is (`DERIVED`); where it was not compared, why
    (`ScalingSummary.to_target`)."""
    time = time_spread(s)
    base, dist = s.examples_to_target_baseline, s.examples_to_target_distributed
    if time is None or not base or not dist:
        return s.to_target
    target = target_text(s.target_metric, s.target_accuracy)
    over = "" if s.seeds == 1 else f", each the mean of {s.seeds} seeds by MLPerf's rule"
    return (
        f"{target}: {s.shape} {time.text()} one device's, {dist:,.0f} examples to it against "
        f"{base:,.0f} ({dist / base:.2f}x as many{over}): {finishes_sooner(s)}; {DERIVED}"
    )


def format_summary(summary: ScalingSummary, ui_command: str) -> str:
    """The console's summary: the answer (`answer_lines`), then its split, the bottleneck
    and the advice, the time to target, the figures, how the setting was chosen (the
    measured candidates as a table of their own) and where to look; every line within
    `COLUMNS`."""
    s = summary
    rows = [
        *([("split", split_text(s).removeprefix(" = "))] if split_text(s) else []),
        *([("bottleneck", f"{s.bottleneck}: {s.bottleneck_evidence}")] if s.bottleneck else []),
        *[("advice" if i == 0 else "", a) for i, a in enumerate(s.advice)],
        ("to target", target_brief(s)),
        *([("loop", loop_text(s))] if s.loop == "fit" else []),
        ("measured over", s.measured_over),
        *([("interference", s.interference)] if s.interference else []),
        ("efficiency", f"{s.scaling_efficiency:.2f} (1.00 is linear)"),
        ("baseline ex/s", f"{s.baseline_examples_per_s:,.0f}"),
        ("distributed ex/s", f"{s.distributed_examples_per_s:,.0f}"),
        _short(*test_row(s)),
        ("strategy", strategy_text(s)),
        *([("forecast", s.forecast)] if s.forecast else []),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [line for k, v in rows if k or v for line in wrapped(k, v, width)]
    table = candidates_table(s)
    return "\n".join(
        [
            *answer_lines(s),
            "",
            *lines,
            *([""] + table + [""] if table else []),
            *wrapped("MLflow UI", ui_command, width),
        ]
    )


def _short(label: str, value: str) -> tuple[str, str]:
    """`test_row`'s label within the table's column."""
    return label.replace("test mean abs. error", "test abs. error"), value
