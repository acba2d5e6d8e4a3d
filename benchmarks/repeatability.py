"""Benchmark: how much the speedup a run leads with moves between identical runs.

Runs the default `tfscale run` (the embedded digits, params.yaml as it is) `--runs` times
in one temporary project, each with a store and runs directory of its own so that nothing
is reused, and prints each run's speedup with its range over the run's own rounds.

    uv run python benchmarks/repeatability.py [--runs 5]

Targets: the largest speedup over the smallest at most 1.10, and each run's range holding
the median of the runs' speedups.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def one_run(project: Path, index: int) -> dict:
    """The summary of one default run into a runs directory and store of its own."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["data_dir"] = str(project / "data")  # shared: prepared once
    params["train"]["runs_dir"] = str(project / f"runs-{index}")
    params["track"]["store_dir"] = str(project / f"mlflow-{index}")
    path = project / f"params-{index}.yaml"
    path.write_text(yaml.safe_dump(params))
    tfscale = str(Path(sys.executable).parent / "tfscale")
    started = time.perf_counter()
    proc = subprocess.run(
        [tfscale, "--params", str(path), "run"], cwd=project, capture_output=True, text=True
    )
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    (summary,) = (project / f"runs-{index}").rglob("summary.json")
    return {**json.loads(summary.read_text()), "wall_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="tfscale-repeat-"))
    rows = []
    for index in range(args.runs):
        s = one_run(project, index)
        rows.append((s["speedup"], s.get("speedup_low"), s.get("speedup_high"), s))
        low, high = rows[-1][1], rows[-1][2]
        print(
            f"run {index + 1}: speedup {s['speedup']:.2f}x ({low:.2f}-{high:.2f}), "
            f"{s['wall_s']:.0f} s; {s.get('measured_over', '').split(' (')[0]}; "
            f"bottleneck {s.get('bottleneck', '?')}",
            flush=True,
        )
    speedups = [r[0] for r in rows]
    middle = statistics.median(speedups)
    held = sum(1 for _, low, high, _ in rows if low <= middle <= high)
    print(
        f"largest / smallest speedup: {max(speedups) / min(speedups):.3f} (target <= 1.10); "
        f"median of the runs {middle:.2f}x, inside {held} of {len(rows)} runs' ranges "
        f"(target: all)"
    )


if __name__ == "__main__":
    main()
