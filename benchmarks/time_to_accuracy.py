"""Benchmark: time to a target accuracy, measured the MLPerf way, over seeds.

Runs `tfscale run --seeds N` on two tasks, each in a temporary project of its own:
- `digits`: the embedded default, params.yaml as it is (its `evaluate.target_accuracy`);
- `synthetic`: a task of known difficulty: 4,096 training images of 16x16x3, each pixel
  20% its class's prototype and 80% noise, 10% of labels replaced by a random class (the
  best accuracy reachable is 0.91), to a held-out 4,096, target 0.73, 14 epochs.

For each it prints every seed's examples to the target on both sides, MLPerf's score (the
mean without the fastest and the slowest seed), the time-to-target speedup beside the
examples/s speedup (both from the run's own alternating rounds), and the trainings' own
times on the clock.

    uv run python benchmarks/time_to_accuracy.py [--seeds 5] [--task digits|synthetic|both]
        [--lr-scaling auto|linear|sqrt|adascale|none]

Targets, per task: the baseline needs at least 5 epochs to the target (a figure that is
not the first epoch's tracing); the seeds kept agree, the most examples any needed at most
1.25 times the fewest, on each side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TASKS = {
    "digits": {},
    "synthetic": {
        "prepare": {
            "dataset": "synthetic",
            "synthetic": {
                "train_examples": 4096,
                "test_examples": 4096,
                "height": 16,
                "width": 16,
                "channels": 3,
                "signal": 0.2,
                "label_noise": 0.1,
            },
        },
        "train": {"epochs": 14},
        "evaluate": {"target_accuracy": 0.73},
    },
}


def merged(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


def train_to_target(project: Path, params: dict, name: str, **train: object) -> dict:
    """One training to the target on one device (`train.stop_at_target`), float32 without
    XLA, warming up over one epoch, `train`'s keys set, in `project`'s `runs-NAME`: its
    metrics.json, read back where an earlier run of the benchmark left it there."""
    runs = project / f"runs-{name}"
    done = list(runs.rglob("metrics.json"))
    if done:  # a resumed measurement: trained before
        return json.loads(done[0].read_text())
    params = json.loads(json.dumps(params))
    params["train"].update(
        warmup_epochs=1,
        stop_at_target=True,
        runs_dir=str(runs),
        precision="float32",
        jit_compile=False,
        **train,
    )
    path = project / f"params-{name}.yaml"
    path.write_text(yaml.safe_dump(params))
    tfscale = str(Path(sys.executable).parent / "tfscale")
    command = [tfscale, "--params", str(path), "train", "--strategy", "one_device"]
    proc = subprocess.run([*command, "--no-diagnose"], cwd=project, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    (metrics,) = runs.rglob("metrics.json")
    return json.loads(metrics.read_text())


def study(task: str, seeds: int, lr_scaling: str | None = None) -> tuple[dict, dict]:
    """The summary of one `tfscale run --seeds` on `task` (with `lr_scaling`, that
    `train.lr_scaling`), and its config."""
    project = Path(tempfile.mkdtemp(prefix=f"tfscale-tta-{task}-"))
    params = merged(yaml.safe_load((ROOT / "params.yaml").read_text()), TASKS[task])
    params["prepare"]["data_dir"] = str(project / "data")
    params["train"]["runs_dir"] = str(project / "runs")
    params["track"]["store_dir"] = str(project / "mlflow")
    if lr_scaling:
        params["train"]["lr_scaling"] = lr_scaling
    path = project / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    tfscale = str(Path(sys.executable).parent / "tfscale")
    command = [tfscale, "--params", str(path), "run", "--seeds", str(seeds)]
    proc = subprocess.run(command, cwd=project, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    (summary,) = (project / "runs").rglob("summary.json")
    return json.loads(summary.read_text()), params


def train_examples(params: dict) -> int:
    prepare = params["prepare"]
    if prepare["dataset"] == "synthetic":
        return prepare["synthetic"]["train_examples"]
    return 1437  # digits: 1,797 images, 20% held out


def report(task: str, summary: dict, params: dict) -> list[bool]:
    per_epoch = train_examples(params)
    target = summary["target_accuracy"]
    rule = params["train"].get("lr_scaling", "linear")
    print(
        f"\n## {task}: target {target:g} held-out accuracy, {summary['seeds']} seeds a side, "
        f"learning rate scaled {rule}"
    )
    names = ("baseline (1 device)", f"{summary['replicas']} replicas")
    met = []
    for name, values in zip(names, summary["examples_to_target_by_seed"], strict=True):
        shown = ", ".join("missed" if v is None else f"{v:,.0f}" for v in values)
        reached = sorted(v for v in values if v is not None)
        kept = reached[1:-1] if len(values) >= 3 else reached
        spread = (
            max(kept) / min(kept)
            if kept and len(kept) == len(values) - 2 * (len(values) >= 3)
            else float("inf")
        )
        print(
            f"{name:<20} examples to target by seed: {shown}; kept seeds' most / fewest "
            f"{spread:.2f} (target <= 1.25)"
        )
        met.append(spread <= 1.25)
    base = summary["examples_to_target_baseline"]
    dist = summary["examples_to_target_distributed"]
    if base is None or dist is None:
        print(f"not reached: {summary['to_target']}")
        return [*met, False]
    epochs = base / per_epoch
    print(
        f"MLPerf score, examples: baseline {base:,.0f} ({epochs:.1f} epochs; target >= 5), "
        f"{names[1]} {dist:,.0f} ({dist / base:.2f}x as many)"
    )
    print(
        f"time to target: {summary['time_to_target_speedup']:.2f}x "
        f"({summary['time_to_target_speedup_low']:.2f}-"
        f"{summary['time_to_target_speedup_high']:.2f}); in examples/s "
        f"{summary['speedup']:.2f}x ({summary['speedup_low']:.2f}-{summary['speedup_high']:.2f})"
    )
    clock_b, clock_d = summary["time_to_target_s_baseline"], summary["time_to_target_s_distributed"]
    print(
        f"on the trainings' own clocks (one after the other, first epoch's tracing included): "
        f"baseline {clock_b:.2f} s, {names[1]} {clock_d:.2f} s, ratio {clock_b / clock_d:.2f}"
    )
    return [*met, epochs >= 5]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--task", choices=[*TASKS, "both"], default="both")
    parser.add_argument(
        "--lr-scaling",
        choices=("auto", "linear", "sqrt", "adascale", "none"),
        default=None,
        help="train.lr_scaling for both sides (default: params.yaml's)",
    )
    args = parser.parse_args()
    tasks = list(TASKS) if args.task == "both" else [args.task]
    results = {}
    for task in tasks:
        summary, params = study(task, args.seeds, args.lr_scaling)
        results[task] = report(task, summary, params)
    print()
    for task, met in results.items():
        print(
            f"{task}: {'all targets met' if all(met) else 'a target missed'} "
            f"(seeds agree on each side: {met[0]}, {met[1]}; baseline >= 5 epochs: {met[2]})"
        )


if __name__ == "__main__":
    main()
