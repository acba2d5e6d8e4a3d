"""The machine's pace: how much slower than the reference machine this one runs the suite's
kind of work, so that timeouts detect hangs and never judge a machine's speed.

The workload is what the suite's time goes to: a fresh process that imports TensorFlow and
Keras (every CLI, worker and server test pays that) and then trains a small CNN on
digits-shaped, seeded data for a fixed number of steps on 2 threads, two such processes at
once (as the parallel phase's two workers run). `tests/suite.py`
measures it once per run, before its phases; the factor (never below 1: a faster machine
keeps the timeouts as they are; never above `CLAMP`, 3: a machine that slow, or loaded while
it was measured, would wait 15 minutes a test and outlast CI's own limit before faulthandler
printed a stack, so it is said loudly and the timeouts stay at 3x) multiplies every per-test
timeout, `faulthandler_timeout`, and each wait and subprocess limit in the tests
(`helpers.scaled`), through `TFSCALE_TEST_PACE`, which refuses a factor below 1 (0 would make
every wait zero).

The reference is measured as a run measures it: one sample a run, the median of
`RECORD_RUNS` runs, recorded with the TensorFlow and Keras versions and the date.

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
WORKERS_VARIABLE = "TFSCALE_TEST_WORKERS"
REFERENCE = Path(__file__).resolve().parent / "support" / "pace.json"
STEPS = 300
CLAMP = 3.0  # the most the timeouts are scaled by
RECORD_RUNS = 5  # runs whose samples' median is the reference

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


def workers(environ=os.environ, default: int = 2) -> int:
    """How many pytest-xdist workers the suite's parallel phase and the fast tier take:
    `TFSCALE_TEST_WORKERS`, else (unset or empty) `default`: the fast tier's 2, as many as
    the reference machine's cores; the suite's parallel phase passes its own
    (`suite.PARALLEL_WORKERS`)."""
    return int(environ.get(WORKERS_VARIABLE) or default)


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
    """How many times the reference machine's time `seconds` is, from 1 to `CLAMP`."""
    return min(CLAMP, max(1.0, seconds / reference()["seconds"]))


def current() -> float:
    """The factor this test run measured (`TFSCALE_TEST_PACE`), 1 where none was, at most
    `CLAMP`.

    Raises:
        ValueError: a factor that is not a number, or is below 1.
    """
    text = os.environ.get(VARIABLE)
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 1.0:  # NaN too
        raise ValueError(
            f"{VARIABLE}={text} refused: the pace multiplies every timeout and wait of the "
            "tests, and a factor below 1 would make them shorter than the reference "
            f"machine's (0: no wait at all); set it to 1 or more, or unset it to measure"
        )
    return min(value, CLAMP)


def clamped_line(value: float) -> str:
    """The loud line for a pace above `CLAMP` ('' at or below it)."""
    if value <= CLAMP:
        return ""
    return (
        f"!! PACE x{value:.2f} IS ABOVE x{CLAMP:.0f}: the timeouts stay at x{CLAMP:.0f}. This "
        "machine is that much slower than the reference, or was loaded while it was "
        "measured: expect timeouts, and run the suite on a machine nothing else uses"
    )


def describe(seconds: float) -> str:
    ref = reference()
    raw = seconds / ref["seconds"]
    line = (
        f"pace: the reference workload took {seconds:.1f} s here, {ref['seconds']:.1f} s on "
        f"the reference machine ({ref['machine']}, TensorFlow {ref.get('tensorflow', '?')}, "
        f"{ref.get('date', '?')}): timeouts x{factor(seconds):.2f}"
    )
    loud = clamped_line(raw)
    return f"{line}\n{loud}" if loud else line


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return platform.processor()


def record() -> float:
    """This machine as the reference: the median of `RECORD_RUNS` runs' single samples (as a
    run measures it), with what it ran on and when."""
    import datetime
    import importlib.metadata
    import statistics

    samples = [measure() for _ in range(RECORD_RUNS)]
    seconds = statistics.median(samples)
    entry = {
        "seconds": round(seconds, 2),
        "machine": _cpu(),
        "tensorflow": importlib.metadata.version("tensorflow"),
        "keras": importlib.metadata.version("keras"),
        "date": datetime.date.today().isoformat(),
        "measured_as": f"median of {RECORD_RUNS} runs, one sample each (a run's measurement)",
        "samples": [round(s, 2) for s in samples],
    }
    REFERENCE.write_text(json.dumps(entry, indent=1) + "\n")
    return seconds


if __name__ == "__main__":
    print(describe(record() if "--record" in sys.argv else measure()))
