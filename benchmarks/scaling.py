"""Benchmark: scaling efficiency of 2 worker processes x 1 thread (MultiWorkerMirrored, each
pinned to its own core) against 1 process x 1 thread (OneDevice), a compute-bound CNN on
32x32x3 synthetic data, weak scaling; the machine's own ceiling for it (two one-device runs
at once, each on its core, sharing nothing: what two workers could reach if communication
and waiting were free); the same two workers against a plain TensorFlow custom loop on a
model of the same shape (`benchmarks/plain_loop.py`); then float32 against mixed precision
on this CPU.

    uv run python benchmarks/scaling.py [--repeats 3] [--epochs 3] [--batch 128]
                                        [--float16] [--scaling-only]

Every figure comes from worker processes started the same way, in one run. The cases run
in turn `--repeats` times; each figure is the median with its spread (min-max), and the
ratios are medians of the ratios taken within each round. The two-worker case then runs
once more with the in-place diagnosis (`tasks/measure/in_place.py`), which says where its steps go.
Targets: scaling efficiency at least 0.95; tfscale / plain loop at least 1.0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

from tfscale.tasks.data.manifest import load_manifest
from tfscale.tasks.data.preparation import prepare_dataset
from tfscale.tasks.distribute.hardware import detect_hardware
from tfscale.tasks.distribute.launch import launch_workers
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.distribute.strategy import StrategyChoice
from tfscale.tasks.settings.config import load_config

SIDE_BY_SIDE = object()  # the case of two one-device runs at once (`side_by_side`)


def run_under(config, data_dir: str, choice: StrategyChoice, runs_dir: Path) -> Run:
    """A run of `config` under `choice` whose directory (made) is below `runs_dir`."""
    train = dataclasses.replace(config.train, runs_dir=str(runs_dir))
    run = Run(
        dataclasses.replace(config, train=train),
        load_manifest(data_dir),
        data_dir,
        choice,
        detect_hardware(),
    )
    run.run_dir.mkdir(parents=True, exist_ok=True)
    return run


def measure(
    config, data_dir: str, choice: StrategyChoice, runs_dir: Path, threads: int, probe_steps=0
) -> dict:
    """The chief's result of one run under `runs_dir` (`probes` holds its in-place
    diagnosis probes when `probe_steps` asks for them)."""
    run = run_under(config, data_dir, choice, runs_dir)
    spec = {"run": run.to_spec(), "threads": threads, "probe_steps": probe_steps}
    launch_workers(spec, choice.workers, run.run_dir, pin_cores=True)
    return json.loads((run.run_dir / "worker-0-result.json").read_text())


def side_by_side(config, data_dir: str, choice: StrategyChoice, runs_dir: Path) -> float:
    """Two one-device runs at once, each pinned to a core of its own and sharing nothing
    (no all-reduce, no waiting for each other): their mean examples/s. Over one such run
    alone, this is the efficiency the machine itself allows two workers, before any
    communication: cores that share a cache, memory and a hypervisor are slower together
    than one of them alone."""
    import os
    import subprocess
    import sys

    from tfscale.tasks.core.network import free_ports
    from tfscale.tasks.distribute.launch import tf_config

    procs, dirs = [], []
    for index in range(2):
        run = run_under(config, data_dir, choice, runs_dir / f"solo{index}")
        spec_path = run.run_dir / "worker-spec.json"
        spec_path.write_text(json.dumps({"run": run.to_spec(), "threads": 1}))
        env = dict(
            os.environ,
            TF_CONFIG=tf_config([f"localhost:{free_ports(1)[0]}"], 0),
            TFSCALE_PIN_CORE=str(index),
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        log = open(run.run_dir / "worker-0.log", "w")  # noqa: SIM115 (closed by the child)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tfscale.flows.worker", str(spec_path)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        dirs.append(run.run_dir)
    if any(proc.wait() != 0 for proc in procs):
        raise RuntimeError(f"a side-by-side run failed: see {dirs[0]} and {dirs[1]}")
    rates = [json.loads((d / "worker-0-result.json").read_text())["examples_per_s"] for d in dirs]
    return statistics.mean(rates)


def explain(config, data_dir: str, choice: StrategyChoice, run_dir: Path) -> str:
    """The two-worker case once more, diagnosed in its worker processes: why its efficiency
    is what it is."""
    from tfscale.tasks.measure.diagnosis import diagnose_in_place, format_diagnosis
    from tfscale.tasks.measure.in_place import InPlaceProbes

    result = measure(config, data_dir, choice, run_dir, threads=1, probe_steps=10)
    probes = InPlaceProbes(**result["probes"])
    diagnosis = diagnose_in_place(probes, config.train, load_manifest(data_dir), choice, [])
    return format_diagnosis(diagnosis)


def plain_loop(args, run_dir: Path) -> float:
    """Two workers of the plain TensorFlow loop, pinned and single-threaded like tfscale's."""
    import os
    import subprocess
    import sys

    from tfscale.tasks.core.network import free_ports
    from tfscale.tasks.distribute.launch import tf_config

    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "plain.json"
    ports = free_ports(2)
    script = Path(__file__).with_name("plain_loop.py")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(out),
                "--batch",
                str(args.batch),
                "--examples",
                str(args.examples),
                "--epochs",
                str(args.epochs),
            ],
            env=dict(
                os.environ,
                TF_CONFIG=tf_config(ports, i),
                TFSCALE_PIN_CORE=str(i),
                TF_CPP_MIN_LOG_LEVEL="2",
            ),
        )  # fmt: skip
        for i in range(2)
    ]
    if any(proc.wait() != 0 for proc in procs):
        raise RuntimeError("the plain loop's workers failed")
    return json.loads(out.read_text())["examples_per_s"]


def spread(values: list[float]) -> str:
    values = sorted(values)
    return f"{statistics.median(values):8.2f} ({values[0]:.2f}-{values[-1]:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every case")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128, help="examples per replica")
    parser.add_argument("--examples", type=int, default=6144)
    parser.add_argument("--float16", action="store_true", help="also time mixed_float16")
    parser.add_argument("--scaling-only", action="store_true", help="only 1 vs 2 workers")
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
        one, two = "1 process x 1 thread, float32", "2 workers x 1 thread, float32"
        plain = "2 workers x 1 thread, plain TF loop"
        cases = [
            (one, StrategyChoice("one_device", 1, 1, "float32", "")),
            (two, StrategyChoice("multi_worker", 2, 2, "float32", "", communication="ring")),
        ]
        if not args.scaling_only:
            cases.append((plain, None))
            cases.append(
                (
                    "1 process x 1 thread, mixed_bfloat16",
                    StrategyChoice("one_device", 1, 1, "mixed_bfloat16", ""),
                )
            )
        if args.float16:  # on a CPU without float16 units: about 50 examples/s, 15+ minutes
            cases.append(
                (
                    "1 process x 1 thread, mixed_float16",
                    StrategyChoice("one_device", 1, 1, "mixed_float16", ""),
                )
            )
        solo = "2 one-device runs at once, each (no comm.)"
        cases.insert(2, (solo, SIDE_BY_SIDE))
        rounds: list[dict[str, float]] = []
        for r in range(args.repeats):
            rates = {}
            for i, (name, choice) in enumerate(cases):
                run_dir = Path(tmp) / f"round{r}-case{i}"
                if choice is SIDE_BY_SIDE:
                    rates[name] = side_by_side(config, data_dir, cases[0][1], run_dir)
                elif choice is None:
                    rates[name] = plain_loop(args, run_dir)
                else:
                    result = measure(config, data_dir, choice, run_dir, threads=1)
                    rates[name] = result["examples_per_s"]
                print(f"round {r + 1}: {name:<40} {rates[name]:8.0f} examples/s", flush=True)
            rounds.append(rates)
        print(f"\nmedian (min-max) over {args.repeats} rounds")
        for name, _ in cases:
            values = [r[name] for r in rounds]
            print(f"{name:<40} {spread(values)} examples/s")
        efficiency = [r[two] / r[one] / 2 for r in rounds]
        print(f"{'scaling efficiency of 2 workers':<40} {spread(efficiency)}   target 0.95")
        ceiling = [r[solo] / r[one] for r in rounds]
        print(f"{'the machine: 2 runs at once / 1 alone':<40} {spread(ceiling)}"
              "   (the efficiency 2 workers could reach with free communication)")  # fmt: skip
        print(f"{'2 workers / that ceiling':<40} "
              f"{spread([e / c for e, c in zip(efficiency, ceiling, strict=True)])}"
              "   (what the all-reduce and the waiting cost)")  # fmt: skip
        print("\nwhy: the two workers once more, diagnosed in their processes")
        print(explain(config, data_dir, cases[1][1], Path(tmp) / "explained"))
        if not args.scaling_only:
            print(f"{'tfscale / plain TF loop (2 workers)':<40} "
                  f"{spread([r[two] / r[plain] for r in rounds])}   target 1.0")  # fmt: skip
            for name, _ in cases[4:]:
                label = f"{name.split(', ')[1]} / float32"
                print(f"{label:<40} {spread([r[name] / r[one] for r in rounds])}")


if __name__ == "__main__":
    main()
