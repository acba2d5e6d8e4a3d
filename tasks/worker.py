"""Entry point of one training worker process: `python -m tasks.worker SPEC.json`.

`TF_CONFIG` says which worker this is; the spec gives config, data and strategy.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    if "TFSCALE_PIN_CORE" in os.environ:
        os.sched_setaffinity(0, {int(os.environ["TFSCALE_PIN_CORE"])})
    import tensorflow as tf

    if spec.get("threads"):
        tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(spec["threads"])
    from tasks.config import config_from_dict
    from tasks.manifest import load_manifest
    from tasks.strategy import StrategyChoice
    from tasks.training import train_model

    config = config_from_dict(spec["config"])
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    print(f"worker {index}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
    run_dir = Path(spec["run_dir"])
    result = train_model(
        config.train,
        load_manifest(spec["data_dir"]),
        spec["data_dir"],
        StrategyChoice(**spec["choice"]),
        run_dir,
        is_chief=index == 0,
        preemptible=True,
        collective_timeout_s=config.cluster.collective_timeout_s,
        probe_steps=spec.get("probe_steps", 0),
    )
    (run_dir / f"worker-{index}-result.json").write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    from tasks.process import exit_now

    exit_now(main(sys.argv[1]))
