"""A plain TensorFlow custom training loop, the way TensorFlow's multi-worker tutorial
writes it: one step per `tf.function` call, the loss reduced across workers every step.
`benchmarks/scaling.py` runs it as worker processes beside tfscale's own loop, on a model of
the same shape, the same per-replica batch and the same number of examples.

    TF_CONFIG=... python benchmarks/plain_loop.py --batch 128 --examples 6144 --epochs 3 OUT.json

Only the worker with index 0 writes OUT.json: {"examples_per_s": ...} after the first epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, default=128, help="examples per replica")
    parser.add_argument("--examples", type=int, default=6144)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if "TFSCALE_PIN_CORE" in os.environ:
        os.sched_setaffinity(0, {int(os.environ["TFSCALE_PIN_CORE"])})
    import keras
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    global_batch = args.batch * workers
    rng = np.random.default_rng(0)
    images = rng.random((args.examples, 32, 32, 3), dtype=np.float32)
    labels = rng.integers(0, 10, args.examples).astype(np.int32)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        data = tf.data.Dataset.from_tensor_slices((images, labels))
        data = data.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return data.shuffle(4096, seed=0).repeat().batch(args.batch).prefetch(2)

    with strategy.scope():
        inputs = keras.Input((32, 32, 3))
        x = inputs
        for filters in (32, 64, 64):  # tfscale's `cnn`, written out
            x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
            x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Dense(128, activation="relu")(keras.layers.Flatten()(x))
        model = keras.Model(inputs, keras.layers.Dense(10)(x))
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf.function
    def train_step(iterator):
        images, labels = next(iterator)
        losses = strategy.run(replica_step, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    steps = args.examples // global_batch
    seconds = []
    for _ in range(args.epochs):
        started = time.perf_counter()
        for _ in range(steps):
            loss = train_step(iterator)
        float(loss)
        seconds.append(time.perf_counter() - started)
    timed = seconds[1:] or seconds
    rate = steps * global_batch * len(timed) / sum(timed)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if task == 0:
        with open(args.out, "w") as out:
            json.dump({"examples_per_s": rate}, out)


if __name__ == "__main__":
    main()
