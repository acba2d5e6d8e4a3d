"""What else used the machine while something was measured: the CPU that other processes
kept busy, and the share the hypervisor took (steal), read from the kernel's `/proc/stat`
around the measurement and this process's own CPU time.

Ownership: `LoadWatch` reads at its start and end and owns nothing else; `Interference` is
a value.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

STAT = Path("/proc/stat")
OTHER_CORES = 0.25  # other processes busy for a quarter of a core or more: material
STEAL_SHARE = 0.05  # the hypervisor taking 5% of the CPU time or more: material


@dataclass(frozen=True)
class Interference:
    """Other processes' CPU use (cores, on average) and the hypervisor's steal (a share of
    all CPU time) while a measurement ran; `known` false where the kernel does not say."""

    other_cores: float = 0.0
    steal_share: float = 0.0
    cores: int = 1
    seconds: float = 0.0
    known: bool = False

    @property
    def material(self) -> bool:
        return self.known and (self.other_cores >= OTHER_CORES or self.steal_share >= STEAL_SHARE)

    def text(self) -> str:
        """A sentence for the page, or '' when nothing else mattered."""
        if not self.material:
            return ""
        parts = []
        if self.other_cores >= OTHER_CORES:
            parts.append(f"other processes kept {self.other_cores:.1f} of {self.cores} cores busy")
        if self.steal_share >= STEAL_SHARE:
            parts.append(f"the hypervisor took {self.steal_share:.0%} of the CPU time")
        return (
            " and ".join(parts) + f" during the {self.seconds:.0f} s this run measured: its "
            "figures are lower than on a quiet machine, and may be uneven"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def _cpu_line() -> tuple[float, float, float] | None:
    """(busy, steal, total) CPU seconds of the whole machine since boot, or None."""
    try:
        fields = STAT.read_text().splitlines()[0].split()
    except OSError:
        return None
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK")
    total, idle, steal = sum(ticks), ticks[3] + ticks[4], ticks[7]
    return (total - idle - steal) / hz, steal / hz, total / hz


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


class LoadWatch:
    """`with LoadWatch() as watch: ...`, then `watch.result`: the interference meanwhile."""

    def __enter__(self) -> LoadWatch:
        self.result = Interference()
        self._start = (_cpu_line(), _own_cpu_s(), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        machine, own, started = self._start
        end = _cpu_line()
        wall = time.perf_counter() - started
        if machine is None or end is None or wall <= 0:
            return
        busy, steal, total = (b - a for a, b in zip(machine, end, strict=True))
        others = max(busy - (_own_cpu_s() - own), 0.0) / wall
        self.result = Interference(
            other_cores=others,
            steal_share=steal / total if total > 0 else 0.0,
            cores=os.cpu_count() or 1,
            seconds=wall,
            known=True,
        )
