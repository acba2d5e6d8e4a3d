"""Timing several configurations as a benchmark tool does: in alternating rounds (A B C A B
C ...), after a warm-up round that is left out, so that a slow spell of a shared machine
falls on every configuration alike. A figure is a median with its spread over the rounds;
a ratio of two configurations is the ratio of their medians, spread as its rounds' ratios.

How many rounds: as many as the figure needs, as benchmark tools decide (criterion.rs
samples until its estimate is good enough; pyperf calibrates its runs). After each round a
`Settling` rule reads the figure's rounds so far: once its 95% confidence interval
(`ratio_interval`: a paired bootstrap of the ratio of medians, which a shared machine's
odd slow round moves far less than it would a mean) is within the aimed precision (e.g.
+-3%) the rounds stop, and at its cap they stop anyway, saying so (`Settled`). Never
fewer rounds than an interval needs: below 6, even the lowest and highest round hold a
median with less than 95% confidence.

Ownership: `alternate` runs the calls it is given and owns nothing else; a `Spread`, a
`Settling` rule and its `Settled` verdict are values.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

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
RESAMPLES = 2000


def least_rounds(confidence: float = CONFIDENCE) -> int:
    """The fewest rounds from which an interval of a median can reach `confidence`: the
    lowest and highest of n values hold their distribution's median with 1 - 2 / 2**n,
    93.8% from 5 values and 96.9% from 6, and no narrower interval holds it more often."""
    n = 1
    while 1 - 2 / 2**n < confidence:
        n += 1
    return n


def ratio_interval(
    numerator: list[float], denominator: list[float], confidence: float = CONFIDENCE
) -> Spread | None:
    """`numerator / denominator` as `ratio` gives it (the ratio of the medians), with its
    `confidence` interval from a paired bootstrap, criterion.rs's way: the rounds drawn
    again with replacement (a round's two figures together, so that a slow spell stays
    shared), the ratio of the medians of each draw, and the middle `confidence` of those
    (widened to hold the figure itself, should it fall outside). Seeded: the same rounds
    give the same interval. Unlike the range of the rounds, which only widens as rounds
    are added (one slow round of a shared machine is enough to cross 1), it narrows, as a
    measurement that goes on until it is settled (`Settling`) needs. None with fewer
    than `least_rounds` rounds."""
    n = len(numerator)
    if n < least_rounds(confidence) or n != len(denominator):
        return None
    top, bottom = np.asarray(numerator, float), np.asarray(denominator, float)
    picks = np.random.default_rng(0).integers(0, n, size=(RESAMPLES, n))
    draws = np.median(top[picks], axis=1) / np.median(bottom[picks], axis=1)
    tail = (1 - confidence) / 2
    low, high = (float(q) for q in np.quantile(draws, [tail, 1 - tail]))
    point = statistics.median(numerator) / statistics.median(denominator)
    return Spread(point, min(low, point), max(high, point))


def half_width(interval: Spread) -> float:
    """The wider side of an interval around its median, relative to it: 0.03 is +-3%."""
    return max(interval.median - interval.low, interval.high - interval.median) / abs(
        interval.median
    )


@dataclass(frozen=True)
class Settled:
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

    def text(self, figure: str = "the figure") -> str:
        """Why the rounds ended, after their count: `until the speedup was known to +-2.7%
        (95% confidence)`, or at the cap what it reached against the aim."""
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
    """Rounds go on until the 95% interval of the watched figure (a ratio of medians,
    `ratio_interval`) is within `aim` of it (relative half-width), or until `cap` rounds;
    `aim` 0 always runs `cap`."""

    aim: float
    cap: int

    def check(
        self, numerator: list[float], denominator: list[float] | None = None
    ) -> Settled | None:
        """The verdict after a round on the figure `numerator / denominator` (without a
        denominator, `numerator`'s median): None to go on."""
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
        return Settled(len(numerator), ended_by, self.aim, self.cap, width, **figures)


def ratio(numerator: list[float], denominator: list[float]) -> Spread:
    """`numerator / denominator` over paired rounds: the ratio of their medians (so that
    a page's figures agree: 1,500 over 1,000 ex/s reads 1.50x, and a ratio of ratios
    multiplies), with the lowest and highest ratio of one round (which hold that median
    ratio, as each round's ratio bounds the medians)."""
    per_round = [a / b for a, b in zip(numerator, denominator, strict=True)]
    middle = statistics.median(numerator) / statistics.median(denominator)
    return Spread(middle, min(per_round), max(per_round))
