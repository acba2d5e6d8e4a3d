"""Benchmark: the critical batch, measured and predicted from the gradient noise scale.

On the task of known difficulty of `benchmarks/time_to_accuracy.py` (synthetic; or
digits), trains one device at global batches 16 to 256, the learning rate scaled from
32's 0.001 by `--lr-scaling` (`sqrt`, the rule for Adam; `linear`, as tfscale scales it
for more replicas), each with `--seeds` seeds, to the target (`--stop-at-target true`),
and for each batch prints:
- the steps to the target, mean and range over the seeds (measured);
- the steps the batch-32 training's gradient noise scale predicts there (each of its steps
  at the noise scale then measured, `tasks.measure.noise_trajectory.predicted_steps_to`), from
  Adam's preconditioned gradient and from the raw gradient;
then McCandlish's hyperbola S = S_min(1 + B_noise/B) fitted to the measured steps, whose
B_noise is the critical batch, beside the noise scale B_simple the batch-32 training
measured. Every training records the noise scale on every graph call
(`train.noise_scale_every: 1`).

    uv run python benchmarks/critical_batch.py [--task synthetic|digits] [--seeds 3]
        [--lr-scaling sqrt|linear]

Targets: the predictions from the raw gradient's noise scale (what tfscale's summary
uses) within 0.67-1.5 of the measured steps at every batch; its B_simple within a factor 3
of the fitted critical batch (McCandlish et al. find B_simple a fair estimate of B_crit,
within an order of magnitude and often much closer). Adam's preconditioned noise scale
(Pollux's choice for Adam) is printed beside it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCHES = (16, 32, 64, 128, 256)


def train(project: Path, params: dict, batch: int, seed: int, power: float) -> dict:
    """One training to the target, its learning rate 0.001 x (batch/32)^power, recording
    the noise scale on every graph call; its metrics.json."""
    from benchmarks.time_to_accuracy import train_to_target

    rate = 0.001 * (batch / 32) ** power
    return train_to_target(
        project, params, f"{batch}-{seed}", batch_size_per_replica=batch, seed=seed,
        learning_rate=rate, noise_scale_every=1,
    )  # fmt: skip


def main() -> None:
    from benchmarks.time_to_accuracy import TASKS, merged
    from tfscale.tasks.measure.noise_trajectory import (
        fit_steps_hyperbola,
        predicted_steps_to,
        split_examples,
        trajectory,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=list(TASKS), default="synthetic")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lr-scaling", choices=("sqrt", "linear"), default="sqrt")
    args = parser.parse_args()
    power = 0.5 if args.lr_scaling == "sqrt" else 1.0
    project = Path(tempfile.mkdtemp(prefix=f"tfscale-bcrit-{args.task}-"))
    params = merged(yaml.safe_load((ROOT / "params.yaml").read_text()), TASKS[args.task])
    params["prepare"]["data_dir"] = str(project / "data")
    params["track"]["store_dir"] = str(project / "mlflow")
    params["train"]["epochs"] = 40
    prepared = project / "params.yaml"
    prepared.write_text(yaml.safe_dump(params))
    tfscale = str(Path(sys.executable).parent / "tfscale")
    subprocess.run([tfscale, "--params", str(prepared), "prepare"], cwd=project, check=True)
    measured: dict[int, list[float | None]] = {}
    # the predictor: a seed of its own at 32, none of the measured ones
    base = train(project, params, 32, 41, power)
    for batch in BATCHES:
        measured[batch] = []
        for seed in range(42, 42 + args.seeds):
            metrics = train(project, params, batch, seed, power)
            reached = metrics["to_target"]
            measured[batch].append(reached["steps"] if reached.get("reached") else None)
        shown = ", ".join("missed" if s is None else f"{s:,}" for s in measured[batch])
        lr = 0.001 * (batch / 32) ** power
        print(
            f"batch {batch:>4} (learning rate {lr:.2g}): steps to target by seed {shown}",
            flush=True,
        )
    path = trajectory(base["gradient_noise"], examples=split_examples(base))
    steps_32 = base["to_target"]["steps"]
    print(
        f"\nthe predictor, a batch-32 training (seed 41), reached the target in {steps_32} "
        f"steps; its noise scale, recorded over {path.recorded_steps} steps: Adam's "
        f"{path.headline('adam', steps_32)[1]:,.0f}, raw {path.headline('raw', steps_32)[1]:,.0f}"
    )
    print(f"{'batch':>6} {'measured steps':>22} {'predicted (Adam)':>17} {'predicted (raw)':>16}")
    ratios = []
    for batch in BATCHES:
        done = [s for s in measured[batch] if s is not None]
        if len(done) < len(measured[batch]):
            print(f"{batch:>6} {'missed by a seed':>22}")
            ratios.append(float("inf"))
            continue
        mean = sum(done) / len(done)
        adam = predicted_steps_to(path, steps_32, 32, batch, "adam")
        raw = predicted_steps_to(path, steps_32, 32, batch, "raw")
        ratios.append(raw / mean)
        print(
            f"{batch:>6} {mean:>10,.0f} ({min(done):,}-{max(done):,}) {adam:>17,.0f} {raw:>16,.0f}"
        )
    complete = [b for b in BATCHES if None not in measured[b]]
    means = [sum(measured[b]) / len(measured[b]) for b in complete]
    fitted = fit_steps_hyperbola(complete, means)
    simple = path.headline("raw", steps_32)[1]
    print(
        f"\ncritical batch (the hyperbola fitted to the measured steps): {fitted.b_crit:,.0f}, "
        f"S_min {fitted.s_min:,.0f}, E_min {fitted.e_min:,.0f}; B_simple (raw) {simple:,.0f}, "
        f"{simple / fitted.b_crit:.2f}x it (target within 3x)"
    )
    held = all(0.67 <= r <= 1.5 for r in ratios)
    print(
        "predicted / measured steps (raw, a rate retuned to each batch): "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + " (target 0.67-1.5): "
        + ("met" if held else "missed")
    )


if __name__ == "__main__":
    main()
