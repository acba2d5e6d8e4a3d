"""Helpers the test modules share: tiny params, free ports, health waits."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tasks.network import free_ports, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEFAULTS = str(ROOT / "tests" / "support" / "defaults.yaml")  # --params: the defaults only
TINY = {
    "train.model": "mlp",
    "train.epochs": 2,
    "train.precision": "float32",
    "train.jit_compile": False,  # nothing for `auto` to measure (test_autotune measures)
    "train.replicas": 2,
    "train.strategy": "auto",
    # the measuring rounds after training, at a few blocks' effort: the tests that check
    # the measurement itself set their own (the defaults: 11 rounds of up to 300 steps)
    "train.measure_rounds": 3,
    "train.measure_steps": 30,
}


def free_port() -> int:
    return free_ports(1)[0]


def tiny_params(tmp: Path, **extra) -> Path:
    """A params.yaml for tiny, fast runs with every output under `tmp`."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["data_dir"] = str(tmp / "tfrecords")
    params["train"].update(
        {k.split(".")[1]: v for k, v in TINY.items()}, runs_dir=str(tmp / "runs")
    )
    params["sweep"].update(
        replicas=[1, 2], dataset_sizes=[256], model="mlp", epochs=1, out_dir=str(tmp / "sweep")
    )
    for key, value in extra.items():
        section, name = key.split(".")
        params[section][name] = value
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def wait_until_healthy(url: str, timeout_s: float = 120) -> None:
    """Polls `<url>/health` until the server answers, for at most `timeout_s`."""
    problem = wait_healthy(f"{url}/health", timeout_s, interval_s=0.5)
    assert problem is None, f"{url}/health did not answer within {timeout_s:.0f} s: {problem}"


def slowed(dataset, seconds: float):
    """`dataset` of (images, labels) batches with `seconds` of extra work per batch: an
    input pipeline slowed on purpose, as on a host that reads or decodes slowly."""
    import time

    import tensorflow as tf

    def slow(images):
        time.sleep(seconds)
        return images

    def apply(images, labels):
        out = tf.py_function(slow, [images], images.dtype)
        out.set_shape(images.shape)
        return out, labels

    return dataset.map(apply)
