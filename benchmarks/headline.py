"""Benchmarks of tfscale against what its users do today, ratios from one run:

1. tfscale against a hand-written Keras script in the seeds' style (in-memory arrays,
   `model.fit(x, y, batch_size=32)`), same model and data: examples/s and time to accuracy;
   and against the same script at tfscale's own global batch.
3. End-to-end throughput from TFRecord shards against compute-only throughput.
4. Orchestration overhead: `tfscale run` wall time minus training, diagnosis and evaluation.

    uv run python benchmarks/headline.py [--examples 8192] [--epochs 4] [--batch-size-per-replica N]
                                         [--precision float32]

On a CPU with AMX, `ONEDNN_MAX_CPU_ISA=AVX512_CORE` (or `AVX2`) with `--precision float32`
approximates one without: oneDNN's kernels then stop at that instruction set.

(Benchmark 2, scaling efficiency of 2 worker processes, is benchmarks/scaling.py.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]

KERAS_SCRIPT = """
import json, sys, time
import numpy as np, keras
from tfscale.tasks.settings.config import load_config
from tfscale.tasks.data.manifest import load_manifest
from tfscale.tasks.data.inputs import build_dataset
from tfscale.tasks.train.models import build_model
data_dir, epochs, target = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
batch = int(sys.argv[4])
manifest = load_manifest(data_dir)
x, y = zip(*[(a.numpy(), b.numpy()) for a, b in
             build_dataset(manifest, data_dir, "train", 512, training=False)])
x, y = np.concatenate(x), np.concatenate(y)
keras.utils.set_random_seed(42)
model = build_model("cnn", manifest.shape, manifest.num_classes)
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
class Timer(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None): self.t = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None):
        history.append({"seconds": time.perf_counter() - self.t, "accuracy": logs["accuracy"]})
history = []
model.fit(x, y, batch_size=batch, epochs=epochs, callbacks=[Timer()], verbose=0)
print(json.dumps({"history": history, "examples": len(y)}))
"""


def best_epoch_rate(history: list[dict], examples: int) -> float:
    """The fastest epoch after the first (tracing): a shared machine's slow spells
    lower the mean, never the best."""
    timed = history[1:] or history
    return max(examples / h["seconds"] for h in timed)


def rate_and_tta(history: list[dict], examples: int, target: float) -> tuple[float, float | None]:
    timed = history[1:] or history
    rate = examples * len(timed) / sum(h["seconds"] for h in timed)
    elapsed = 0.0
    for h in history:
        elapsed += h["seconds"]
        if h["accuracy"] >= target:
            return rate, elapsed
    return rate, None


def run(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument(
        "--batch-size-per-replica",
        type=int,
        help="tfscale's per-replica batch (default: params.yaml's)",
    )
    parser.add_argument(
        "--precision",
        help="tfscale's train.precision (default: params.yaml's, auto). A CPU without AMX "
        "can be approximated on one with it by ONEDNN_MAX_CPU_ISA=AVX2 and float32: oneDNN "
        "then has no bfloat16 convolutions, and the hardware's flags still say it has",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tfscale-headline-"))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"].update(dataset="synthetic", data_dir=str(tmp / "data"))
    params["prepare"]["synthetic"]["train_examples"] = args.examples
    params["train"].update(model="cnn", epochs=args.epochs, runs_dir=str(tmp / "runs"))
    if args.batch_size_per_replica:
        params["train"]["batch_size_per_replica"] = args.batch_size_per_replica
    if args.precision:
        params["train"]["precision"] = args.precision
    (tmp / "params.yaml").write_text(yaml.safe_dump(params))
    tfscale = [str(Path(sys.executable).parent / "tfscale"), "--params", str(tmp / "params.yaml")]

    run([*tfscale, "prepare"], cwd=tmp)  # for the Keras script before the run
    data_dir = next((tmp / "data").iterdir())

    def keras(batch_size: int) -> dict:
        command = [sys.executable, "-c", KERAS_SCRIPT, str(data_dir), str(args.epochs)]
        command += [str(args.target), str(batch_size)]
        return json.loads(run(command, cwd=ROOT).strip().splitlines()[-1])

    keras_before = keras(32)
    started = time.perf_counter()
    run([*tfscale, "run"], cwd=tmp)
    wall = time.perf_counter() - started
    (distributed,) = [p.parent for p in (tmp / "runs").rglob("summary.json")]
    (baseline,) = [
        p.parent
        for p in (tmp / "runs").rglob("metrics.json")
        if p.parent.name.startswith("one_device")
    ]
    metrics = json.loads((distributed / "metrics.json").read_text())
    diagnosis = json.loads((distributed / "diagnosis.json").read_text())
    evaluation = json.loads((distributed / "eval.json").read_text())
    base_seconds = json.loads((baseline / "metrics.json").read_text())["train_seconds"]
    work = metrics["train_seconds"] + base_seconds + diagnosis["seconds"] + evaluation["seconds"]

    keras_after = keras(32)
    keras_same = keras(metrics["global_batch"])  # the library at tfscale's own global batch
    keras_out = max(  # the better of the runs before and after tfscale's
        (keras_before, keras_after),
        key=lambda out: best_epoch_rate(out["history"], out["examples"]),
    )
    k_rate = best_epoch_rate(keras_out["history"], keras_out["examples"])
    k_tta = rate_and_tta(keras_out["history"], keras_out["examples"], args.target)[1]
    t_rate = best_epoch_rate(metrics["history"], metrics["history"][-1]["examples"])
    t_tta = rate_and_tta(metrics["history"], 1, args.target)[1]
    s_rate = best_epoch_rate(keras_same["history"], keras_same["examples"])
    s_tta = rate_and_tta(keras_same["history"], keras_same["examples"], args.target)[1]
    print(
        f"1. tfscale ({metrics['strategy']}, {metrics['replicas']} replicas, "
        f"{metrics['precision']}, global batch {metrics['global_batch']}) {t_rate:,.0f} ex/s vs "
        f"Keras fit(batch_size=32) {k_rate:,.0f} ex/s "
        f"(best epoch each): {t_rate / k_rate:.2f}x"
    )
    if t_tta and k_tta:
        print(
            f"   time to {args.target:.0%} train accuracy: tfscale {t_tta:.1f} s, Keras fit "
            f"{k_tta:.1f} s: {k_tta / t_tta:.2f}x"
        )
    else:
        print(
            f"   time to {args.target:.0%}: tfscale {t_tta}, Keras fit {k_tta} (None: not reached)"
        )
    print(
        f"   vs Keras fit at tfscale's global batch ({metrics['global_batch']}): "
        f"{s_rate:,.0f} ex/s: {t_rate / s_rate:.2f}x; time to {args.target:.0%}: "
        f"{s_tta if s_tta is None else round(s_tta, 1)} s"
        + (f": {s_tta / t_tta:.2f}x" if s_tta and t_tta else "")
    )
    from tfscale.tasks.measure.probes import RoundRates

    rounds = RoundRates(**diagnosis["rounds"])
    print(
        f"3. end-to-end / compute-only in the run's own {len(rounds.rates['compute'])} "
        f"alternating rounds: {rounds.input_share.text('', 2)}; speedup "
        f"{rounds.speedup.text()} (median, range over the rounds)"
    )
    print(
        f"4. tfscale run {wall:.1f} s wall; training {metrics['train_seconds'] + base_seconds:.1f}"
        f" s, diagnosis {diagnosis['seconds']:.1f} s, evaluation {evaluation['seconds']:.1f} s;"
        f" orchestration overhead {wall - work:.1f} s"
    )


if __name__ == "__main__":
    main()
