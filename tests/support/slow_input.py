"""`tfscale` whose input pipeline is slowed in this process only: 20 ms more per batch, as
on a worker whose host reads or decodes slowly. `python tests/support/slow_input.py ARGS...`."""

from __future__ import annotations

import sys

from tests.helpers import slowed
from tfscale.flows.cli import main
from tfscale.tasks.train import training

real_build_dataset = training.build_dataset


def slowed_build_dataset(*args, **kwargs):
    return slowed(real_build_dataset(*args, **kwargs), 0.02)


training.build_dataset = slowed_build_dataset

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
