"""The machine's pace: how much slower than the reference machine this one runs the suite's
kind of work, so that timeouts detect hangs and never judge a machine's speed.

The workload is what the suite's time goes to: a fresh process that imports TensorFlow and
Keras (every CLI, worker and server test pays that) and then trains a small CNN on
digits-shaped, seeded data for a fixed number of steps on 2 threads, two such processes at
once (as the parallel phase's two workers run). `tests/suite.py`
measures it once per run, before its phases; the factor (never below 1: a faster machine
keeps the timeouts as they are) multiplies every per-test timeout, `faulthandler_timeout`,
and each wait and subprocess limit in the tests (`helpers.scaled`), through
`TFSCALE_TEST_PACE`.

    python tests/pace.py            # measures and prints the factor
    python tests/pace.py --record   # makes this machine the reference (pace.json)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

VARIABLE = "TFSCALE_TEST_PACE"
REFERENCE = Path(__file__).resolve().parent / "support" / "pace.json"
STEPS = 300

WORKLOAD = f"""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
import keras

tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).random((32 * 20, 8, 8, 1), dtype=np.float32)
y = np.random.default_rng(1).integers(0, 10, 32 * 20)
model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
model.fit(data, steps_per_epoch={STEPS} // 3, epochs=3, verbose=0)
"""


def measure(processes: int = 2) -> float:
    """Seconds the workload takes here, start to end, run by `processes` processes at once
    as the suite's parallel phase runs its two workers: cores shared with anything else
    (another job, a process pinned beside it) show as a longer time."""
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKLOAD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(processes)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"the pace workload failed:\n{out.decode()[-3000:]}")
    return time.monotonic() - started


def reference() -> dict:
    return json.loads(REFERENCE.read_text())


def factor(seconds: float) -> float:
    """How many times the reference machine's time `seconds` is (at least 1)."""
    return max(1.0, seconds / reference()["seconds"])


def current() -> float:
    """The factor this test run measured (`TFSCALE_TEST_PACE`), 1 where none was."""
    return float(os.environ.get(VARIABLE) or 1.0)


def describe(seconds: float) -> str:
    ref = reference()
    return (
        f"pace: the reference workload took {seconds:.1f} s here, {ref['seconds']:.1f} s on "
        f"the reference machine ({ref['machine']}): timeouts x{factor(seconds):.2f}"
    )


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return platform.processor()


if __name__ == "__main__":
    seconds = min(measure() for _ in range(3 if "--record" in sys.argv else 1))
    if "--record" in sys.argv:
        REFERENCE.write_text(json.dumps({"seconds": round(seconds, 2), "machine": _cpu()}) + "\n")
    print(describe(seconds))
