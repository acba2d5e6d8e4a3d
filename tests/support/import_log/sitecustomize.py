"""Put on PYTHONPATH by the DVC test: every Python process it starts records, at exit, the
project modules it imported (one JSON line per process in $TFSCALE_IMPORT_LOG)."""

import atexit
import json
import os
import sys


def _record() -> None:
    ours = [name.partition(".")[2] for name in list(sys.modules) if name.startswith("tfscale.")]
    package = ["tfscale.__init__"] if "tfscale" in sys.modules else []  # tfscale/__init__.py
    modules = sorted(ours + package)  # as their paths in the repository read: tasks.x.y
    with open(os.environ["TFSCALE_IMPORT_LOG"], "a") as log:
        log.write(json.dumps({"argv": sys.argv, "modules": modules}) + "\n")


if os.environ.get("TFSCALE_IMPORT_LOG"):
    atexit.register(_record)
