"""The scaling study: a grid of cells (replicas x dataset size x batch x scaling x precision),
each one training run, and the table and charts of speedup and efficiency they give."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tasks.config import Config
from tasks.strategy_kinds import BASELINE, kind_of


@dataclass(frozen=True)
class Cell:
    size: int  # synthetic training examples; 0 means the configured dataset
    batch: int
    scaling: str
    precision: str
    replicas: int

    @property
    def group(self) -> tuple:
        """Cells that differ only in replicas: one line on the chart."""
        return (self.size, self.batch, self.scaling, self.precision)

    @property
    def label(self) -> str:
        data = f"{self.size} examples" if self.size else "dataset"
        return f"{data}, batch {self.batch}, {self.scaling}, {self.precision}"


def plan_cells(config: Config) -> list[Cell]:
    """Every combination, always with 1 replica (the baseline each speedup divides by)."""
    s = config.sweep
    replicas = sorted({1, *s.replicas})
    return [
        Cell(*combo)
        for combo in itertools.product(
            s.dataset_sizes, s.batch_sizes, s.scaling, s.precision, replicas
        )
    ]


def cell_config(config: Config, cell: Cell) -> Config:
    """The full config of one cell's training run."""
    prepare = config.prepare
    if cell.size:
        synthetic = dataclasses.replace(prepare.synthetic, train_examples=cell.size)
        prepare = dataclasses.replace(prepare, dataset="synthetic", synthetic=synthetic)
    kind = kind_of(config.sweep.strategy)
    multi = cell.replicas > 1 and kind.takes_workers
    train = dataclasses.replace(
        config.train,
        model=config.sweep.model,
        epochs=config.sweep.epochs,
        batch_size_per_replica=cell.batch,
        scaling=cell.scaling,
        precision=cell.precision,
        replicas=cell.replicas,
        workers=cell.replicas if multi else 1,
        strategy=BASELINE.name if cell.replicas == 1 else kind.name,
    )
    return dataclasses.replace(config, prepare=prepare, train=train)


FORECAST_UP_TO = 8  # replicas the charts forecast to, beyond the measured ones


def forecast_groups(cells: list[Cell], results: list[dict]) -> dict[tuple, Any]:
    """Each group's forecast (`tasks.forecast`) at the measured link, from the probes of its
    cell with the most replicas, for 1 to FORECAST_UP_TO replicas and every measured count.
    A group with no probed multi-replica cell (parameter-server cells) has none."""
    from tasks.forecast import MEASURED, fit_cost_model, forecast

    chosen: dict[tuple, tuple[Cell, dict]] = {}
    for cell, result in zip(cells, results, strict=True):
        probes = result.get("probes") or {}
        if probes.get("comm_s_by_bytes") and cell.replicas > 1:
            if cell.group not in chosen or cell.replicas > chosen[cell.group][0].replicas:
                chosen[cell.group] = (cell, result)
    forecasts = {}
    for group, (cell, result) in chosen.items():
        counts = {c.replicas for c in cells if c.group == group}
        counts |= {n for n in (1, 2, 4, 8, 16) if n <= max(FORECAST_UP_TO, *counts)}
        model = fit_cost_model(result["probes"], result.get("history"))
        links = {MEASURED: model.bandwidth_bytes_per_s * 8 / 1e9}
        forecasts[group] = forecast(
            model, links, sorted(counts), cell.scaling, result.get("global_batch")
        )
    return forecasts


def tabulate(cells: list[Cell], results: list[dict], forecasts: dict | None = None) -> list[dict]:
    """One row per cell, with speedup and efficiency against its group's 1-replica cell,
    and what the group's forecast (default: `forecast_groups`) predicts for it (None where
    there is no forecast)."""
    from tasks.forecast import MEASURED

    base = {
        c.group: r["examples_per_s"] for c, r in zip(cells, results, strict=True) if c.replicas == 1
    }
    if forecasts is None:
        forecasts = forecast_groups(cells, results)
    rows = []
    for cell, result in zip(cells, results, strict=True):
        speedup = result["examples_per_s"] / base[cell.group]
        predicted = {}
        if cell.group in forecasts:
            predicted = {p.workers: p for p in forecasts[cell.group].predictions[MEASURED]}
        point = predicted.get(cell.replicas)
        rows.append(
            dict(
                asdict(cell),
                examples_per_s=result["examples_per_s"],
                speedup=speedup,
                scaling_efficiency=speedup / cell.replicas,
                forecast_speedup=point.speedup if point else None,
                forecast_efficiency=point.efficiency if point else None,
                strategy=result["strategy"],
                bottleneck=result["bottleneck"],
                run_dir=result["run_dir"],
            )
        )
    return rows


def write_outputs(
    rows: list[dict], out_dir: Path, forecasts: dict | None = None
) -> dict[str, Path]:
    """`sweep.csv` and `sweep.json` (DVC plots and metrics) and the two charts, with each
    group's forecast (`forecast_groups`) drawn over its measured points."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"table": out_dir / "sweep.csv", "json": out_dir / "sweep.json"}
    with open(files["table"], "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    files["json"].write_text(json.dumps(rows, indent=2))
    files["speedup"] = plot(rows, "speedup", out_dir / "speedup.png", forecasts)
    files["efficiency"] = plot(rows, "scaling_efficiency", out_dir / "efficiency.png", forecasts)
    return files


def plot(rows: list[dict], metric: str, path: Path, forecasts: dict | None = None) -> Path:
    """`metric` against replicas, one line per group, each group's forecast dotted over its
    measured points (to FORECAST_UP_TO replicas), the ideal dashed."""
    from tasks.forecast import MEASURED
    from tasks.plots import pyplot

    plt = pyplot()
    forecasts = forecasts or {}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    replicas = sorted({r["replicas"] for r in rows})
    for f in forecasts.values():
        replicas = sorted({*replicas, *(p.workers for p in f.predictions[MEASURED])})
    ideal = replicas if metric == "speedup" else [1.0] * len(replicas)
    ax.plot(replicas, ideal, "k--", label="ideal (linear)")
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(
            Cell(
                **{k: row[k] for k in ("size", "batch", "scaling", "precision", "replicas")}
            ).label,
            [],
        ).append(row)
    for label, group in groups.items():
        group.sort(key=lambda r: r["replicas"])
        (line,) = ax.plot(
            [r["replicas"] for r in group], [r[metric] for r in group], marker="o", label=label
        )
        key = tuple(group[0][k] for k in ("size", "batch", "scaling", "precision"))  # Cell.group
        if key in forecasts:
            points = forecasts[key].predictions[MEASURED]
            field = "speedup" if metric == "speedup" else "efficiency"
            ax.plot(
                [p.workers for p in points],
                [getattr(p, field) for p in points],
                ":",
                color=line.get_color(),
                label=f"{label}: forecast",
            )
    ax.set_xticks(replicas)
    ax.set_xlabel("replicas")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(
        f"{metric.replace('_', ' ')} against replica count, one line per dataset size and batch"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def format_table(rows: list[dict]) -> str:
    header = (
        f"{'size':>8} {'batch':>6} {'scaling':>7} {'precision':>15} {'replicas':>8} "
        f"{'examples/s':>11} {'speedup':>8} {'efficiency':>10} {'forecast':>8}  bottleneck"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['size'] or '-':>8} {r['batch']:>6} {r['scaling']:>7} {r['precision']:>15} "
            f"{r['replicas']:>8} {r['examples_per_s']:>11,.0f} {r['speedup']:>8.2f} "
            f"{r['scaling_efficiency']:>10.2f} {_figure(r['forecast_speedup']):>8}"
            f"  {r['bottleneck']}"
        )
    return "\n".join(lines)


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
