"""The scaling study's results: a grid of cells (replicas x dataset size x batch x scaling x
precision; `tasks.execute.sweep_cells` plans and trains them), each one training run, and
the table, charts and forecasts of speedup and efficiency they give."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tfscale.tasks.core.fields import PARAM
from tfscale.tasks.execute.sweep_cells import Cell


@dataclass(frozen=True)
class SweepRow:
    """One cell's row of the table. Its fields say how it is tracked (`tasks.core.fields`): the
    settings are params, the figures metrics, the bottleneck and run directory tags; a
    figure with no value (no forecast, no link) is left out."""

    size: int = field(metadata=PARAM)
    batch: int = field(metadata=PARAM)
    scaling: str = field(metadata=PARAM)
    precision: str = field(metadata=PARAM)
    replicas: int = field(metadata=PARAM)
    link_gbit: float | None = field(metadata=PARAM)
    micro_batches: int | None = field(metadata=PARAM)  # a pipeline's (replicas: its stages)
    examples_per_s: float
    speedup: float
    scaling_efficiency: float
    # the speedup's lowest and highest round, where it was measured in alternating rounds
    speedup_low: float | None
    speedup_high: float | None
    forecast_speedup: float | None
    forecast_efficiency: float | None
    strategy: str = field(metadata=PARAM)
    bottleneck: str
    run_dir: str
    host: str  # where the cell trained: a host name (and address, on a work pool)
    # the held-out target (`evaluate.target_accuracy`) first reached after this many
    # training examples and steps (None: not reached in the cell's epochs)
    examples_to_target: int | None = None
    steps_to_target: int | None = None

    @property
    def global_batch(self) -> int:
        """Examples a step: weak scaling grows the per-replica batch by the replicas (a
        pipeline's stages share one batch)."""
        grows = self.scaling == "weak" and not self.micro_batches
        return self.batch * self.replicas if grows else self.batch

    @property
    def run_name(self) -> str:
        """The cell's run name (`Cell.run_name`)."""
        return Cell.of(self.to_dict()).run_name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def shown(self) -> dict[str, Any]:
        """The row as a table shows it: figures to three decimals, no run directory."""
        values = {k: v for k, v in self.to_dict().items() if k != "run_dir"}
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in values.items()}


FORECAST_UP_TO = 8  # replicas the charts forecast to, beyond the measured ones


def forecast_lines(cells: list[Cell], results: list[dict]) -> dict[tuple, list[Any]]:
    """Each chart line's forecast (`tasks.report.forecast` predictions, 1 to FORECAST_UP_TO
    replicas and every measured count), keyed by `Cell.line`.

    Every line of a group is forecast from one source: the group's cell with the most
    replicas measured on localhost or a full-speed link. A line on a shaped link is then
    predicted from that source and the link's rate alone, so its measured points check the
    forecast. Speedups are against the group's measured 1-replica cell, as the measured
    points' are (1 at one replica). A group with no such probed cell (parameter-server
    cells) has none."""
    from tfscale.tasks.report.forecast import MEASURED, fit_cost_model, predict_speedups

    base = baselines(cells, results)
    sources: dict[tuple, tuple[Cell, dict]] = {}
    for cell, result in zip(cells, results, strict=True):
        probed = (result.get("probes") or {}).get("comm_s_by_bytes")
        if probed and cell.replicas > 1 and not cell.link_gbit:
            if cell.group not in sources or cell.replicas > sources[cell.group][0].replicas:
                sources[cell.group] = (cell, result)
    lines: dict[tuple, list[Any]] = {}
    for cell in cells:
        if cell.replicas == 1 or cell.line in lines or cell.group not in sources:
            continue
        source, result = sources[cell.group]
        counts = {c.replicas for c in cells if c.group == cell.group}
        counts |= {n for n in (1, 2, 4, 8, 16) if n <= max(FORECAST_UP_TO, *counts)}
        model = fit_cost_model(result["probes"], result.get("history"))
        if cell.link_gbit:
            links = {f"{cell.link_gbit:g} Gbit/s": cell.link_gbit}
        else:
            links = {MEASURED: model.bandwidth_bytes_per_s * 8 / 1e9}
        predicted = predict_speedups(
            model, links, sorted(counts), source.scaling, result["global_batch"]
        )
        points = next(iter(predicted.predictions.values()))
        lines[cell.line] = [_against(p, base[cell.group]) for p in points]
    return lines


def baselines(cells: list[Cell], results: list[dict]) -> dict[tuple, float]:
    """Each group's 1-replica examples/s: what its speedups divide by."""
    return {
        c.group: r["examples_per_s"] for c, r in zip(cells, results, strict=True) if c.replicas == 1
    }


def _against(point: Any, baseline: float) -> Any:
    """A prediction's speedup and efficiency against a measured baseline (1 at one replica,
    which is that baseline)."""
    speedup = 1.0 if point.workers == 1 else point.examples_per_s / baseline
    return dataclasses.replace(point, speedup=speedup, efficiency=speedup / point.workers)


def tabulate(
    cells: list[Cell], results: list[dict], forecasts: dict | None = None
) -> list[SweepRow]:
    """One row per cell, with speedup and efficiency against its group's 1-replica cell,
    and what its line's forecast (default: `forecast_lines`) predicts for it (None where
    there is no forecast)."""
    base = baselines(cells, results)
    if forecasts is None:
        forecasts = forecast_lines(cells, results)
    rows = []
    for cell, result in zip(cells, results, strict=True):
        measured = _rounds_speedup(result)
        speedup = measured.median if measured else result["examples_per_s"] / base[cell.group]
        points = {p.workers: p for p in forecasts.get(cell.line, [])}
        if cell.replicas == 1:  # the same on every line of its group
            lines = [line for line in forecasts if line[0] == cell.group]
            points = {p.workers: p for p in forecasts[lines[0]]} if lines else {}
        point = points.get(cell.replicas)
        rows.append(
            SweepRow(
                **asdict(cell),
                examples_per_s=result["examples_per_s"],
                speedup=speedup,
                scaling_efficiency=speedup / cell.replicas,
                speedup_low=measured.low if measured else None,
                speedup_high=measured.high if measured else None,
                forecast_speedup=point.speedup if point else None,
                forecast_efficiency=point.efficiency if point else None,
                strategy=result["strategy"],
                bottleneck=result["bottleneck"],
                run_dir=result["run_dir"],
                host=result.get("host", ""),
                **_to_target(result),
            )
        )
    return rows


def _to_target(result: dict) -> dict[str, Any]:
    target = result.get("to_target") or {}
    if not target.get("reached"):
        return {}
    return {"examples_to_target": target["examples"], "steps_to_target": target["steps"]}


@dataclass(frozen=True)
class CriticalBatch:
    """McCandlish's hyperbola S = S_min(1 + B_noise/B) fitted to the steps to target that
    cells of one dataset, scaling and precision measured at three or more global batches;
    B_noise is the critical batch (E_min/S_min), beside the noise scale B_simple the
    smallest batch's cell measured in its steps (None where it recorded none)."""

    size: int
    scaling: str
    precision: str
    batches: tuple[int, ...]
    steps: tuple[float, ...]  # each batch's mean over its cells
    s_min: float
    e_min: float
    b_crit: float
    noise_scale: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        data = f"{self.size} examples" if self.size else "dataset"
        simple = f", B_simple {self.noise_scale:,.0f}" if self.noise_scale is not None else ""
        points = ", ".join(
            f"{s:,.0f} at {b}" for b, s in zip(self.batches, self.steps, strict=True)
        )
        return (
            f"{data}, {self.scaling}, {self.precision}: critical batch {self.b_crit:,.0f}"
            f"{simple} (steps to target {points}; S_min {self.s_min:,.0f}, E_min "
            f"{self.e_min:,.0f})"
        )


def critical_batches(table: list[SweepRow], results: list[dict]) -> list[CriticalBatch]:
    """The critical batch of every group of cells (dataset, scaling, precision) that reached
    the target at three or more global batches; a group whose steps do not fall as the
    batch grows is left out."""
    from tfscale.tasks.measure.noise_trajectory import (
        fit_steps_hyperbola,
        split_examples,
        trajectory,
    )

    groups: dict[tuple, list[tuple[SweepRow, dict]]] = {}
    for row, result in zip(table, results, strict=True):
        if row.steps_to_target is not None:
            groups.setdefault((row.size, row.scaling, row.precision), []).append((row, result))
    found = []
    for (size, scaling, precision), members in groups.items():
        by_batch: dict[int, list[int]] = {}
        for row, _ in members:
            by_batch.setdefault(row.global_batch, []).append(row.steps_to_target)
        if len(by_batch) < 3:
            continue
        batches = sorted(by_batch)
        steps = [sum(by_batch[b]) / len(by_batch[b]) for b in batches]
        try:
            fitted = fit_steps_hyperbola(batches, steps)
        except ValueError:
            continue
        smallest = min(members, key=lambda m: (m[0].global_batch, m[0].replicas))
        path = trajectory(
            smallest[1].get("gradient_noise") or [], examples=split_examples(smallest[1])
        )
        simple = path.headline_value("raw") if path.end_steps else math.nan
        found.append(
            CriticalBatch(
                size,
                scaling,
                precision,
                tuple(batches),
                tuple(steps),
                fitted.s_min,
                fitted.e_min,
                fitted.b_crit,
                None if math.isnan(simple) else simple,
            )  # fmt: skip
        )
    return found


def _rounds_speedup(result: dict) -> Any:
    """A cell's speedup over one device measured in alternating rounds by its diagnosis (a
    cell of several replicas in this process), or None (its speedup then divides its
    training's examples/s by its group's 1-replica cell's)."""
    from tfscale.tasks.measure.probes import RoundRates

    rounds = (result.get("diagnosis") or {}).get("rounds")
    return RoundRates(**rounds).speedup if rounds else None


def write_outputs(
    table: list[SweepRow],
    out_dir: Path,
    forecasts: dict | None = None,
    critical: list[CriticalBatch] = (),  # type: ignore[assignment]
) -> dict[str, Path]:
    """`sweep.csv` and `sweep.json` (DVC plots and metrics), the two charts, with each
    line's forecast (`forecast_lines`) drawn over its measured points, and
    `critical_batch.json` (`critical_batches`; an empty list where none was fitted)."""
    rows = [row.to_dict() for row in table]
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"table": out_dir / "sweep.csv", "json": out_dir / "sweep.json"}
    files["critical_batch"] = out_dir / "critical_batch.json"
    files["critical_batch"].write_text(json.dumps([c.to_dict() for c in critical], indent=2))
    with open(files["table"], "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    files["json"].write_text(json.dumps(rows, indent=2))
    files["speedup"] = plot(rows, "speedup", out_dir / "speedup.png", forecasts)
    files["efficiency"] = plot(rows, "scaling_efficiency", out_dir / "efficiency.png", forecasts)
    if any(r["link_gbit"] is not None for r in rows):
        files["links"] = plot_links(rows, out_dir / "speedup_by_link.png")
    return files


def plot_links(rows: list[dict], path: Path) -> Path:
    """Speedup against the link rate (slowest left, full speed right): one line per group
    and replica count, measured (solid) and forecast (dotted)."""
    from tfscale.tasks.core.plots import pyplot

    plt = pyplot()
    linked = [r for r in rows if r["link_gbit"] is not None]
    rates = sorted({r["link_gbit"] for r in linked}, key=lambda g: (g == 0, g))
    ticks = [_link(g) for g in rates]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    lines: dict[tuple, list[dict]] = {}
    for row in linked:
        cell = Cell.of(row)
        lines.setdefault((*cell.group, cell.replicas), []).append(row)
    for members in lines.values():
        members.sort(key=lambda r: rates.index(r["link_gbit"]))
        xs = [rates.index(r["link_gbit"]) for r in members]
        cell = Cell.of(members[0])
        label = f"{cell.replicas} replicas, " + dataclasses.replace(cell, link_gbit=None).label
        (drawn,) = ax.plot(xs, [r["speedup"] for r in members], "o-", label=label)
        known = [(x, r["forecast_speedup"]) for x, r in zip(xs, members, strict=True)]
        known = [(x, f) for x, f in known if f is not None]
        if known:
            ax.plot(*zip(*known, strict=True), "x:", color=drawn.get_color(), label="forecast")
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="one replica")
    ax.set_xticks(range(len(rates)), [f"{t}bit/s" if t.endswith("G") else t for t in ticks])
    ax.set_xlabel("link between the worker processes (Gbit/s, or full speed)")
    ax.set_ylabel("speedup")
    ax.set_title("speedup against interconnect: measured (solid), forecast (dotted)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _draw_ranges(ax: Any, metric: str, rows: list[dict], color: str) -> None:
    """Error bars: each speedup's range over the alternating rounds it was measured in (an
    efficiency's, divided by the replicas)."""
    ranged = [r for r in rows if r.get("speedup_low") is not None]
    if not ranged:
        return
    scale = [1.0 if metric == "speedup" else 1.0 / r["replicas"] for r in ranged]
    low = [r[metric] - r["speedup_low"] * k for r, k in zip(ranged, scale, strict=True)]
    high = [r["speedup_high"] * k - r[metric] for r, k in zip(ranged, scale, strict=True)]
    xs, ys = [r["replicas"] for r in ranged], [r[metric] for r in ranged]
    ax.errorbar(xs, ys, yerr=[low, high], fmt="none", ecolor=color, capsize=3)


def _chart_lines(rows: list[dict]) -> dict[tuple, list[tuple[Cell, dict]]]:
    """Each chart line's (cell, row) points by replicas: the cells of more replicas by their
    line, and each group's 1-replica cell on every line of its group."""
    cells = [Cell.of(r) for r in rows]
    lines: dict[tuple, list[tuple[Cell, dict]]] = {}
    for cell, row in zip(cells, rows, strict=True):
        if cell.replicas > 1:
            lines.setdefault(cell.line, []).append((cell, row))
    for cell, row in zip(cells, rows, strict=True):
        if cell.replicas == 1:
            owned = [line for line in lines if line[0] == cell.group] or [cell.line]
            for line in owned:
                lines.setdefault(line, []).append((cell, row))
    for members in lines.values():
        members.sort(key=lambda m: m[0].replicas)
    return lines


def plot(rows: list[dict], metric: str, path: Path, forecasts: dict | None = None) -> Path:
    """`metric` against replicas, one line per group and link (each group's 1-replica point
    on each of its lines), each line's forecast dotted over its measured points (to
    FORECAST_UP_TO replicas), the ideal dashed."""
    from tfscale.tasks.core.plots import pyplot

    plt = pyplot()
    forecasts = forecasts or {}
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    replicas = sorted({r["replicas"] for r in rows})
    for points in forecasts.values():
        replicas = sorted({*replicas, *(p.workers for p in points)})
    ideal = replicas if metric == "speedup" else [1.0] * len(replicas)
    ax.plot(replicas, ideal, "k--", label="ideal (linear)")
    for line, members in _chart_lines(rows).items():
        label = max(members, key=lambda m: m[0].replicas)[0].label
        xs, ys = [c.replicas for c, _ in members], [r[metric] for _, r in members]
        (drawn,) = ax.plot(xs, ys, "o-", label=label)
        _draw_ranges(ax, metric, [r for _, r in members], drawn.get_color())
        if line in forecasts:
            field = "speedup" if metric == "speedup" else "efficiency"
            ax.plot(
                [p.workers for p in forecasts[line]],
                [getattr(p, field) for p in forecasts[line]],
                ":",
                color=drawn.get_color(),
                label=f"{label}: forecast",
            )
    ax.set_xticks(replicas)
    devices = "pipeline stages" if any(r.get("micro_batches") for r in rows) else "replicas"
    ax.set_xlabel(devices)
    ax.set_ylabel(metric.replace("_", " "))
    name = metric.replace("_", " ")
    ax.set_title(
        f"{name} against {devices}: measured (solid; bars: its rounds' range), forecast (dotted)",
        fontsize=10,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def format_table(table: list[SweepRow]) -> str:
    """The table as the console shows it; with a host column when cells trained on more
    than one host (a work pool's)."""
    hosts = len({row.host for row in table}) > 1
    width = max((len(row.bottleneck) for row in table), default=10)
    header = (
        f"{'size':>8} {'batch':>6} {'scaling':>7} {'precision':>15} {'replicas':>8} {'link':>6} "
        f"{'examples/s':>11} {'speedup':>8} {'efficiency':>10} {'forecast':>8} "
        f"{'to target':>10}  " + (f"{'bottleneck':<{width}}  host" if hosts else "bottleneck")
    )
    lines = [header, "-" * len(header)]
    for r in (row.to_dict() for row in table):
        lines.append(
            f"{r['size'] or '-':>8} {r['batch']:>6} {r['scaling']:>7} {r['precision']:>15} "
            f"{r['replicas']:>8} {_link(r['link_gbit']):>6} {r['examples_per_s']:>11,.0f} "
            f"{r['speedup']:>8.2f} "
            f"{r['scaling_efficiency']:>10.2f} {_figure(r['forecast_speedup']):>8} "
            f"{_examples(r['examples_to_target']):>10}"
            + (f"  {r['bottleneck']:<{width}}  {r['host']}" if hosts else f"  {r['bottleneck']}")
        )
    return "\n".join(lines)


def _examples(value: int | None) -> str:
    """Examples to target for the table ('-': not reached)."""
    return "-" if value is None else f"{value:,}"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _link(link_gbit: float | None) -> str:
    """A cell's link for the table: '-' (localhost or one replica), 'full', or Gbit/s."""
    if link_gbit is None:
        return "-"
    return "full" if link_gbit == 0 else f"{link_gbit:g}G"
