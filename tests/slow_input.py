"""`tfscale` whose input pipeline is slowed in this process only: 20 ms more per batch, as
on a worker whose host reads or decodes slowly. `python tests/slow_input.py ARGS...`."""

from __future__ import annotations

import sys
import time

import tensorflow as tf

import tasks.training
from flows.cli import main

real_build_dataset = tasks.training.build_dataset


def slowed_build_dataset(*args, **kwargs) -> tf.data.Dataset:
    def slow(images):
        time.sleep(0.02)
        return images

    def apply(images, labels):
        out = tf.py_function(slow, [images], images.dtype)
        out.set_shape(images.shape)
        return out, labels

    return real_build_dataset(*args, **kwargs).map(apply)


tasks.training.build_dataset = slowed_build_dataset

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
