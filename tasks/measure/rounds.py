"""Timing several configurations as a benchmark tool does: in alternating rounds (A B C A B
C ...), after a warm-up round that is left out, so that a slow spell of a shared machine
falls on every configuration alike. A figure is a median with its spread over the rounds;
a ratio of two configurations is the median of its rounds' ratios, with their spread.

How many rounds: as many as the figure needs, as benchmark tools decide (criterion.rs
samples until its estimate is good enough; pyperf calibrates its runs). After each round a
`Settling` rule reads the figure's rounds so far: once the 95% confidence interval of
its median round (`ratio_interval`: order statistics, no assumption about the
distribution, so a shared machine's odd slow round moves it no more than any other
round would) is within the aimed precision (e.g. +-3%) the rounds stop, and at its cap
they stop anyway, saying so (`RoundsEnded`). Never fewer rounds than the interval needs:
below 6, even the lowest and highest round hold the median with less than 95%
confidence.

Ownership: `alternate` runs the calls it is given and owns nothing else; a `Spread`, a
`Settling` rule and its `RoundsEnded` verdict are values.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

# a timed block aims at this many seconds: long enough to average a shared machine's
# jitter, short enough that a large model or batch does not make a diagnosis outlast its
# training (100 steps of a CNN at batch 256 took 26 s a block, 13 minutes in all)
BLOCK_SECONDS = 1.0
MIN_BLOCK_STEPS = 10


@dataclass(frozen=True)
class Spread:
    """The median of a figure over rounds, and the lowest and highest round."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            raise ValueError("a spread needs at least one value")
        return cls(statistics.median(values), min(values), max(values))

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high

    def above(self, threshold: float) -> bool:
        """Every round was above `threshold`."""
        return self.low > threshold

    def below(self, threshold: float) -> bool:
        """Every round was below `threshold`."""
        return self.high < threshold

    def text(self, unit: str = "x", digits: int = 2) -> str:
        """`1.21x (1.15-1.27)`, or `1,340 ex/s (1,290-1,380)` with `unit=" ex/s"`, `digits=0`."""
        f = f",.{digits}f"
        return f"{self.median:{f}}{unit} ({self.low:{f}}-{self.high:{f}})"


def block_steps(
    seconds_per_step: float,
    most: int,
    least: int = MIN_BLOCK_STEPS,
    target_s: float = BLOCK_SECONDS,
) -> int:
    """Steps for a block of about `target_s` at `seconds_per_step`: at most `most`, at
    least `least` (or `most`, when that is fewer)."""
    floor = min(least, most)
    if seconds_per_step <= 0:
        return most
    return max(floor, min(most, math.ceil(target_s / seconds_per_step)))


def alternate(
    calls: dict[str, Callable[[], float]],
    rounds: int,
    settled: Callable[[dict[str, list[float]]], bool] | None = None,
) -> dict[str, list[float]]:
    """Each call once per round, in the order given, for up to `rounds` rounds after one
    warm-up round whose values are dropped, and fewer once `settled(values so far)` says
    so after a round. Returns each call's values, one per timed round."""
    if rounds < 1:
        raise ValueError(f"rounds must be 1 or more, not {rounds}")
    for call in calls.values():  # warm-up: tracing, caches, the first allocation
        call()
    values: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            values[name].append(call())
        if settled is not None and settled(values):
            break
    return values


CONFIDENCE = 0.95


def median_rank(n: int, confidence: float = CONFIDENCE) -> int | None:
    """The largest k for which the k-th lowest and the k-th highest of `n` values hold the
    median of the distribution they were drawn from with at least `confidence`: that
    interval misses it only when k or fewer values fall on one side, so its confidence is
    1 - 2 P(Binomial(n, 1/2) < k). None when even the lowest and highest are not enough
    (fewer than 6 values at 95%)."""
    best, tail = None, 0.0
    for k in range(1, n // 2 + 1):
        tail += math.comb(n, k - 1) / 2**n
        if 1 - 2 * tail < confidence:
            break
        best = k
    return best


def least_rounds(confidence: float = CONFIDENCE) -> int:
    """The fewest values whose median has an interval at `confidence` (6 at 95%)."""
    n = 1
    while median_rank(n, confidence) is None:
        n += 1
    return n


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> Spread | None:
    """The median of `values` with its distribution-free confidence interval (the
    `median_rank`-th lowest and highest value), or None when there are too few values."""
    k = median_rank(len(values), confidence)
    if k is None:
        return None
    ordered = sorted(values)
    return Spread(statistics.median(values), ordered[k - 1], ordered[-k])


# Student's t at 97.5% for 1 to 30 degrees of freedom (a two-sided 95% interval), the normal's
# 1.96 beyond: the tables' values, which scipy.stats.t.ppf(0.975, df) gives too
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_975(df: int) -> float:
    """Student's t quantile at 97.5% for `df` degrees of freedom: the half-width, in
    standard errors, of a 95% interval of a mean of df + 1 values (1.96 past 30)."""
    if df < 1:
        raise ValueError(f"a t quantile needs 1 or more degrees of freedom, not {df}")
    return T_975[df - 1] if df <= len(T_975) else 1.96


def t_975_between(df: float) -> float:
    """`t_975` at a degrees of freedom that need not be whole (Satterthwaite's): linear in
    1/df between the whole ones either side (the tables' own rule), 1.96 past 30."""
    if df < 1:
        raise ValueError(f"a t quantile needs 1 or more degrees of freedom, not {df}")
    if df > len(T_975):
        return 1.96
    below = math.floor(df)
    if df == below:
        return t_975(below)
    share = (1 / below - 1 / df) / (1 / below - 1 / (below + 1))
    return t_975(below) + share * (t_975(below + 1) - t_975(below))


def log_t_interval(values: list[float]) -> Spread | None:
    """The median of `values` (positive: rates, ratios) with a 95% Student t-interval of
    their geometric mean: the mean of their logs +- t(n - 1) s / sqrt(n), back from the
    logs, widened to hold the median where it falls outside. For a few values (2 to 5),
    where the order statistics give no 95% interval (`median_rank`): their lowest to
    highest is not one (with 3 values it holds the median 75% of the time, and it is far
    narrower than a 95% interval of 2 values, whose t is 12.7). None with fewer than 2."""
    if len(values) < 2:
        return None
    logs = [math.log(v) for v in values]
    mean, half = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    half *= t_975(len(logs) - 1)
    point = statistics.median(values)
    return Spread(point, min(math.exp(mean - half), point), max(math.exp(mean + half), point))


def ratio_t_interval(
    over: list[float], under: list[float], known_sigma: float = 0.0
) -> tuple[float, float]:
    """The 95% interval of the ratio of two samples' geometric means (`over`'s over
    `under`'s; positive values, at least 2 each), as a two-sample t-interval on their logs:
    the difference of the logs' means +- t times its standard error, from their pooled
    variance (the two sides are one task's trainings, their seeds' spreads alike), with a
    term known without sampling beside it (`known_sigma`, in logs: a rounds' interval read
    as a normal), its degrees of freedom by Satterthwaite (`t_975_between`). Its coverage,
    drawn from a known truth (`benchmarks/interval_coverage.py`), is in docs/benchmarks.md;
    a bootstrap of the same seeds held the truth about 70% of the time with 2 a side."""
    logs = [[math.log(v) for v in values] for values in (over, under)]
    df = len(logs[0]) + len(logs[1]) - 2
    pooled = sum(statistics.variance(side) * (len(side) - 1) for side in logs) / df
    sampled = pooled * (1 / len(logs[0]) + 1 / len(logs[1]))
    total = sampled + known_sigma**2
    effective = max(1.0, df * total**2 / sampled**2) if sampled > 0 else math.inf
    centre = statistics.fmean(logs[0]) - statistics.fmean(logs[1])
    half = t_975_between(effective) * math.sqrt(total)
    return math.exp(centre - half), math.exp(centre + half)


def interval_95(values: list[float], over: str = "rounds") -> tuple[Spread, str] | None:
    """The median of `values` (one a round, or an epoch: `over`) with a 95% interval, and
    what the interval is, in words: the order statistics' (`median_interval`) from 6
    values, a t-interval on the logs below (`log_t_interval`), never the lowest to highest
    read as one. None with fewer than 2 values, which have no interval."""
    found = median_interval(values)
    if found is not None:
        return found, f"the median's 95% interval over {len(values)} {over}"
    found = log_t_interval(values)
    if found is None:
        return None
    return found, f"a 95% t-interval on the logs of {len(values)} {over}, too few for the median's"


def ratio_interval(numerator: list[float], denominator: list[float]) -> Spread | None:
    """`numerator / denominator` as `ratio` gives it (the median of the rounds' own
    ratios), with the 95% confidence interval of that median (`median_interval`), or None
    with fewer than `least_rounds` rounds. Unlike the range of the rounds, which only
    widens as rounds are added (one slow round of a shared machine is enough to cross 1),
    the interval narrows, as a measurement that goes on until it is settled (`Settling`)
    needs."""
    per_round = [a / b for a, b in zip(numerator, denominator, strict=True)]
    return median_interval(per_round)


def ratio_95(numerator: list[float], denominator: list[float]) -> Spread:
    """`numerator / denominator` as `ratio` gives it, with a 95% interval of it
    (`interval_95`: the order statistics' from 6 rounds, a t-interval on the logs of the
    rounds' ratios below), and a single round's ratio alone (no interval: its low and high
    are itself)."""
    per_round = [a / b for a, b in zip(numerator, denominator, strict=True)]
    found = interval_95(per_round)
    return found[0] if found else ratio(numerator, denominator)


def half_width(interval: Spread) -> float:
    """The wider side of an interval around its median, relative to it: 0.03 is +-3%."""
    return max(interval.median - interval.low, interval.high - interval.median) / abs(
        interval.median
    )


@dataclass(frozen=True)
class RoundsEnded:
    """Why a figure's rounds ended: its interval reached the aimed precision
    (`ended_by="precision"`), or the cap of rounds came first (`"cap"`)."""

    rounds: int
    ended_by: str  # precision | cap
    aim: float  # the half-width aimed at, relative (0 when rounds were not to end early)
    cap: int
    half_width: float | None = None  # the interval's, when the rounds gave one
    low: float | None = None
    high: float | None = None
    median: float | None = None
    figure: str = "the figure"  # what was watched, as the sentence names it

    def text(self, figure: str | None = None) -> str:
        """Why the rounds ended, after their count: `until the speedup was known to +-2.7%
        (95% confidence)`, or at the cap what it reached against the aim."""
        figure = figure or self.figure
        known = (
            f"{figure} known to +-{self.half_width:.1%} (95% confidence)"
            if self.half_width is not None
            else f"too few for {figure}'s interval (it needs {least_rounds()} rounds)"
        )
        if self.ended_by == "precision":
            return f"until {known.replace('known', 'was known', 1)}"
        if not self.aim:
            return f"a fixed count: {known}"
        return f"the most allowed: {known}, aimed at +-{self.aim:.0%}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Settling:
    """Rounds go on until the 95% interval of the watched figure's median round
    (`ratio_interval`) is within `aim` of it (relative half-width), or until `cap` rounds;
    `aim` 0 always runs `cap`."""

    aim: float
    cap: int

    def check(
        self, numerator: list[float], denominator: list[float] | None = None
    ) -> RoundsEnded | None:
        """The verdict after a round on the figure `numerator / denominator`, round by round
        (without a denominator, `numerator` itself): None to go on."""
        bottom = denominator if denominator is not None else [1.0] * len(numerator)
        interval = ratio_interval(numerator, bottom)
        width = half_width(interval) if interval is not None else None
        if width is not None and self.aim and width <= self.aim:
            ended_by = "precision"
        elif len(numerator) >= self.cap:
            ended_by = "cap"
        else:
            return None
        figures = dataclasses.asdict(interval) if interval is not None else {}
        return RoundsEnded(len(numerator), ended_by, self.aim, self.cap, width, **figures)


def ratio(numerator: list[float], denominator: list[float]) -> Spread:
    """`numerator / denominator` over paired rounds: the median of the rounds' own ratios,
    with the lowest and highest. Each round times both back to back, so a slow spell of
    the machine moves both and not their ratio; the ratio of the two medians mixes rounds
    and keeps that spell's noise: on the digits CNN over 40 rounds its 95% interval stayed
    +-5% where the median of the ratios' narrowed to +-2.2%. The medians shown beside a
    ratio may so divide to a figure a little off it."""
    per_round = [a / b for a, b in zip(numerator, denominator, strict=True)]
    return Spread(statistics.median(per_round), min(per_round), max(per_round))
