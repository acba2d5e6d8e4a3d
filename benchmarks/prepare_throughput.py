"""Benchmark: TFRecord write rate and peak memory of a large `synthetic` prepare, then the
input pipeline's examples/s against the same examples served from in-memory arrays.

    uv run python benchmarks/prepare_throughput.py            # 2 GB, 64x64x3
    uv run python benchmarks/prepare_throughput.py --gb 0.2   # a quick look

Ratios are taken side by side in one run; absolute figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PREPARE = """
import json, sys
from tasks.settings.config import load_config
from tasks.data.preparation import prepare_dataset
config = load_config(None, json.loads(sys.argv[1]))
r = prepare_dataset(config, progress=True)
print(json.dumps({"seconds": r.seconds, "bytes": r.total_bytes, "dir": r.data_dir}))
"""


def run_prepare(workdir: Path, gb: float, size: int) -> dict:
    per_example = size * size * 3
    overrides = {
        "prepare.dataset": "synthetic",
        "prepare.data_dir": str(workdir),
        "prepare.synthetic.train_examples": int(gb * 1e9 / per_example),
        "prepare.synthetic.test_examples": 1000,
        "prepare.synthetic.height": size,
        "prepare.synthetic.width": size,
        "prepare.target_shard_mb": 100,
    }
    out = subprocess.run(
        [sys.executable, "-c", PREPARE, json.dumps(overrides)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return result


def examples_per_second(dataset, batches: int) -> float:
    iterator = iter(dataset)
    for _ in range(5):  # warm-up: tracing, thread pools, first reads
        next(iterator)
    started = time.perf_counter()
    count = 0
    for _ in range(batches):
        count += int(next(iterator)[1].shape[0])
    return count / (time.perf_counter() - started)


def compare_pipelines(data_dir: str, batch: int, batches: int) -> tuple[float, float]:
    import numpy as np
    import tensorflow as tf

    from tasks.data.inputs import build_dataset
    from tasks.data.manifest import load_manifest

    manifest = load_manifest(data_dir)
    shards = build_dataset(manifest, data_dir, "train", batch, training=True).repeat()
    n = batch * 64
    x, y = [], []
    for images, labels in build_dataset(manifest, data_dir, "train", batch, training=False):
        x.append((images.numpy() * 255).astype(np.uint8))
        y.append(labels.numpy())
        if sum(map(len, y)) >= n:
            break
    x, y = np.concatenate(x)[:n], np.concatenate(y)[:n]
    memory = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .shuffle(4096)
        .batch(batch)
        .map(lambda a, b: (tf.cast(a, tf.float32) / 255.0, b), num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    return examples_per_second(shards, batches), examples_per_second(memory, batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="training data size in GB")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfscale-bench-") as tmp:
        prep = run_prepare(Path(tmp), args.gb, args.image_size)
        mb = prep["bytes"] / 1e6
        print(
            f"prepare      {mb:.0f} MB in {prep['seconds']:.1f} s: "
            f"{mb / prep['seconds']:.1f} MB/s written, peak RSS {prep['peak_rss_mb']:.0f} MB"
        )
        tfrecord, memory = compare_pipelines(prep["dir"], args.batch, args.batches)
        print(
            f"input        TFRecord shards {tfrecord:,.0f} ex/s, in-memory arrays "
            f"{memory:,.0f} ex/s, ratio {tfrecord / memory:.2f}"
        )


if __name__ == "__main__":
    main()
