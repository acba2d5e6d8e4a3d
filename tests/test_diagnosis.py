"""Bottleneck diagnosis on constructed cases, measured for real on small data."""

from __future__ import annotations

import pytest
import tensorflow as tf

from tasks.config import load_config
from tasks.diagnosis import classify, classify_in_place, diagnose_run
from tasks.inplace import InPlaceProbes
from tasks.preparation import prepare_dataset
from tasks.strategy import StrategyChoice
from tests.helpers import slowed

ONE_CPU = StrategyChoice("one_device", 1, 1, "float32", "test")


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ((500, 5000, 480, 0.05, 1, None), "input-bound"),
        ((90000, 5000, 4900, 0.002, 1, None), "overhead-bound"),
        ((90000, 5200, 5000, 0.05, 2, 5000), "communication-bound"),
        ((90000, 9000, 8800, 0.05, 2, 5000), "compute-bound"),
    ],
)
def test_classify_from_numbers(rates, expected):
    assert classify(*rates)[0] == expected


def probes(**figures) -> InPlaceProbes:
    """Two workers, 32 examples each per step, 10 ms steps; `figures` override."""
    values = dict(
        where="2 worker processes",
        comm="all-reduce",
        replicas=2,
        workers=2,
        step_examples=64,
        replica_examples=32,
        worker_examples=32,
        gradient_bytes=204_800,
        step_s=0.010,
        local_step_s=0.008,
        comm_s=0.001,
        end_to_end_s=0.0105,
        input_examples_per_s=[40_000.0, 40_000.0],
    )
    return InPlaceProbes(**dict(values, **figures))


@pytest.mark.parametrize(
    ("figures", "expected", "named"),
    [
        ({}, "compute-bound", "local step takes 8.0 ms"),
        # worker 1's input gives 1,000 ex/s; its share of a 10 ms step needs 3,200
        (
            {"end_to_end_s": 0.032, "input_examples_per_s": [40_000.0, 1_000.0]},
            "input-bound",
            "worker 1's input pipeline alone gives 1,000 ex/s",
        ),
        ({"local_step_s": 0.002, "comm_s": 0.007}, "communication-bound", "200 KiB alone 7.0"),
        ({"local_step_s": 0.004, "comm_s": 0.001}, "overhead-bound", "the other 5.0 ms (50%)"),
        # a slow end-to-end with every worker's input fast enough is not input-bound
        ({"end_to_end_s": 0.032}, "compute-bound", "local step"),
    ],
)
def test_classify_in_place_from_measured_steps(figures, expected, named):
    bottleneck, evidence = classify_in_place(probes(**figures))
    assert bottleneck == expected
    assert named in evidence


def test_in_place_diagnosis_prints_measurements_as_measured(digits):
    from tasks.diagnosis import diagnose_in_place, format_diagnosis

    cfg, manifest, _ = train_config(digits, model="mlp")
    choice = StrategyChoice("multi_worker", 2, 2, "float32", "test")
    d = diagnose_in_place(probes(local_step_s=0.002, comm_s=0.007), cfg, manifest, choice, [])
    assert d.compute_examples_per_s == pytest.approx(6400)  # 64 examples per 10 ms step
    assert d.compute_1_replica_examples_per_s == pytest.approx(16000)  # 32 per 2 ms
    assert d.comm_share == pytest.approx(0.7) and d.sync_share == pytest.approx(0.1)
    text = format_diagnosis(d)
    assert "measured:   in 2 worker processes" in text and "ideal" not in text
    assert "input-only per worker 40,000, 40,000 ex/s" in text


def train_config(digits, **train):
    overrides, manifest, data_dir = digits
    values = dict(overrides, **{f"train.{k}": v for k, v in train.items()})
    return load_config(None, values).train, manifest, data_dir


def slow_map(ds: tf.data.Dataset) -> tf.data.Dataset:
    """An input pipeline slowed on purpose: 30 ms of work per batch."""
    return slowed(ds, 0.03)


def test_slowed_input_pipeline_is_input_bound(digits):
    cfg, manifest, data_dir = train_config(
        digits, model="cnn", batch_size_per_replica=64, cache=False
    )
    diagnosis = diagnose_run(
        cfg, manifest, data_dir, ONE_CPU, [], steps=10, input_transform=slow_map
    )
    assert diagnosis.bottleneck == "input-bound", diagnosis
    assert diagnosis.input_examples_per_s < diagnosis.compute_examples_per_s
    assert any("cache" in a or "prepare" in a for a in diagnosis.advice)


def test_tiny_model_with_tiny_batch_is_overhead_bound(digits):
    cfg, manifest, data_dir = train_config(digits, model="mlp", batch_size_per_replica=2)
    diagnosis = diagnose_run(cfg, manifest, data_dir, ONE_CPU, [], steps=30)
    assert diagnosis.bottleneck == "overhead-bound", diagnosis
    assert "per-replica batch" in diagnosis.advice[0]


def test_large_model_on_in_memory_data_is_compute_bound(tmp_path):
    config = load_config(
        None,
        {
            "prepare.dataset": "synthetic",
            "prepare.data_dir": str(tmp_path),
            "prepare.synthetic.train_examples": 512,
            "prepare.synthetic.test_examples": 64,
            "train.model": "resnet",
            "train.batch_size_per_replica": 64,
            "train.cache": True,
        },
    )
    result = prepare_dataset(config, progress=False)
    diagnosis = diagnose_run(
        config.train, result.manifest, result.data_dir, ONE_CPU, ["avx512f"], steps=5
    )
    assert diagnosis.bottleneck == "compute-bound", diagnosis
    assert diagnosis.step_seconds > 0.004


def test_weak_scaling_diagnosis_times_one_device_at_both_batches(digits, monkeypatch):
    """Under weak scaling the global batch grows with the replicas; the diagnosis times one
    device at the per-replica batch (16) and at that global batch (32), reports each as
    what it is, and hands the forecast those very timings."""
    import dataclasses

    from tasks import diagnosis as module
    from tasks.diagnosis import format_diagnosis

    one_device = {}  # per-replica batch -> the compute-only rate measured for it

    def recorded(cfg, manifest, data_dir, choice, *args, **kwargs):
        rates = probe_rates(cfg, manifest, data_dir, choice, *args, **kwargs)
        if choice.replicas == 1:
            one_device[cfg.batch_size_per_replica] = rates["compute"]
        return rates

    probe_rates = module.probe_rates
    monkeypatch.setattr(module, "probe_rates", recorded)
    cfg, manifest, data_dir = train_config(digits, model="mlp", batch_size_per_replica=16)
    mirrored = StrategyChoice("mirrored", 2, 1, "float32", "test")
    diagnosis = diagnose_run(cfg, manifest, data_dir, mirrored, [], steps=20)
    assert diagnosis.compute_1_replica_examples_per_s == one_device[16]
    assert diagnosis.compute_1_device_global_batch_examples_per_s == one_device[32]
    assert "per-replica batch: that part of the speedup" in format_diagnosis(diagnosis)
    # what the forecast fits: one device at 16 and 32 (the rates the diagnosis reports, as
    # seconds per step), the replicas' all-reduce at 3 sizes
    probes = diagnosis.cost_probes
    assert probes["local_step_s_by_batch"] == [
        [16, pytest.approx(16 / diagnosis.compute_1_replica_examples_per_s)],
        [32, pytest.approx(32 / diagnosis.compute_1_device_global_batch_examples_per_s)],
    ]
    assert [int(n) for n, _ in probes["comm_s_by_bytes"]] == [
        probes["gradient_bytes"] // 4 // 4 * 4,
        probes["gradient_bytes"],
        probes["gradient_bytes"] * 4,
    ]
    assert probes["replica_examples"] == 16 and probes["step_examples"] == 32
    strong = dataclasses.replace(cfg, scaling="strong")
    assert diagnose_run(strong, manifest, data_dir, mirrored, [], steps=6).batch_effect is None


def test_a_weak_scaling_speedup_splits_into_batch_and_devices():
    """1,500 against 1,000 ex/s on 2 replicas is 1.5x at efficiency 0.75; one device doing
    1,200 ex/s at the global batch against 1,000 at the per-replica batch makes 1.2x of it
    the batch's, and so 1.25x the devices'."""
    import dataclasses

    from tasks.diagnosis import Diagnosis
    from tasks.summary import compare_runs, format_summary
    from tasks.training import TrainResult

    diagnosis = Diagnosis(
        "compute-bound", 9e9, 1600.0, 1500.0, 1000.0, 2, 0.02, "evidence",
        compute_1_device_global_batch_examples_per_s=1200.0,
    )  # fmt: skip
    base = TrainResult("b", "b", "one_device", "", 1, 1, "float32", 16, 16, 1, 0.001, 10)
    dist = dataclasses.replace(base, strategy="mirrored", replicas=2, global_batch=32)
    base, dist = (dataclasses.replace(r, examples_per_s=v) for r, v in ((base, 1000), (dist, 1500)))
    evaluation = type("Eval", (), {"test_accuracy": 0.9, "test_loss": 0.3})()
    summary = compare_runs(base, dist, evaluation, diagnosis, "weak", 0.9)
    assert summary.speedup == pytest.approx(1.5)
    assert summary.scaling_efficiency == pytest.approx(0.75)
    assert summary.speedup_from_batch == pytest.approx(1.2)
    assert summary.speedup_from_devices == pytest.approx(1.25)
    text = format_summary(summary, "ui")
    assert "1.50x = 1.20x from the larger global batch (one device) x 1.25x from more" in text
    strong = compare_runs(base, dist, evaluation, None, "strong", 0.9)
    assert strong.speedup_from_batch is None and "from more devices" not in format_summary(
        strong, "ui"
    )
