"""The tf.data input pipeline: prepared shards into batches, sharded per input pipeline."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from tfscale.tasks.core.internals import device_datasets_without_autotune
from tfscale.tasks.data.manifest import Manifest, ShardError
from tfscale.tasks.data.records import parse_images, parse_records

log = logging.getLogger(__name__)


PARSE_BLOCK_BYTES = 4 << 20


def parse_block(spec, batch_size: int) -> int:
    """Batches parsed at once for features other than an image's: a call to
    `tf.io.parse_example` costs about as much for a batch of 32 rows of a table as for 512,
    so up to 64 batches (and about `PARSE_BLOCK_BYTES`) are parsed together. On a 13-column
    table at batch 32 the input gave 46,000 examples/s parsed batch by batch and 155,000
    in blocks of 16; on 32 columns 152,000 in blocks of 4, 179,000 of 16, 190,000 of 64."""
    per_batch = max(batch_size * spec.example_bytes(), 1)
    return max(1, min(64, PARSE_BLOCK_BYTES // per_batch))


@dataclass(frozen=True)
class Reading:
    """How one input pipeline reads its split: which of `pipelines` it is (`pipeline_id`),
    the shuffle's `seed` and the examples held to shuffle (`shuffle_buffer`), whether
    the serialized records stay in memory after the first pass (`cache`), and whether its
    batches carry each example's weight (`weighted`: training's)."""

    pipelines: int = 1
    pipeline_id: int = 0
    seed: int = 42
    cache: bool = False
    shuffle_buffer: int = 4096
    weighted: bool = False  # with each example's weight, where the data has them


def build_dataset(
    manifest: Manifest,
    data_dir: str | Path,
    split: str,
    batch_size: int,
    training: bool,
    reading: Reading = Reading(),  # noqa: B008 (frozen: one shared default is safe)
) -> tf.data.Dataset:
    """A dataset of `(features, labels)` batches for one input pipeline (and each example's
    weight where the data and the `reading` are weighted): images, or any features as the
    manifest records them (`tasks.data.records.parse_records`).

    Training reads shards in parallel, interleaved; evaluation reads them in
    manifest order. Files are split between pipelines (FILE policy) when there are at least as
    many shards as pipelines, otherwise every pipeline reads all files and keeps
    every n-th record (DATA policy, with a warning). Training batches are shuffled
    with the reading's seed and have a static batch dimension; evaluation batches keep the
    remainder, so every example is seen exactly once across pipelines. `batch_size` is
    this pipeline's (`Reading`).
    """
    num_pipelines, pipeline_id, seed = reading.pipelines, reading.pipeline_id, reading.seed
    files, by_file = _pipeline_files(manifest, data_dir, split, num_pipelines, pipeline_id)
    spec = manifest.spec
    ds = _records(files, training, seed, parallel=spec.is_image)
    if not by_file and num_pipelines > 1:
        ds = ds.shard(num_pipelines, pipeline_id)
    if reading.cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(reading.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    static = batch_size if training else None
    if spec.is_image:
        ds = ds.batch(batch_size, drop_remainder=training)
        ds = ds.map(
            lambda s: parse_images(s, spec.shape, static),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    else:  # parsed in blocks of batches, then cut into batches: the same batches, in order
        block = parse_block(spec, batch_size)
        ds = ds.batch(batch_size * block).map(
            lambda s: parse_records(s, spec, weighted=reading.weighted),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        ds = ds.rebatch(batch_size, drop_remainder=training)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # no autotuning thread (see `distributed_iterator`): the parallel steps run one call
    # per core, and the prefetch buffer still grows as the consumer needs
    options.autotune.enabled = False
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def _pipeline_files(
    manifest: Manifest, data_dir: str | Path, split: str, num_pipelines: int, pipeline_id: int
) -> tuple[list[str], bool]:
    """The shard files this pipeline reads, and whether the pipelines split the files
    between them (FILE policy) rather than each reading all (DATA policy, warned)."""
    files = [str(Path(data_dir) / f) for f in manifest.files(split)]
    if not files:
        raise ShardError(
            f"{data_dir}: the manifest has no shards for split {split!r}; "
            f"expected one of {', '.join(manifest.splits)}."
        )
    if len(files) >= num_pipelines:
        return files[pipeline_id::num_pipelines], True
    log.warning(
        "%d shards for %d input pipelines: every pipeline reads every shard (DATA sharding); "
        "re-run 'tfscale prepare --num-shards %d' for file sharding.",
        len(files),
        num_pipelines,
        num_pipelines,
    )
    return files, False


def _records(files: list[str], training: bool, seed: int, parallel: bool) -> tf.data.Dataset:
    """The serialized records of `files`: for training, the files shuffled and read
    interleaved (`parallel`: by parallel calls, in the same order); for evaluation, in the
    manifest's order, so predictions line up with examples.

    A table's records are small (about 550 bytes for 32 columns): read by parallel calls,
    the hand-offs between threads cost more than the reading, 261,000 records/s against
    319,000 read in turn (2 cores, 8 shards)."""
    ds = tf.data.Dataset.from_tensor_slices(files)
    if not training:
        return tf.data.TFRecordDataset(ds, buffer_size=8 << 20)
    ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if not parallel:
        return ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8))
    return ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(len(files), 8),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,  # seeded runs repeat exactly
    )


def distributed_iterator(strategy, dataset_fn):
    """`iter(strategy.distribute_datasets_from_function(dataset_fn))`, whose deletion does
    not stall.

    The distributed iterator puts each replica's batches on its device through small
    per-device datasets (`tf.data`'s MultiDeviceIterator). They are built with default
    options, so each runs tf.data's autotuning thread, which sleeps for a period that
    doubles up to 60 s, and deleting the iterator waits for that sleep to end: 0-60 s at
    0% CPU, measured 14-38 s after a one-minute training. The input pipeline that feeds
    them stalls its deletion the same way, so `build_dataset` turns autotuning off, and
    here it is turned off for the per-device datasets (`tasks.core.internals`).
    """
    device_datasets_without_autotune()
    return iter(strategy.distribute_datasets_from_function(dataset_fn))


def class_counts(manifest: Manifest, data_dir: str | Path, classes: int) -> list[int]:
    """Each class's examples in the training split (a class or binary label, its ids or
    0/1 values), in one pass over it."""
    import numpy as np

    counts = np.zeros(classes, np.int64)
    for _, labels in build_dataset(manifest, data_dir, "train", 4096, training=False):
        ids = np.rint(labels.numpy().astype(np.float64).reshape(-1)).astype(np.int64)
        counts += np.bincount(ids, minlength=classes)[:classes]
    return counts.tolist()
