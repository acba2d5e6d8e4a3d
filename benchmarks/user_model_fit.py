"""Benchmark: tfscale's training step on a user's model against the same model's own
`model.fit`, under the same strategy (Mirrored over 2 logical CPUs) and global batch.

The four models of docs/your-model.md, each on its data (breast cancer and diabetes as
tables, seeded token sequences, the digits as two features): tfscale's epoch runner as a
training runs it (graph calls of `train.steps_per_call` steps, the gradient noise scale
recorded one call in 10) and `model.fit` with `steps_per_execution` the same, on the same
tf.data input at the same global batch. Blocks of `--steps` steps of each alternate, in
turns, for `--rounds` rounds in this one process; each round's fit seconds over tfscale's
are printed with their median and range: fit's timed from its first step to its end (a
callback), so that the set-up of each `fit` call does not count against it; the whole
calls' ratio beside it.

    uv run python benchmarks/user_model_fit.py [--rounds 7] [--steps 300]

Target: at least 1.0x (fit's time over tfscale's, the median of the rounds) on each model,
the SGD-momentum sequence model among them.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
sys.path.insert(0, str(ROOT))

# (name, dataset, model, label)
MODELS = (
    ("table classifier, AdamW", "cancer.csv", "table_classifier.py:build", "target"),
    ("regression, Adam", "diabetes.csv", "table_regression.py:build", "target"),
    ("sequences, SGD momentum", "sequences.py:tokens", "sequences.py:build", "label"),
    ("two inputs (.keras), Adam", "digits2.npz", "two_inputs.keras", "label"),
)


def write_data(folder: Path) -> None:
    """The examples and their data files, in `folder` (the working directory)."""
    from sklearn.datasets import load_breast_cancer, load_diabetes

    for path in EXAMPLES.glob("*.py"):
        shutil.copy(path, folder / path.name)
    load_breast_cancer(as_frame=True).frame.to_csv(folder / "cancer.csv", index=False)
    load_diabetes(as_frame=True).frame.to_csv(folder / "diabetes.csv", index=False)
    sys.path.insert(0, str(folder))
    import two_inputs

    two_inputs.arrays(str(folder / "digits2.npz"))
    two_inputs.save(str(folder / "two_inputs.keras"))


def runners(dataset: str, model: str, label: str, folder: Path, per_replica: int):
    """tfscale's epoch runner and a `fit` of the same model, each `(steps) -> None`."""
    import keras

    from tfscale.tasks.data.inputs import Reading, build_dataset
    from tfscale.tasks.data.preparation import prepare_dataset
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.settings.config import load_config
    from tfscale.tasks.train.fit_loop import FirstStepClock
    from tfscale.tasks.train.model_inputs import as_model_takes
    from tfscale.tasks.train.models import model_for_data
    from tfscale.tasks.train.training import set_up_training, train_dataset_fn

    values = {
        "prepare.dataset": dataset,
        "prepare.label": label,
        "prepare.data_dir": str(folder / "data"),
        "train.model": model,
        "train.strategy": "mirrored",
        "train.replicas": 2,
        "train.precision": "float32",
        "train.jit_compile": False,
        "train.batch_size_per_replica": per_replica,
    }
    config = load_config(None, values)
    prepared = prepare_dataset(config, progress=False)
    manifest, data_dir = prepared.manifest, prepared.data_dir
    choice = select_strategy(detect_hardware(), config.train)
    setup = set_up_training(config.train, manifest, choice)
    dataset_fn = train_dataset_fn(config.train, setup.manifest, data_dir, setup.per_replica)
    run_epoch = setup.epoch_runner(choice, dataset_fn)

    with setup.strategy.scope():
        fitted = model_for_data(model, manifest.spec).model  # compiled by the user's function
        metrics = [  # the user's, fresh
            m if isinstance(m, str) else keras.saving.deserialize_keras_object(m)
            for m in fitted.get_compile_config().get("metrics") or []
        ]
        fitted.compile(
            optimizer=fitted.optimizer,
            loss=fitted.loss,
            metrics=metrics,
            steps_per_execution=config.train.steps_per_call,
        )
    reading = Reading(seed=config.train.seed)
    taken = as_model_takes(manifest, fitted)  # the features under the model's input names
    train = build_dataset(taken, data_dir, "train", setup.global_batch, True, reading).repeat()

    def tfscale(steps: int) -> None:
        run_epoch(steps)  # its steps alone: the runner is made once

    clock = FirstStepClock()

    def fit(steps: int) -> float:
        fitted.fit(train, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
        return clock.seconds

    return {"tfscale": tfscale, "fit": fit}, setup


def timed(run, steps: int) -> tuple[float, float]:
    """The whole call's seconds, and the steps' alone (fit's from its clock)."""
    started = time.perf_counter()
    steps_alone = run(steps)
    whole = time.perf_counter() - started
    return whole, whole if steps_alone is None else steps_alone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size-per-replica", type=int, default=32)
    args = parser.parse_args()
    from tfscale.tasks.core.process import set_up_devices

    set_up_devices(2)
    folder = Path(tempfile.mkdtemp(prefix="tfscale-fit-"))
    import os

    os.chdir(folder)
    write_data(folder)
    verdicts = []
    for name, dataset, model, label in MODELS:
        runs, setup = runners(dataset, model, label, folder, args.batch_size_per_replica)
        for run in runs.values():
            run(args.steps)  # traced
        ratios, whole, step_ms = [], [], []
        for r in range(args.rounds):
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]  # in turns
            seconds = {key: timed(runs[key], args.steps) for key in order}
            ratios.append(seconds["fit"][1] / seconds["tfscale"][1])
            whole.append(seconds["fit"][0] / seconds["tfscale"][0])
            step_ms.append(seconds["tfscale"][1] / args.steps * 1e3)
        median = statistics.median(ratios)
        optimizer = getattr(setup.optimizer, "inner_optimizer", setup.optimizer)
        print(
            f"{name}: fit's steps take {median:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"tfscale's time over {args.rounds} rounds of {args.steps} steps; whole calls "
            f"{statistics.median(whole):.2f}x ({min(whole):.2f}-{max(whole):.2f}) (tfscale "
            f"{statistics.median(step_ms):.2f} ms a step, global batch {setup.global_batch}, "
            f"{type(optimizer).__name__})",
            flush=True,
        )
        verdicts.append((name, median >= 1.0))
    print("; ".join(f"{n}: {'met' if ok else 'missed'}" for n, ok in verdicts))


if __name__ == "__main__":
    main()
