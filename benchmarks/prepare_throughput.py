"""Benchmark: TFRecord write rate and peak memory of a large `synthetic` prepare, then the
input pipeline's examples/s against the same examples served from in-memory arrays; and a
table's: a 1,000,000-row, 32-column numeric CSV prepared by tfscale (streamed in blocks)
against pandas reading the same file and a plain `tf.io.TFRecordWriter` writing the same
records in one loop, alternating, each in a process of its own (peak memory is each
process's own), then the input pipeline from its shards against what training a small
Dense model on 2 replicas consumes (tfscale's own diagnosis: input-only and compute-only,
in alternating rounds).

    uv run python benchmarks/prepare_throughput.py            # 2 GB, 64x64x3; 1M rows
    uv run python benchmarks/prepare_throughput.py --gb 0.2 --rows 200000   # a quick look
    uv run python benchmarks/prepare_throughput.py --only table

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
from tfscale.tasks.settings.config import load_config
from tfscale.tasks.data.preparation import prepare_dataset
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

    from tfscale.tasks.data.inputs import build_dataset
    from tfscale.tasks.data.manifest import load_manifest

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


TABLE_PREPARE = """
import json, resource, sys, time
started = time.perf_counter()
from tfscale.tasks.settings.config import load_config
from tfscale.tasks.data.preparation import prepare_dataset
r = prepare_dataset(load_config(None, json.loads(sys.argv[1])), progress=False)
print(json.dumps({"seconds": time.perf_counter() - started, "dir": r.data_dir,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

# what a user writes without tfscale: pandas reads the table, one loop writes the records
PANDAS_WRITER = """
import json, resource, sys, time
started = time.perf_counter()
import pandas as pd
import tensorflow as tf
frame = pd.read_csv(sys.argv[1])
label = frame.pop("label").to_numpy()
columns = list(frame.columns)
values = frame.to_numpy("float32")
with tf.io.TFRecordWriter(sys.argv[2]) as writer:
    for row, y in zip(values.tolist(), label.tolist()):
        feature = {c: tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
                   for c, v in zip(columns, row)}
        feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        writer.write(example.SerializeToString(deterministic=True))
print(json.dumps({"seconds": time.perf_counter() - started,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_table(path: Path, rows: int) -> None:
    """`rows` rows of 31 seeded float columns and an integer label of 10 classes, written
    in blocks (pyarrow's CSV writer)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pc

    rng = np.random.default_rng(0)
    weights = rng.normal(size=31)
    names = [f"f{i:02d}" for i in range(31)] + ["label"]
    with pc.CSVWriter(
        path, pa.schema([(n, pa.float32()) for n in names[:-1]] + [("label", pa.int64())])
    ) as out:
        for start in range(0, rows, 100_000):
            x = rng.normal(size=(min(100_000, rows - start), 31)).astype("float32")
            y = np.digitize(x @ weights, np.quantile(x @ weights, np.linspace(0.1, 0.9, 9)))
            columns = [pa.array(x[:, i]) for i in range(31)] + [pa.array(y.astype("int64"))]
            out.write_table(pa.table(columns, names=names))


def child(script: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", script, *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    values = sorted(values)
    return f"{values[len(values) // 2]:,.2f} ({values[0]:,.2f}-{values[-1]:,.2f})"


def table_benchmark(tmp: Path, rows: int, repeats: int) -> None:
    import shutil

    table = tmp / "big.csv"
    write_table(table, rows)
    mb = table.stat().st_size / 1e6
    ours, theirs = [], []
    for i in range(repeats):  # alternating, each a process of its own
        overrides = {
            "prepare.dataset": str(table),
            "prepare.data_dir": str(tmp / f"shards{i}"),
            "prepare.min_shards": 8,
        }
        ours.append(child(TABLE_PREPARE, json.dumps(overrides)))
        theirs.append(child(PANDAS_WRITER, str(table), str(tmp / "plain.tfrecord")))
        if i < repeats - 1:
            shutil.rmtree(tmp / f"shards{i}")
    rate = lambda runs: [rows / r["seconds"] for r in runs]  # noqa: E731
    ratios = [o / t for o, t in zip(rate(ours), rate(theirs), strict=True)]
    print(
        f"table        {rows:,} rows x 32 columns ({mb:.0f} MB CSV), {repeats} alternating runs "
        f"(median, range), each from its process's start:"
    )
    print(
        f"  tfscale prepare          {spread(rate(ours))} rows/s, peak RSS "
        f"{spread([r['peak_rss_mb'] for r in ours])} MB"
    )
    print(
        f"  pandas + TFRecordWriter  {spread(rate(theirs))} rows/s, peak RSS "
        f"{spread([r['peak_rss_mb'] for r in theirs])} MB"
    )
    print(f"  rate ratio (tfscale / pandas + writer): {spread(ratios)}")
    data_dir = ours[-1]["dir"]
    diagnosis = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfscale.flows.cli",
            "train",
            "--dataset",
            str(table),
            "--data-dir",
            str(tmp / f"shards{repeats - 1}"),
            "--runs-dir",
            str(tmp / "runs"),
            "--model",
            "mlp",
            "--strategy",
            "mirrored",
            "--replicas",
            "2",
            "--epochs",
            "1",
            "--precision",
            "float32",
            "--jit-compile",
            "false",
            "--batch-size-per-replica",
            "32",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    line = next((x for x in diagnosis.stdout.splitlines() if x.startswith("input-only")), None)
    print(f"  input from {data_dir}: {line or diagnosis.stdout[-800:] + diagnosis.stderr[-800:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="training data size in GB")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rows", type=int, default=1_000_000, help="the table's rows")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each table writer")
    parser.add_argument("--only", choices=("synthetic", "table"), default=None)
    args = parser.parse_args()
    if args.only != "synthetic":
        with tempfile.TemporaryDirectory(prefix="tfscale-bench-") as tmp:
            table_benchmark(Path(tmp), args.rows, args.repeats)
    if args.only == "table":
        return
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
