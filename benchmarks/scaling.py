"""Benchmark: scaling efficiency of 2 worker processes x 1 thread (MultiWorkerMirrored, each
pinned to its own core) against 1 process x 1 thread (OneDevice), a compute-bound CNN on
32x32x3 synthetic data, weak scaling; then float32 against mixed precision on this CPU.

    uv run python benchmarks/scaling.py [--epochs 3] [--batch 128] [--float16] [--scaling-only]

Every figure comes from worker processes started the same way, in one run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tasks.config import config_to_dict, load_config
from tasks.launch import launch_workers
from tasks.preparation import prepare_dataset
from tasks.strategy import StrategyChoice


def measure(config, data_dir: str, choice: StrategyChoice, run_dir: Path, threads: int) -> float:
    spec = {
        "config": config_to_dict(config),
        "data_dir": data_dir,
        "choice": choice.to_dict(),
        "run_dir": str(run_dir),
        "threads": threads,
    }
    launch_workers(spec, choice.workers, run_dir, pin_cores=True)
    return json.loads((run_dir / "worker-0-result.json").read_text())["examples_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128, help="examples per replica")
    parser.add_argument("--examples", type=int, default=6144)
    parser.add_argument("--float16", action="store_true", help="also time mixed_float16")
    parser.add_argument("--scaling-only", action="store_true", help="only the 1 vs 2 workers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfscale-scaling-") as tmp:
        config = load_config(
            None,
            {
                "prepare.dataset": "synthetic",
                "prepare.data_dir": f"{tmp}/data",
                "prepare.synthetic.train_examples": args.examples,
                "prepare.num_shards": 4,
                "train.model": "cnn",
                "train.epochs": args.epochs,
                "train.cache": True,
                "train.batch_size_per_replica": args.batch,
                "train.scaling": "weak",
            },
        )
        data_dir = prepare_dataset(config, progress=False).data_dir
        rates = {}
        cases = [
            ("1 process x 1 thread, float32", StrategyChoice("one_device", 1, 1, "float32", "")),
            (
                "2 workers x 1 thread, float32",
                StrategyChoice("multi_worker", 2, 2, "float32", "", communication="ring"),
            ),
            (
                "1 process x 1 thread, mixed_bfloat16",
                StrategyChoice("one_device", 1, 1, "mixed_bfloat16", ""),
            ),
        ]
        if args.float16:  # on a CPU without float16 units: about 50 examples/s, 15+ minutes
            cases.append(
                (
                    "1 process x 1 thread, mixed_float16",
                    StrategyChoice("one_device", 1, 1, "mixed_float16", ""),
                )
            )
        if args.scaling_only:
            cases = cases[:2]
        for i, (name, choice) in enumerate(cases):
            rates[name] = measure(config, data_dir, choice, Path(tmp) / f"run{i}", threads=1)
            print(f"{name:<40} {rates[name]:8.0f} examples/s", flush=True)
        base = rates[cases[0][0]]
        speedup = rates[cases[1][0]] / base
        print(f"speedup of 2 workers {speedup:.2f}, scaling efficiency {speedup / 2:.2f}")
        for name, _ in cases[2:]:
            print(f"{name.split(', ')[1]} / float32: {rates[name] / base:.2f}")


if __name__ == "__main__":
    main()
