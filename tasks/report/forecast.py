"""How training would scale beyond this machine, from a run's own measurements.

A small, explicit cost model of one synchronous data-parallel step on N workers, each
worker one device like the ones measured, connected by links of `link` bytes/s:

    step(N, b)   = compute(b) + allreduce(N) + sync          (sync only when N > 1)
    compute(b)   = c0 + c1 * b                               (b: per-replica batch)
    allreduce(N) = 2 (N - 1) * alpha + 2 (N - 1) / N * G * (1 / host + 1 / link)
    input(b)     = b / r_in                                   (each worker's pipeline)
    time(N, b)   = max(step(N, b), input(b))                  (input overlaps the step)
    throughput   = N * b / time(N, b)

`G` is the model's gradient bytes. The all-reduce term is a ring all-reduce: each worker
sends and receives 2 (N - 1) / N of the bytes over 2 (N - 1) hops, each costing a latency
`alpha`. Each byte costs the hosts' own time (`host`: their network stack and copies,
measured) plus its time on the wire (`1 / link`; none for the measured link). On test
hosts whose link was shaped with `tbf` the two added up: a 1 Gbit/s link moved an
all-reduce at about 1 / (1 / 0.83 + 1 / 1) Gbit/s when the hosts alone managed 0.83.
A single device (the speedup's baseline) takes compute(b') for its batch b' (the
per-replica batch under weak scaling, the global batch under strong).

Dataset size does not change a step; it changes how many steps an epoch has. An epoch also
pays a fixed cost `e0` (its input iterator, the step counter, the first call's dispatch):

    epoch(N, D)  = e0 + D / throughput(N)
    D*(N)        = e0 * throughput(N)                        (steps and e0 equal)

Below D* examples an epoch is bound by its fixed cost, not by input, compute or
communication; above it, by the step's own bottleneck. More workers raise throughput and so
raise D*: a small dataset stops scaling first.

The constants are fitted to in-place measurements (`tasks.measure.in_place`): c0 and c1 to the
local step at a few batch sizes; alpha and `host` to the all-reduce at a few message sizes
(the measured link is taken to be faster than the hosts, as a virtual or local one is);
`sync` is what a measured step had beyond the local step and the fitted all-reduce of its
gradient bytes; `r_in` the slowest worker's input pipeline; `e0` the median over the run's
timed epochs (after the first) of the epoch's time beyond its steps at the measured
end-to-end step time. Each fit reports its largest relative error.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tfscale.tasks.core.errors import UsageError

# Link presets in Gbit/s per direction, as their specifications give them (README cites
# each source). PCIe: x16 slots, after line coding.
LINK_PRESETS: dict[str, float] = {
    "pcie3-x16": 126.0,  # 15.75 GB/s (PCI Express 3.0, 8 GT/s x 16, 128b/130b)
    "pcie4-x16": 252.0,  # 31.5 GB/s (PCI Express 4.0)
    "pcie5-x16": 504.0,  # 63 GB/s (PCI Express 5.0)
    "nvlink3": 2400.0,  # 300 GB/s each way (A100: 600 GB/s total)
    "nvlink4": 3600.0,  # 450 GB/s each way (H100: 900 GB/s total)
    "ethernet-1g": 1.0,
    "ethernet-10g": 10.0,
    "ethernet-25g": 25.0,
    "ethernet-100g": 100.0,
    "ethernet-400g": 400.0,
}
DEFAULT_WORKERS = (1, 2, 4, 8, 16, 32, 64)
RUN_PRESETS = ("ethernet-10g", "ethernet-100g")  # beside the measured link in `tfscale run`
MEASURED = "measured"


class ForecastError(UsageError, ValueError):
    """A forecast asked for something the measurements or the presets cannot give."""


def link_named(text: str) -> tuple[str, float]:
    """`--link`: a preset's name, a rate in Gbit/s, or the run's own (`MEASURED`), as its
    name and rate (0 for the run's own)."""
    from tfscale.tasks.core.errors import UsageError

    if text == MEASURED:
        return MEASURED, 0.0
    if text in LINK_PRESETS:
        return text, LINK_PRESETS[text]
    try:
        gbit = float(text)
    except ValueError:
        raise UsageError(
            f"unknown link {text!r}",
            f"use measured, a rate in Gbit/s, or one of: {', '.join(LINK_PRESETS)}.",
        ) from None
    if not gbit > 0 or gbit == float("inf"):  # NaN is neither above 0 nor at most 0
        raise UsageError(f"--link: a link of {gbit:g} Gbit/s", "give a finite rate above 0.")
    return f"{gbit:g} Gbit/s", gbit


@dataclass(frozen=True)
class Fit:
    """y = intercept + slope * x, with its largest relative error over the points."""

    intercept: float
    slope: float
    max_error: float

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(points: list[list[float]]) -> Fit:
    """Least squares over [x, y] points (intercept and slope clamped at 0: a negative
    time has no meaning)."""
    if len(points) < 2:
        raise ForecastError("a fit needs measurements at two sizes at least")
    n = len(points)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = max(sum((x - mx) * (y - my) for x, y in points) / sxx, 0.0) if sxx else 0.0
    intercept = max(my - slope * mx, 0.0)
    line = Fit(intercept, slope, 0.0)
    error = max(abs(line(x) - y) / y for x, y in points if y > 0)
    return Fit(intercept, slope, error)


@dataclass(frozen=True)
class CostModel:
    """The fitted constants (seconds, bytes, examples)."""

    compute_fixed_s: float  # c0
    compute_per_example_s: float  # c1
    compute_fit_error: float
    latency_s: float  # alpha, per ring hop
    bandwidth_bytes_per_s: float  # the hosts' own (measured; the link taken as faster)
    comm_fit_error: float
    sync_s: float
    input_examples_per_s: float  # the slowest worker's pipeline alone
    gradient_bytes: int
    per_replica_batch: int
    measured_workers: int
    epoch_overhead_s: float = 0.0  # e0: an epoch's fixed cost beside its steps

    def compute_s(self, batch: float) -> float:
        return self.compute_fixed_s + self.compute_per_example_s * batch

    def allreduce_s(self, workers: int, link: float | None) -> float:
        """Seconds per ring all-reduce of the gradients on links of `link` bytes/s (None:
        the measured link)."""
        if workers == 1:
            return 0.0
        hops = 2 * (workers - 1)
        per_byte = 1 / self.bandwidth_bytes_per_s
        return (
            hops * self.latency_s
            + hops / workers * self.gradient_bytes * per_byte
            + (self.wire_s(workers, link))
        )

    def wire_s(self, workers: int, link: float | None) -> float:
        """Seconds a ring all-reduce's bytes spend on links of `link` bytes/s, beyond the
        hosts' own cost per byte (0 on the measured link)."""
        if workers == 1 or not link:
            return 0.0
        return 2 * (workers - 1) / workers * self.gradient_bytes / link

    def predict(
        self, workers: int, link: float | None, scaling: str, global_batch: int | None = None
    ) -> Prediction:
        """One point of the forecast: N workers on links of `link` bytes/s (None: the
        measured link)."""
        if workers < 1:
            raise ForecastError(f"workers must be 1 or more, not {workers}")
        whole = global_batch or self.per_replica_batch * self.measured_workers
        batch = self.per_replica_batch if scaling == "weak" else whole / workers
        baseline_batch = self.per_replica_batch if scaling == "weak" else whole
        compute = self.compute_s(batch)
        comm = self.allreduce_s(workers, link)
        # the rest of a measured step (the gradients' several tensors' latencies, a peer's
        # lateness) is waiting that bytes on a slower wire overlap: measured with a link
        # shaped to 100 Mbit/s, it falls from 2.6 ms to 0 while the all-reduce grows 15 ms
        sync = max(self.sync_s - self.wire_s(workers, link), 0.0) if workers > 1 else 0.0
        step = compute + comm + sync
        input_s = batch / self.input_examples_per_s if self.input_examples_per_s else 0.0
        time = max(step, input_s)
        rate = workers * batch / time
        baseline = baseline_batch / self.compute_s(baseline_batch)
        parts = {"input": input_s, "compute": compute, "communication": comm, "sync": sync}
        return Prediction(
            workers=workers,
            step_s=time,
            examples_per_s=rate,
            speedup=rate / baseline,
            efficiency=rate / baseline / workers,
            bottleneck="input" if input_s > step else max(parts, key=parts.get),
            epoch_bound_below=self.epoch_overhead_s * rate,
        )


@dataclass(frozen=True)
class Prediction:
    workers: int
    step_s: float
    examples_per_s: float
    speedup: float
    efficiency: float
    bottleneck: str  # the largest part of a step: input, compute, communication or sync
    # examples per epoch below which the epoch's fixed cost outweighs its steps (D*)
    epoch_bound_below: float = 0.0
    # the steps to the run's held-out target at this global batch, predicted from its
    # gradient noise scale, and the time to it against one device's
    # (`forecast_report.with_time_to_target`); None where the run did not reach the target
    steps_to_target: float | None = None
    time_to_target_speedup: float | None = None


@dataclass
class Forecast:
    """Predictions for each link and worker count, with the model that made them."""

    scaling: str
    model: CostModel
    links_gbit: dict[str, float]  # name -> Gbit/s
    predictions: dict[str, list[Prediction]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """As JSON allows: an infinite rate (no cost per byte measured) is null."""

        def finite(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: finite(v) for k, v in value.items()}
            if isinstance(value, list):
                return [finite(v) for v in value]
            return None if isinstance(value, float) and not math.isfinite(value) else value

        return finite(asdict(self))


def epoch_overhead(history: list[dict[str, float]], step_examples: int, step_s: float) -> float:
    """e0: the median over the timed epochs (the first traces, and is left out when there
    are more) of an epoch's seconds beyond its steps at `step_s` each; 0 when unknown."""
    timed = history[1:] or history
    if not timed or not step_examples or step_s <= 0:
        return 0.0
    extra = sorted(h["seconds"] - h["examples"] / step_examples * step_s for h in timed)
    return max(extra[len(extra) // 2], 0.0)


def fit_cost_model(
    probes: dict[str, Any], history: list[dict[str, float]] | None = None
) -> CostModel:
    """The cost model from a run's probes (`InPlaceProbes.to_dict()`, or the in-process
    diagnosis's `cost_probes`) and, for the epoch's fixed cost, its history.

    Raises:
        ForecastError: the probes lack the all-reduce sizes (a parameter-server run).
    """
    if not probes.get("comm_s_by_bytes") or not probes.get("local_step_s_by_batch"):
        raise ForecastError(
            "the run has no all-reduce measurements at several sizes (a parameter-server "
            "run, or one from before forecasts)",
            "train with '--strategy multi_worker --workers 2' (without --no-diagnose).",
        )
    compute = fit_line(probes["local_step_s_by_batch"])
    comm = fit_line(probes["comm_s_by_bytes"])
    # the ring's members are the replicas (one per worker process across processes, the
    # logical or physical devices of one process under Mirrored)
    workers = probes.get("replicas") or probes["workers"]
    hops = 2 * max(workers - 1, 1)
    # measured on `workers`: intercept = hops * alpha, slope = hops / workers / bandwidth
    per_byte = comm.slope * workers / hops
    # the rest of a measured step, beside the fitted all-reduce of its gradient bytes (so
    # that the gradients' several tensors costing more than one message is counted once)
    sync = probes["step_s"] - probes["local_step_s"] - comm(probes["gradient_bytes"])
    return CostModel(
        compute_fixed_s=compute.intercept,
        compute_per_example_s=compute.slope,
        compute_fit_error=compute.max_error,
        latency_s=comm.intercept / hops,
        bandwidth_bytes_per_s=1 / per_byte if per_byte > 0 else float("inf"),
        comm_fit_error=comm.max_error,
        sync_s=max(sync, 0.0),
        input_examples_per_s=min(probes["input_examples_per_s"]),
        gradient_bytes=probes["gradient_bytes"],
        per_replica_batch=probes["replica_examples"],
        measured_workers=workers,
        epoch_overhead_s=epoch_overhead(
            history or [], probes.get("step_examples", 0), probes.get("end_to_end_s", 0.0)
        ),
    )


def check_request(workers: list[int], gbits: list[float], presets: list[str]) -> None:
    """What a forecast is asked for, checked before any run is read.

    Raises:
        ForecastError: a worker count below 1, a rate not above 0, or an unknown preset
            (listing the known ones).
    """
    if any(n < 1 for n in workers):
        raise ForecastError(f"worker counts must be 1 or more: {workers}", "use e.g. 1,2,4,8.")
    for rate in gbits:
        if rate <= 0:
            raise ForecastError(f"link rate {rate} Gbit/s: a rate must be above 0")
    for name in presets:
        if name not in LINK_PRESETS:
            raise ForecastError(
                f"unknown link preset {name!r}", f"use one of: {', '.join(LINK_PRESETS)}."
            )


def links_from(gbits: list[float], presets: list[str], model: CostModel) -> dict[str, float]:
    """Link name -> Gbit/s: the measured link first, then the named rates and presets.

    Raises:
        ForecastError: see `check_request`.
    """
    check_request([], gbits, presets)
    links = {MEASURED: model.bandwidth_bytes_per_s * 8 / 1e9}
    links.update({f"{rate:g} Gbit/s": rate for rate in gbits})
    links.update({name: LINK_PRESETS[name] for name in presets})
    return links


def predict_speedups(
    model: CostModel,
    links_gbit: dict[str, float],
    workers: list[int],
    scaling: str = "weak",
    global_batch: int | None = None,
) -> Forecast:
    """The cost model's speedup and efficiency at each count of `workers`, on each link
    (`MEASURED`: the link the model was fitted on)."""
    check_request(workers, [], [])
    result = Forecast(scaling, model, dict(links_gbit))
    for name, gbit in links_gbit.items():
        link = None if name == MEASURED else gbit * 1e9 / 8
        result.predictions[name] = [model.predict(n, link, scaling, global_batch) for n in workers]
    return result


def forecast_metrics(f: Forecast) -> dict[str, float]:
    """The fitted constants with their fit errors, and the predicted speedup and efficiency
    at the largest worker count on each link, as flat MLflow metrics."""
    metrics = {
        f"forecast_{name}": value
        for name, value in asdict(f.model).items()
        if isinstance(value, int | float) and math.isfinite(value)
    }
    for link, points in f.predictions.items():
        key = "".join(c if c.isalnum() else "_" for c in link).strip("_")
        last = points[-1]
        metrics[f"forecast_speedup_{last.workers}w_{key}"] = last.speedup
        metrics[f"forecast_efficiency_{last.workers}w_{key}"] = last.efficiency
        if last.time_to_target_speedup is not None:
            name = f"forecast_time_to_target_speedup_{last.workers}w_{key}"
            metrics[name] = last.time_to_target_speedup
    return metrics
