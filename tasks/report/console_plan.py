"""`tfscale plan` as the console prints it, every line within `COLUMNS` (100).

The table of devices and batches, then the fastest in at most two lines, then where each
figure came from, each source wrapped under its own column; the judge's record (`how
well`) by its first sentence, whole in plan.json and the plan's MLflow run.
"""

from __future__ import annotations

import math

from tfscale.tasks.core.progress import COLUMNS, fitted, wrapped
from tfscale.tasks.report.plan import Plan, PlanRow
from tfscale.tasks.train.to_target import target_text

HEAD = (
    f"{'devices':>7} {'batch':>5} {'global':>6} {'rate':>8} {'steps':>7} {'step ms':>7} "
    f"{'time to target':>21} {'ex/s':>6} {'to target':>9}  past B_simple"
)
CAPPED = (
    "* the rule's rate held at the highest measured to reach the target: the rule would set "
    "more, so set the rate shown by hand (train.learning_rate, train.lr_scaling: none)"
)
BRIEFED = {"how well": "plan.json"}  # a source told by its first sentence, and where the rest is


def prose(text: str) -> list[str]:
    """`text` within `COLUMNS`, continuation lines indented by two (`fitted`)."""
    return fitted(text, COLUMNS, "  ")


def format_plan(plan: Plan) -> str:
    """The table, the fastest and where each figure came from."""
    lines = [
        *prose(
            f"the fastest way to {target_text(plan.metric, plan.target)} on {plan.link}, the "
            f"rate scaled {plan.rule}, from {plan.run_dir}"
        ),
        *(prose(f"assumed: {plan.assumed}") if plan.assumed else []),
        "times: predicted (95% interval of the steps' doubts: noise scale, calibration, seeds)",
        "",
        HEAD,
        "-" * len(HEAD),
        *(row_line(r, i == plan.best) for i, r in enumerate(plan.rows)),
        *(prose(CAPPED) if any(r.rate_capped for r in plan.rows) else []),
        "",
        *fastest_lines(plan),
        "from:",
    ]
    for name, text in plan.sources.items():
        if plan.assumed and f": {plan.assumed}" in text:  # said once, above the table
            text = text.replace(f": {plan.assumed}", " (assumed: as above)")
        if name in BRIEFED:
            text = f"{text.split('. ')[0].rstrip('.')}; the rest in {BRIEFED[name]}"
        lines += wrapped(f"  {name}", text, 17)
    return "\n".join(lines)


def time_text(time_s: float, low_s: float, high_s: float) -> str:
    """A time and its interval in one unit: milliseconds below a second, else seconds;
    three figures, or whole with thousands marked from 100 (`67.8 ms (52.6-87.5)`,
    `1,234 s (1,100-1,400)`): within the table's 21 columns up to 10,000 s."""
    scale, unit = (1000, "ms") if time_s < 1 else (1, "s")

    def figure(v: float) -> str:
        v *= scale
        return f"{v:,.0f}" if math.isfinite(v) and v >= 100 else f"{v:.3g}"

    return f"{figure(time_s)} {unit} ({figure(low_s)}-{figure(high_s)})"


def row_line(r: PlanRow, fastest: bool) -> str:
    """A row of the table: within `COLUMNS`, the mark of the fastest included."""
    time = time_text(r.time_s, r.time_low_s, r.time_high_s)
    return (
        f"{r.devices:>7} {r.per_replica_batch:>5} {r.global_batch:>6} "
        f"{r.learning_rate:>7.2g}{'*' if r.rate_capped else ' '} {r.steps:>7,.0f} "
        f"{r.step_s * 1000:>7.2f} {time:>21} "
        f"{r.examples_per_s_speedup:>5.2f}x {r.time_speedup:>8.2f}x  "
        f"{'yes' if r.past_noise_scale else 'no'}{' <- fastest' if fastest else ''}"
    )


def fastest_lines(plan: Plan) -> list[str]:
    """The answer: the fastest row, its time with its interval, against one device."""
    f = plan.fastest
    return prose(
        f"fastest: {f.devices} device{'s' if f.devices > 1 else ''} at {f.per_replica_batch} "
        f"per replica (global {f.global_batch}): "
        f"{time_text(f.time_s, f.time_low_s, f.time_high_s)} to {plan.target:g}, "
        f"{f.time_speedup:.2f}x one device's time; "
        f"in examples/s {f.examples_per_s_speedup:.2f}x"
    )
