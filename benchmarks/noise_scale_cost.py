"""Benchmark: what recording the gradient noise scale costs a training.

Builds the default training (digits, the default CNN, float32, 32 a replica) on one
device and on Mirrored over 2 logical CPUs, each with epoch runners over the same model and
optimizer: the plain step; the training as shipped, where one graph call in
`GradientNoise.EVERY_CALLS` records the noise scale's norms; and every call recording (on
one device, each batch in two halves). Blocks of `--steps` steps of each alternate, in
turns, for `--rounds` rounds in this one process, and each round's ratio to the plain
block's seconds is printed with their median and range.

    uv run python benchmarks/noise_scale_cost.py [--rounds 9] [--steps 200]

Target: the training as shipped takes at most 1.02 times the plain steps' time (median of
the rounds), on each strategy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def runners(kind: str, data: tuple, runs_dir: Path):
    """The plain, shipped and every-call epoch runners of one training setup, and the
    recorder."""
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.settings.config import load_config
    from tfscale.tasks.train.steps import GradientNoise
    from tfscale.tasks.train.training import set_up_training, train_dataset_fn

    overrides, manifest, data_dir = data
    values = {**overrides, "train.strategy": kind, "train.precision": "float32"}
    values |= {"train.jit_compile": False, "train.batch_size_per_replica": 32}
    values |= {"train.runs_dir": str(runs_dir)}
    config = load_config(None, values)
    report = detect_hardware()
    run = Run(config, manifest, data_dir, select_strategy(report, config.train), report)
    setup = set_up_training(run.train, manifest, run.choice)
    dataset_fn = train_dataset_fn(run.train, manifest, data_dir, setup.per_replica)
    noise = GradientNoise(
        setup.strategy, setup.optimizer, setup.replicas, setup.per_replica, 1,
        setup.step_examples,
    )  # fmt: skip
    plain = setup.epoch_runner(run.choice, dataset_fn)  # made while nothing records
    # the optimizer's all-reduce records what a recording step staged (`FusedAdam.noise`)
    setup.optimizer.noise = noise
    runs = {"plain": plain}
    for every in sorted({1, 5, GradientNoise.EVERY_CALLS}):
        noise.every_calls = every
        runs[every_name(every)] = setup.epoch_runner(run.choice, dataset_fn)
    for runner in runs.values():
        runner(200)  # traced (a sampling runner: both of its graphs)
    noise.read()
    return runs, noise


def every_name(every: int) -> str:
    from tfscale.tasks.train.steps import GradientNoise

    shipped = " (as shipped)" if every == GradientNoise.EVERY_CALLS else ""
    return ("every call" if every == 1 else f"1 call in {every}") + shipped


def timed(run_epoch, steps: int) -> float:
    """Seconds for `steps` steps (whole graph calls of 10, as training runs them)."""
    started = time.perf_counter()
    run_epoch(steps)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    from tfscale.tasks.core.process import set_up_devices

    set_up_devices(2)
    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.settings.config import load_config

    root = Path(tempfile.mkdtemp(prefix="tfscale-noise-cost-"))
    overrides = {"prepare.data_dir": str(root / "data")}
    prepared = prepare_dataset(load_config(None, overrides), progress=False)
    data = (overrides, prepared.manifest, prepared.data_dir)
    from tfscale.tasks.train.steps import GradientNoise

    verdicts = []
    for kind in ("one_device", "mirrored"):
        runs, noise = runners(kind, data, root / "runs")
        ratios: dict[str, list[float]] = {name: [] for name in runs if name != "plain"}
        for r in range(args.rounds):
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]  # in turns
            seconds = {name: timed(runs[name], args.steps) for name in order}
            for name in ratios:
                ratios[name].append(seconds[name] / seconds["plain"])
            print(
                f"{kind:<10} round {r + 1}: plain {seconds['plain'] / args.steps * 1e3:.2f} ms "
                "a step; " + ", ".join(f"{n} {v[-1]:.3f}" for n, v in ratios.items()),
                flush=True,
            )
        window = noise.read()
        shipped = every_name(GradientNoise.EVERY_CALLS)
        for name, values in ratios.items():
            median = statistics.median(values)
            target = " (target <= 1.02)" if name == shipped else ""
            print(
                f"{kind}, {name}: {median:.3f} ({min(values):.3f}-{max(values):.3f}) the plain "
                f"steps' time over {args.rounds} rounds{target}"
            )
        print(
            f"{kind}: recorded {window['steps']} steps, B_small {window['small_batch']}, B_big "
            f"{window['big_batch']}"
        )
        met = statistics.median(ratios[shipped]) <= 1.02 and window["steps"] > 0
        verdicts.append((kind, met))
    print("; ".join(f"{k}: {'met' if ok else 'missed'}" for k, ok in verdicts))


if __name__ == "__main__":
    main()
