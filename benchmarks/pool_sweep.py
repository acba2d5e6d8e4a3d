"""Benchmark: a sweep's wall time on a Prefect work pool of 2 workers against 1.

Stands up a Prefect server and workers on network namespace hosts (`tests/poollab.py`;
needs root), and runs the same 4-cell sweep (digits MLP, 1 and 2 replicas x batch 32 and
64, Mirrored) through `tfscale sweep --pool`, alternating 1 and 2 workers `--rounds`
times, each on fresh hosts and a fresh project (nothing reused). Prints each sweep's wall
time from the command's start to its end, and the ratio of the medians.

    uv run python benchmarks/pool_sweep.py [--rounds 2]

Target: 2 workers take at most 0.75 of 1 worker's time (the cells' process start,
TensorFlow import and training run on both hosts at once; this machine's 2 cores are
shared by both workers, so less than 2x is expected here).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import BIN, tiny_params  # noqa: E402
from poollab import GRID, pool_lab  # noqa: E402


def one_sweep(workers: int) -> float:
    """Seconds from `tfscale sweep --pool` starting to its end, on fresh hosts."""
    tmp = Path(tempfile.mkdtemp(prefix=f"tfscale-pool-{workers}w-"))
    with pool_lab(workers, tmp) as lab:
        params = tiny_params(tmp, **GRID, **{"track.store_dir": str(tmp / "mlflow")})
        argv = [str(BIN / "tfscale"), "--params", str(params), "sweep", "--pool", lab.pool]
        started = time.perf_counter()
        done = lab.on(0, argv, cwd=tmp)
        seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(done.stdout[-3000:] + done.stderr[-3000:])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    times: dict[int, list[float]] = {1: [], 2: []}
    for round_ in range(args.rounds):
        for workers in (1, 2):
            times[workers].append(one_sweep(workers))
            print(f"round {round_ + 1}: {workers} worker(s) {times[workers][-1]:.1f} s", flush=True)
    one, two = (statistics.median(times[w]) for w in (1, 2))
    for workers in (1, 2):
        t = times[workers]
        spread = f"({min(t):.1f}-{max(t):.1f})"
        print(f"{workers} worker(s): median {statistics.median(t):.1f} s {spread}")
    print(f"2 workers / 1 worker: {two / one:.2f} of the time ({one / two:.2f}x faster)")


if __name__ == "__main__":
    main()
