"""Entry point of one training worker process: `python -m tfscale.flows.worker SPEC.json`.

`TF_CONFIG` says which worker this is; the spec gives config, data and strategy.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tfscale.tasks.core.process import collector_paused, set_up_worker


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    core = os.environ.get("TFSCALE_PIN_CORE")
    # a process of its own: TensorFlow's import (in the set-up) and its modules' with the
    # collector paused, what they made frozen after
    with collector_paused():
        set_up_worker(int(core) if core is not None else None, spec.get("threads", 0))
        # after the worker's set-up: its threads and devices are fixed when TensorFlow starts
        from tfscale.tasks.distribute.run import Role, Run
        from tfscale.tasks.execute.trainings import train_and_probe

    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    print(f"worker {index}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
    run = Run.from_spec(spec["run"], Role(chief=index == 0, preemptible=True))
    result = train_and_probe(run, spec.get("probe_steps", 0))
    (run.run_dir / f"worker-{index}-result.json").write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    from tfscale.tasks.core.process import exit_now

    exit_now(main(sys.argv[1]))
