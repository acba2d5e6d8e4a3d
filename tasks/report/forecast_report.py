"""The forecast for people and files: its table, its one-line headline, its charts, and
a run's forecast read from the run directory and written beside it (`forecast.json` and
the charts). The cost model itself is `tasks/report/forecast.py`."""

from __future__ import annotations

import math
from typing import Any

from tfscale.tasks.core.run_layout import METRICS
from tfscale.tasks.report.forecast import (
    MEASURED,
    CostModel,
    Forecast,
    fit_cost_model,
    links_from,
    predict_speedups,
)


def gbit_text(gbit: float) -> str:
    """A rate for people; an infinite one is an all-reduce whose time did not grow with
    its size (devices in one process): no cost per byte could be measured."""
    return f"{gbit:.3g} Gbit/s" if math.isfinite(gbit) else "no cost per byte"


def moved(m: CostModel) -> str:
    gbit = m.bandwidth_bytes_per_s * 8 / 1e9
    if math.isfinite(gbit):
        return f"the hosts move {gbit:.3g} Gbit/s"
    return "no cost per byte measured (the devices share one process)"


def with_time_to_target(
    predicted: Forecast, metrics: dict[str, Any], study: dict[str, Any] | None = None
) -> Forecast:
    """`predicted` with each prediction's steps and time to the run's held-out target: the steps
    at the prediction's global batch from the run's own steps to it, its gradient noise
    scale and the rate its rule gives that batch, calibrated from `study` (the run's
    summary: its baseline beside it; `tasks.report.plan.pricing_of`), times the predicted
    step; against one device at the baseline's batch, likewise. Unchanged where the run did
    not reach the target or recorded no measurable noise scale; a prediction whose rate
    would pass the highest measured to reach the target, with the rule uncalibrated, gets
    none."""
    import dataclasses

    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.report.plan import pricing_of

    target = metrics.get("to_target") or {}
    m = predicted.model
    if not target.get("reached"):
        return predicted
    try:
        pricing, _ = pricing_of(metrics, target["steps"], m.per_replica_batch, study)
    except UsageError:  # no noise scale recorded, or none measurable
        return predicted
    whole = pricing.run_batch
    one_batch = m.per_replica_batch if predicted.scaling == "weak" else whole
    one_device = pricing.steps(one_batch)[0] * m.compute_s(one_batch)
    for name, points in predicted.predictions.items():
        placed = []
        for p in points:
            batch = p.workers * m.per_replica_batch if predicted.scaling == "weak" else whole
            if not pricing.priceable(batch):
                placed.append(p)
                continue
            steps = pricing.steps(batch)[0]
            speedup = one_device / (steps * p.step_s)
            placed.append(
                dataclasses.replace(p, steps_to_target=steps, time_to_target_speedup=speedup)
            )
        predicted.predictions[name] = placed
    return predicted


def format_forecast(predicted: Forecast) -> str:
    m = predicted.model
    lines = [
        f"cost model ({predicted.scaling} scaling, per-replica batch {m.per_replica_batch}, "
        f"{m.gradient_bytes / 1024:,.0f} KiB of gradients):",
        f"  compute  {m.compute_fixed_s * 1000:.2f} ms + {m.compute_per_example_s * 1e6:.2f} "
        f"us/example (fit error {m.compute_fit_error:.1%})",
        f"  link     {m.latency_s * 1e6:.0f} us per hop, {moved(m)} (fit error "
        f"{m.comm_fit_error:.1%}); a named link adds its wire time",
        f"  sync     {m.sync_s * 1000:.2f} ms per step; input {m.input_examples_per_s:,.0f} "
        f"ex/s per worker; an epoch's fixed cost {m.epoch_overhead_s * 1000:.0f} ms",
        "",
        f"{'link':<28}{'workers':>8}{'step ms':>10}{'ex/s':>12}{'speedup':>9}"
        f"{'efficiency':>12}{'to target':>11}  {'bottleneck':<14}epoch-bound below",
    ]
    for name, points in predicted.predictions.items():
        label = f"{name} ({gbit_text(predicted.links_gbit[name])})" if name == MEASURED else name
        for p in points:
            to_target = (
                "-" if p.time_to_target_speedup is None else f"{p.time_to_target_speedup:.2f}x"
            )
            lines.append(
                f"{label:<28}{p.workers:>8}{p.step_s * 1000:>10.2f}{p.examples_per_s:>12,.0f}"
                f"{p.speedup:>8.2f}x{p.efficiency:>12.2f}{to_target:>11}  {p.bottleneck:<14}"
                f"{p.epoch_bound_below:,.0f} examples"
            )
            label = ""
    return "\n".join(lines)


def headline(predicted: Forecast, counts: tuple[int, ...] = (8, 64)) -> str:
    """One line for the run's summary: the speedup at a few worker counts on each named
    link (and in time to the target, where predicted), and what bounds the largest."""
    parts, bound = [], ""
    for name, points in predicted.predictions.items():
        chosen = [p for p in points if p.workers in counts]
        if name == MEASURED or not chosen:
            continue
        part = f"{' / '.join(f'{p.speedup:.1f}x' for p in chosen)} on {name}"
        if all(p.time_to_target_speedup is not None for p in chosen):
            to_target = " / ".join(f"{p.time_to_target_speedup:.1f}x" for p in chosen)
            part += f" ({to_target} to the target)"
        parts.append(part)
        bound = bound or f"{chosen[-1].bottleneck} at {chosen[-1].workers}"
    if not parts:
        return ""
    shown = " / ".join(str(n) for n in counts)
    return f"{shown} devices like these: {', '.join(parts)} ({bound}; tfscale forecast)"


def plot_forecast(predicted: Forecast, out_dir: Any) -> list[Any]:
    """Speedup and efficiency against workers, one line per link, the ideal dashed."""
    from pathlib import Path

    from tfscale.tasks.core.plots import pyplot

    plt = pyplot()
    paths = []
    for key, ideal, label in (
        ("speedup", lambda n: n, "speedup over one device"),
        ("efficiency", lambda n: 1.0, "scaling efficiency"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        workers = [p.workers for p in next(iter(predicted.predictions.values()))]
        ax.plot(workers, [ideal(n) for n in workers], "k--", label="ideal")
        for name, points in predicted.predictions.items():
            gbit = predicted.links_gbit[name]
            label_ = f"{name} ({gbit_text(gbit)})" if name == MEASURED else name
            ax.plot(workers, [getattr(p, key) for p in points], "o-", label=label_)
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers, [str(n) for n in workers])
        ax.minorticks_off()
        if key == "speedup":
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_xlabel("workers")
        ax.set_ylabel(label)
        ax.set_title(f"forecast: {label} ({predicted.scaling} scaling)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        path = Path(out_dir) / f"forecast_{key}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def probed_run(runs_dir: str, dataset: str, run_dir: str | None = None) -> Any:
    """The run directory to forecast from: `run_dir`, or the newest run of `dataset` whose
    metrics hold the all-reduce measured at several sizes (a diagnosed run of several
    replicas: Mirrored, or multi-worker).

    Raises:
        MissingInput: no such run, saying which command makes one.
    """
    import json
    from pathlib import Path

    from tfscale.tasks.core.errors import MissingInput

    make = (
        f"run 'tfscale run' (a Mirrored or multi-worker run) or 'tfscale train --dataset "
        f"{dataset} --strategy multi_worker --workers 2' first (without --no-diagnose), or "
        "pass --run-dir."
    )
    if run_dir is not None:
        path = Path(run_dir) / METRICS
        if not path.exists():
            raise MissingInput(f"no completed run in {run_dir} (metrics.json missing)", make)
        return Path(run_dir)
    candidates = sorted(
        Path(runs_dir, dataset).glob(f"*/{METRICS}"), key=lambda p: p.stat().st_mtime
    )
    for path in reversed(candidates):
        if json.loads(path.read_text()).get("probes", {}).get("comm_s_by_bytes"):
            return path.parent
    raise MissingInput(f"no run of {dataset!r} with all-reduce measurements under {runs_dir}", make)


def forecast_run(
    run_dir: Any,
    workers: list[int],
    gbits: list[float],
    presets: list[str],
    scaling: str,
    out_dir: Any = None,
    study: dict[str, Any] | None = None,
) -> tuple[Forecast, list[Any]]:
    """Fits the run's cost model and forecasts it, its time to target calibrated from
    `study` (default: the run's summary.json, where there is one); writes `forecast.json`
    and the two charts to `out_dir` (default: the run's directory). Returns the forecast
    and the files written."""
    import json
    from pathlib import Path

    from tfscale.tasks.core.files import write_json_atomic

    metrics = json.loads((Path(run_dir) / METRICS).read_text())
    model = fit_cost_model(metrics.get("probes") or {}, metrics.get("history"))
    links = links_from(gbits, presets, model)
    result = predict_speedups(model, links, workers, scaling, metrics.get("global_batch"))
    summary = Path(run_dir) / "summary.json"
    if study is None and summary.exists():
        study = json.loads(summary.read_text())
    result = with_time_to_target(result, metrics, study)
    out = Path(out_dir or run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [write_json_atomic(out / "forecast.json", result.to_dict())]
    return result, written + plot_forecast(result, out)
