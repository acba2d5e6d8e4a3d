"""`tfscale` whose input pipeline is slowed in this process only: 20 ms more per batch, as
on a worker whose host reads or decodes slowly. `python tests/support/slow_input.py ARGS...`."""

from __future__ import annotations

import sys

import tasks.train.training
from flows.cli import main
from tests.helpers import slowed

real_build_dataset = tasks.train.training.build_dataset


def slowed_build_dataset(*args, **kwargs):
    return slowed(real_build_dataset(*args, **kwargs), 0.02)


tasks.train.training.build_dataset = slowed_build_dataset

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
