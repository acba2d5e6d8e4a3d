"""Benchmark: tfscale's fixed costs beside a plain Keras script's, side by side in one run.

1. A seed-style script (the digits in memory, a Dense net, `model.fit(batch_size=32)` an
   epoch at a time until 95% test accuracy) against `tfscale prepare && tfscale train &&
   tfscale evaluate` on the same digits, in alternating rounds after a warm-up round that
   is left out (it fills the shards and the autotune cache, as a second use would find
   them).
2. The default `tfscale run`'s wall time split by its console's status lines, timed as they
   arrive: start-up (interpreter, TensorFlow's import while a Prefect API boots), prepare
   and selection, autotune, the two trainings, the measuring rounds (from the `distributed`
   line, which comes as its training ends, to the `diagnosis` line), evaluation, tracking
   and exit. A bare `import tensorflow` is timed in the same
   rounds: orchestration is what the run spends beyond it and beyond the work (autotune,
   trainings, rounds, evaluation), that is what tfscale adds to a script doing the same.

    uv run python benchmarks/fixed_costs.py [--rounds 3]

Targets (a 2-core machine): the three commands at most 1.5x the script; orchestration
under 8 s; the default run at most 45 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SEED_SCRIPT = """
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32")
x_train, x_test, y_train, y_test = train_test_split(
    x, y, test_size=0.2, random_state=42, stratify=y
)
keras = tf.keras
model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(128, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
for epoch in range(50):
    model.fit(x_train, y_train, batch_size=32, epochs=1, verbose=0)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if accuracy >= 0.95:
        break
print(f"epoch {epoch + 1}: test accuracy {accuracy:.4f}")
"""
# the status lines of `tfscale run` that end a phase, in the order they come
PHASES = [
    ("start", "start-up: interpreter, imports, Prefect API"),
    ("prepare", "start-up: interpreter, imports, Prefect API"),
    ("strategy", "selection and autotune"),
    ("baseline", "baseline training"),
    ("distributed", "distributed training"),  # its line comes as its training ends
    ("diagnosis", "measuring rounds"),  # its line as the rounds (and the diagnosis) end
    ("evaluate", "evaluation"),
    ("track", "tracking"),
]


def timed(command: list[str], cwd: Path) -> tuple[float, list[tuple[float, str]]]:
    """Wall seconds of `command`, and each output line with the second it arrived."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = [(time.perf_counter() - started, line.rstrip()) for line in proc.stdout]
    if proc.wait():
        sys.exit(f"{' '.join(command)} failed:\n" + "\n".join(t for _, t in lines[-30:]))
    return time.perf_counter() - started, lines


def project_params(project: Path) -> Path:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["data_dir"] = str(project / "data")
    params["train"]["runs_dir"] = str(project / "runs")
    params["track"]["store_dir"] = str(project / "mlflow")
    path = project / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def trio(project: Path, params: Path) -> float:
    """`tfscale prepare && tfscale train && tfscale evaluate`, in seconds."""
    return sum(
        timed([str(BIN / "tfscale"), "--params", str(params), command], project)[0]
        for command in ("prepare", "train", "evaluate")
    )


def run_phases(project: Path, params: Path) -> dict[str, float]:
    """The default `tfscale run` split into phases (seconds), from its status lines."""
    wall, lines = timed([str(BIN / "tfscale"), "--params", str(params), "run"], project)
    ends: dict[str, float] = {}
    for at, text in lines:
        name = text.split(" ", 1)[0]
        if name in {n for n, _ in PHASES} and name not in ends:
            ends[name] = at
    phases: dict[str, float] = {}
    previous = 0.0
    for name, label in PHASES:
        at = ends.get(name, previous)
        phases[label] = phases.get(label, 0.0) + at - previous
        previous = at
    return {**phases, "summary and exit": wall - previous, "wall": wall}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.1f} s ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after a warm-up")
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="tfscale-fixed-"))
    script = project / "seed.py"
    script.write_text(SEED_SCRIPT)
    params = project_params(project)
    python = str(BIN / "python")
    seed, three, tf_import, runs = [], [], [], []
    for index in range(args.rounds + 1):  # round 0: the warm-up, left out
        figures = (
            timed([python, str(script)], project)[0],
            trio(project, params),
            timed([python, "-c", "import tensorflow"], project)[0],
            run_phases(project, params),
        )
        label = "warm-up" if index == 0 else f"round {index}"
        print(
            f"{label}: script {figures[0]:.1f} s, prepare+train+evaluate {figures[1]:.1f} s, "
            f"import tensorflow {figures[2]:.1f} s, tfscale run {figures[3]['wall']:.1f} s",
            flush=True,
        )
        if index:
            seed.append(figures[0])
            three.append(figures[1])
            tf_import.append(figures[2])
            runs.append(figures[3])
    ratios = [t / s for t, s in zip(three, seed, strict=True)]
    print(f"\nseed-style script          {spread(seed)}")
    print(f"prepare + train + evaluate {spread(three)}")
    print(
        f"  ratio {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) "
        f"(target <= 1.5x)"
    )
    print(f"import tensorflow          {spread(tf_import)}")
    print("\ntfscale run, by phase:")
    for label in runs[0]:
        print(f"  {label:<42} {spread([r[label] for r in runs])}")
    work = ("selection and autotune", "baseline training", "distributed training")
    overhead = [
        r["wall"] - t - sum(r[w] for w in work) - r["measuring rounds"] - r["evaluation"]
        for r, t in zip(runs, tf_import, strict=True)
    ]
    print(f"orchestration (wall - import tensorflow - the work): {spread(overhead)} (target < 8 s)")
    wall = [r["wall"] for r in runs]
    print(f"tfscale run: {spread(wall)} (target <= 45 s)")


if __name__ == "__main__":
    main()
