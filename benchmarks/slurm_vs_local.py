"""Benchmark: a 2-node Slurm job's examples/s against the same 2 workers launched by
`tfscale train --workers 2` on one host.

Stands up a real Slurm cluster on network namespace hosts (`tests/slurmlab.py`; needs
root, installs Debian's slurm-wlm and munge when missing) and alternates, `--rounds`
times, `sbatch flows/cluster/train.sbatch` on 2 one-CPU nodes and `tfscale train
--strategy multi_worker --workers 2` with the same model, data, batch and epochs, each
into a runs directory of its own. Prints each run's examples/s after the first epoch
(the run's own figure) and the ratio of the medians.

    uv run python benchmarks/slurm_vs_local.py [--rounds 3] [--epochs 10]

Target: the Slurm job within 10% of the local launch (the same two processes on the same
two cores; only the launcher and the namespace network differ).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import slurmlab  # noqa: E402
from helpers import BIN, free_port  # noqa: E402

from tfscale.tasks.distribute import netlab  # noqa: E402

TRAIN = ["--model", "mlp", "--precision", "float32", "--jit-compile", "false", "--no-diagnose"]


def examples_per_s(runs: Path) -> float:
    (metrics,) = runs.glob("*/*/metrics.json")
    return json.loads(metrics.read_text())["examples_per_s"]


def slurm_job(cluster, data_dir: Path, tmp: Path, epochs: int) -> float:
    runs = tmp / "runs"
    env = {
        "DATA_DIR": str(data_dir),
        "RUNS_DIR": str(runs),
        "TFSCALE": str(BIN / "tfscale"),
        "TFSCALE_PORT_BASE": str(free_port()),
    }
    script = str(ROOT / "flows" / "cluster" / "train.sbatch")
    argv = ["sbatch", "--parsable", "--nodes=2", f"--chdir={tmp}", "-o", "job-%j.out", script]
    job = cluster.run(*argv, *TRAIN, "--epochs", str(epochs), env=env).stdout.strip()
    state = cluster.wait(job.split(";")[0], {"COMPLETED", "FAILED"}, timeout_s=900)
    if state != "COMPLETED":
        sys.exit(next(tmp.glob("job-*.out")).read_text()[-3000:])
    return examples_per_s(runs)


def local_workers(data_dir: Path, tmp: Path, epochs: int) -> float:
    runs = tmp / "runs"
    argv = [str(BIN / "tfscale"), "train", "--strategy", "multi_worker", "--workers", "2"]
    paths = ["--data-dir", str(data_dir), "--runs-dir", str(runs)]
    done = subprocess.run(
        [*argv, *paths, *TRAIN, "--epochs", str(epochs)], cwd=tmp, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    return examples_per_s(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    why_not = netlab.available() or slurmlab.install()
    if why_not:
        sys.exit(f"no Slurm cluster here: {why_not}")
    base = Path(tempfile.mkdtemp(prefix="tfscale-slurm-bench-"))
    data = base / "tfrecords"
    subprocess.run(
        [str(BIN / "tfscale"), "prepare", "--dataset", "digits", "--data-dir", str(data)],
        check=True,
        capture_output=True,
    )
    rates: dict[str, list[float]] = {"slurm": [], "local": []}
    (base / "slurm").mkdir()
    with slurmlab.slurm_cluster(2, base / "slurm") as cluster:
        for round_ in range(args.rounds):
            for how in ("slurm", "local"):
                tmp = base / f"{how}-{round_}"
                tmp.mkdir()
                if how == "slurm":
                    rate = slurm_job(cluster, data, tmp, args.epochs)
                else:
                    rate = local_workers(data, tmp, args.epochs)
                rates[how].append(rate)
                print(f"round {round_ + 1}: {how:<5} {rate:,.0f} examples/s", flush=True)
    for how, values in rates.items():
        spread = f"({min(values):,.0f}-{max(values):,.0f})"
        print(f"{how:<5} median {statistics.median(values):,.0f} examples/s {spread}")
    ratio = statistics.median(rates["slurm"]) / statistics.median(rates["local"])
    print(f"Slurm job / tfscale train --workers 2: {ratio:.2f}")


if __name__ == "__main__":
    main()
