"""Timing several configurations as a benchmark tool does: in alternating rounds (A B C A B
C ...), after a warm-up round that is left out, so that a slow spell of a shared machine
falls on every configuration alike. A figure is a median with its spread over the rounds;
a ratio of two configurations is the ratio of their medians, spread as its rounds' ratios.

Ownership: `alternate` runs the calls it is given and owns nothing else; a `Spread` is a
value.
"""

from __future__ import annotations

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


def alternate(calls: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each call once per round, in the order given, for `rounds` rounds after one warm-up
    round whose values are dropped. Returns each call's values, one per timed round."""
    if rounds < 1:
        raise ValueError(f"rounds must be 1 or more, not {rounds}")
    for call in calls.values():  # warm-up: tracing, caches, the first allocation
        call()
    values: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            values[name].append(call())
    return values


def ratio(numerator: list[float], denominator: list[float]) -> Spread:
    """`numerator / denominator` over paired rounds: the ratio of their medians (so that
    a page's figures agree: 1,500 over 1,000 ex/s reads 1.50x, and a ratio of ratios
    multiplies), with the lowest and highest ratio of one round (which hold that median
    ratio, as each round's ratio bounds the medians)."""
    per_round = [a / b for a, b in zip(numerator, denominator, strict=True)]
    middle = statistics.median(numerator) / statistics.median(denominator)
    return Spread(middle, min(per_round), max(per_round))
