"""Run by test_training in a process of its own (an in-process cluster takes over the
process's TensorFlow context): the embedding model on parameter-server clusters with two
ps tasks and with one. Prints, as JSON, where each part of the table lives and the losses.

    python tests/support/partition_check.py DATA_DIR
"""

from __future__ import annotations

import json
import sys
import tempfile

from tfscale.tasks.core.process import set_up_process
from tfscale.tasks.data.manifest import load_manifest
from tfscale.tasks.distribute.strategy import StrategyChoice
from tfscale.tasks.settings.config import load_config


def main(data_dir: str) -> dict:
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.ps_cluster import in_process_cluster
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.train.training import set_up_training, train_model

    manifest = load_manifest(data_dir)
    choice = StrategyChoice("parameter_server", 2, 2, "float32", "partition check")
    found = {}
    for ps in (2, 1):
        with in_process_cluster(2, ps=ps) as resolver, tempfile.TemporaryDirectory() as tmp:
            overrides = {
                "train.model": "embedding",
                "train.precision": "float32",
                "train.epochs": 2,
                "train.runs_dir": tmp,
            }
            config = load_config(None, overrides)
            setup = set_up_training(config.train, manifest, choice, resolver)
            parts = setup.model.get_layer("table").parts
            run = Run(config, manifest, data_dir, choice, detect_hardware())
            result = train_model(run, resolver=resolver).result
        found[ps] = {
            "devices": sorted(part.value.device for part in parts),
            "rows": [int(part.shape[0]) for part in parts],
            "losses": [h["loss"] for h in result.history],
        }
    return found


if __name__ == "__main__":
    set_up_process()
    print(json.dumps(main(sys.argv[1])))
