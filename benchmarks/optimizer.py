"""Benchmark: tfscale's fused Adam (`tasks.train.steps.FusedAdam`, one `ResourceApplyAdam` kernel a
variable) against Keras's Adam (a dozen small ops a variable), on the same model, batch and
input, under Mirrored over 2 logical CPU devices (each with its share of the cores, as the
pipeline runs it):

- examples/s of each, in alternating rounds of `--steps` steps in one process (median and
  range), and the per-round ratio;
- the first graph call (which traces the step, and so sits in the first epoch and in the
  time to accuracy), each in a process of its own, alternating, `--traces` times.

    uv run python benchmarks/optimizer.py [--dataset digits|synthetic] [--rounds 7]

Target: the fused update at least as fast as Keras's in every round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build(dataset: str, data_root: str, optimizer: str):
    """A Mirrored run's setup and epoch runner over 2 logical CPUs, with `optimizer`."""
    from tfscale.tasks.core import process

    process.set_up_devices(2)
    import keras

    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.distribute.strategy import StrategyChoice
    from tfscale.tasks.settings.config import load_config
    from tfscale.tasks.train.steps import make_warmup_schedule
    from tfscale.tasks.train.training import set_up_training, train_dataset_fn

    cfg = load_config(
        None,
        {"prepare.dataset": dataset, "prepare.data_dir": data_root, "train.model": "cnn"},
    )
    prepared = prepare_dataset(cfg, progress=False)
    choice = StrategyChoice("mirrored", 2, 1, "float32", "")
    setup = set_up_training(cfg.train, prepared.manifest, choice)
    if optimizer == "keras":
        with setup.strategy.scope():
            schedule = make_warmup_schedule(cfg.train.learning_rate, setup.learning_rate, 0)
            adam = keras.optimizers.Adam(schedule)
            adam.build(setup.model.trainable_variables)
        setup.optimizer = adam
    feed = train_dataset_fn(cfg.train, prepared.manifest, prepared.data_dir, setup.per_replica)
    return setup, setup.epoch_runner(choice, feed)


def first_call(dataset: str, data_root: str, optimizer: str) -> float:
    """Seconds of the first one-step graph call in this (fresh) process."""
    _, run_epoch = build(dataset, data_root, optimizer)
    started = time.perf_counter()
    run_epoch(1)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits", choices=["digits", "synthetic"])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (after a warm-up)")
    parser.add_argument("--steps", type=int, default=300, help="steps a block")
    parser.add_argument("--traces", type=int, default=3, help="fresh processes of each")
    parser.add_argument("--first-call", nargs=2, metavar=("DATA_ROOT", "OPTIMIZER"))
    args = parser.parse_args()
    if args.first_call:  # the child process of the trace timing
        print(json.dumps(first_call(args.dataset, *args.first_call)))
        return
    from tfscale.tasks.measure.rounds import Spread, alternate, ratio

    names = ("keras", "fused")
    with tempfile.TemporaryDirectory(prefix="tfscale-optimizer-") as data_root:
        runners = {name: build(args.dataset, data_root, name) for name in names}

        def block(name: str):
            setup, run_epoch = runners[name]

            def timed() -> float:
                started = time.perf_counter()
                run_epoch(args.steps)
                return args.steps * setup.step_examples / (time.perf_counter() - started)

            return timed

        rates = alternate({name: block(name) for name in names}, args.rounds)
        traces: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.traces):
            for name in names:
                command = [sys.executable, __file__, "--dataset", args.dataset]
                command += ["--first-call", data_root, name]
                out = subprocess.run(command, capture_output=True, text=True, check=True)
                traces[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.dataset} CNN, Mirrored over 2 logical CPUs, float32, {args.rounds} rounds")
    trace = {name: Spread.of(traces[name]).text(" s") for name in names}
    for name in names:
        rate = Spread.of(rates[name]).text(" ex/s", 0)
        print(f"{name:<6} Adam  {rate}   first call (trace) {trace[name]}")
    per_round = ratio(rates["fused"], rates["keras"])
    faster = sum(f > k for f, k in zip(rates["fused"], rates["keras"], strict=True))
    print(
        f"fused / Keras: {per_round.text()} examples/s, faster in {faster} of {args.rounds} "
        f"rounds (target: every round); first call {trace['keras']} against {trace['fused']}"
    )


if __name__ == "__main__":
    main()
