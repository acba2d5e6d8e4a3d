"""Bottleneck diagnosis on constructed cases, measured for real on small data."""

from __future__ import annotations

import pytest
import tensorflow as tf
from helpers import epoch_history, run_of, slowed, train_result

from tfscale.tasks.data.preparation import prepare_dataset
from tfscale.tasks.distribute.strategy import StrategyChoice
from tfscale.tasks.measure.diagnosis import (
    classify,
    classify_in_place,
    diagnose_run,
    format_diagnosis,
)
from tfscale.tasks.measure.in_place import InPlaceProbes
from tfscale.tasks.measure.probes import RoundRates
from tfscale.tasks.settings.config import load_config

ONE_CPU = StrategyChoice("one_device", 1, 1, "float32", "test")


def rounds(input_, compute, e2e, step_s, replicas, compute_1=None, jitter=0.0) -> RoundRates:
    """Three rounds of a run in this process whose medians are the figures given; each
    figure moves by `jitter` (a share) from round to round."""

    def three(value: float) -> list[float]:
        return [value * (1 - jitter), value, value * (1 + jitter)]

    rates = {"input": three(input_), "compute": three(compute), "end_to_end": three(e2e)}
    if replicas > 1:
        for name in ("one_device_replica_batch", "one_device_global_batch"):
            rates[name] = rates[name + "_compute"] = three(compute_1)
    return RoundRates(replicas, "weak", round(step_s * compute), rates)


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        ((500, 5000, 480, 0.05, 1), "input-bound"),
        ((90000, 5000, 4900, 0.002, 1), "overhead-bound"),
        ((90000, 5200, 5000, 0.05, 2, 5000), "communication-bound"),
        ((90000, 9000, 8800, 0.05, 2, 5000), "compute-bound"),
    ],
)
def test_classify_from_rounds_that_agree(figures, expected):
    assert classify(rounds(*figures))[0] == expected


def test_rounds_that_fall_on_both_sides_of_a_threshold_name_no_class():
    """Compute-only efficiency of 0.52-0.68 over the rounds spans the 0.6 that makes a run
    communication-bound: the diagnosis says it cannot tell, and why."""
    unsure = rounds(90000, 6000, 5900, 0.05, 2, 5000, jitter=0.0)
    unsure.rates["compute"][:] = [5200.0, 6000.0, 6800.0]
    bottleneck, evidence = classify(unsure)
    assert bottleneck == "undetermined"
    assert "efficiency 0.60 (0.52-0.68) spans 0.6" in evidence
    assert classify(rounds(90000, 5200, 5000, 0.05, 2, 5000, jitter=0.02))[0] == (
        "communication-bound"
    )


def test_the_words_follow_the_numbers():
    """Compute-only throughput that is lower on 2 replicas than on 1 falls; higher grows."""
    falls = classify(rounds(90000, 4000, 3900, 0.05, 2, 5000))[1]
    assert "falls from 5,000 ex/s (5,000-5,000) on 1 replica to 4,000" in falls
    grows = classify(rounds(90000, 5200, 5000, 0.05, 2, 5000))[1]
    assert "grows from 5,000 ex/s" in grows


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
    from tfscale.tasks.measure.diagnosis import diagnose_in_place

    choice = StrategyChoice("multi_worker", 2, 2, "float32", "test")
    run = train_run(digits, choice, model="mlp")
    d = diagnose_in_place(
        probes(local_step_s=0.002, comm_s=0.007), run.train, run.manifest, choice, []
    )
    assert d.compute_examples_per_s == pytest.approx(6400)  # 64 examples per 10 ms step
    assert d.compute_1_replica_examples_per_s == pytest.approx(16000)  # 32 per 2 ms
    assert d.comm_share == pytest.approx(0.7) and d.sync_share == pytest.approx(0.1)
    text = format_diagnosis(d)
    assert "measured:   in 2 worker processes" in text and "ideal" not in text
    assert "input-only per worker 40,000, 40,000 ex/s" in text


def train_run(digits, choice, **train):
    """The digits run of `choice` with the `train` settings given."""
    overrides, manifest, data_dir = digits
    values = dict(overrides, **{f"train.{k}": v for k, v in train.items()})
    return run_of(load_config(None, values), manifest, data_dir, choice)


def slow_map(ds: tf.data.Dataset) -> tf.data.Dataset:
    """An input pipeline slowed on purpose: 30 ms of work per batch."""
    return slowed(ds, 0.03)


@pytest.mark.integration  # trains, times rounds or starts a process
@pytest.mark.serial  # classifies measured speeds: alone on the machine
def test_slowed_input_pipeline_is_input_bound(digits):
    run = train_run(
        digits, ONE_CPU, model="cnn", batch_size_per_replica=64, cache=False, measure_rounds=5
    )
    diagnosis = diagnose_run(run, steps=10, input_transform=slow_map)
    assert diagnosis.bottleneck == "input-bound", diagnosis
    assert diagnosis.input_examples_per_s < diagnosis.compute_examples_per_s
    assert any("cache" in a or "prepare" in a for a in diagnosis.advice)


@pytest.mark.integration  # trains, times rounds or starts a process
@pytest.mark.serial  # classifies measured speeds: alone on the machine
def test_tiny_model_with_tiny_batch_is_overhead_bound(digits):
    run = train_run(digits, ONE_CPU, model="mlp", batch_size_per_replica=2)
    diagnosis = diagnose_run(run, steps=30)
    assert diagnosis.bottleneck == "overhead-bound", diagnosis
    assert "per-replica batch" in diagnosis.advice[0]


@pytest.mark.integration  # trains, times rounds or starts a process
@pytest.mark.serial  # classifies measured speeds: alone on the machine
def test_large_model_on_in_memory_data_is_compute_bound(tmp_path):
    """A small ResNet at batch 32 on data cached in memory: in every measured round the input
    keeps up and a step takes far longer than dispatch (over 4 ms): compute-bound."""
    config = load_config(
        None,
        {
            "prepare.dataset": "synthetic",
            "prepare.data_dir": str(tmp_path),
            "prepare.synthetic.train_examples": 512,
            "prepare.synthetic.test_examples": 64,
            "train.model": "resnet",
            "train.batch_size_per_replica": 32,
            "train.cache": True,
            "train.measure_rounds": 3,  # a class is named when every round agrees
        },
    )
    result = prepare_dataset(config, progress=False)
    run = run_of(config, result.manifest, result.data_dir, ONE_CPU, ["avx512f"])
    diagnosis = diagnose_run(run, steps=5)
    assert diagnosis.bottleneck == "compute-bound", diagnosis
    assert diagnosis.step_seconds > 0.004


@pytest.mark.integration  # trains, times rounds or starts a process
def test_weak_scaling_diagnosis_times_every_configuration_in_the_same_rounds(digits, monkeypatch):
    """Under weak scaling the global batch grows with the replicas; the diagnosis times the
    run, and one device at the per-replica batch (16) and at that global batch (32), in the
    same alternating rounds; its figures are the rounds' medians, and the forecast gets
    those very timings."""
    import dataclasses
    import statistics

    from tfscale.tasks.measure import probes as module

    built = []  # (replicas, per-replica batch) of every configuration set up, in order

    def recorded(cfg, manifest, choice, *args, **kwargs):
        built.append((choice.replicas, cfg.batch_size_per_replica))
        return set_up(cfg, manifest, choice, *args, **kwargs)

    set_up = module.set_up_training
    monkeypatch.setattr(module, "set_up_training", recorded)
    mirrored = StrategyChoice("mirrored", 2, 1, "float32", "test")
    weak = train_run(digits, mirrored, model="mlp", batch_size_per_replica=16, measure_rounds=4)
    diagnosis = diagnose_run(weak, steps=9)
    assert built == [(2, 16), (1, 16), (1, 32)]
    r = diagnosis.round_rates
    assert {len(values) for values in r.rates.values()} == {4}  # train.measure_rounds
    # 4 rounds, fewer than an interval needs: the cap ended them, and says so
    assert (r.settled["rounds"], r.settled["ended_by"], r.settled["half_width"]) == (4, "cap", None)
    assert "too few for the speedup's interval" in format_diagnosis(diagnosis)
    median = {name: statistics.median(values) for name, values in r.rates.items()}
    assert diagnosis.compute_1_replica_examples_per_s == median["one_device_replica_batch_compute"]
    assert (
        diagnosis.compute_1_device_global_batch_examples_per_s
        == (median["one_device_global_batch_compute"])
    )
    assert diagnosis.end_to_end_examples_per_s == median["end_to_end"]
    # round by round, the speedup is exactly the batch's part times the devices' part
    for base, whole, run in zip(
        r.rates["one_device_replica_batch"],
        r.rates["one_device_global_batch"],
        r.rates["end_to_end"],
        strict=True,
    ):
        assert run / base == pytest.approx((whole / base) * (run / whole))
    assert r.speedup.low <= r.speedup.median <= r.speedup.high
    text = format_diagnosis(diagnosis)
    assert "4 alternating rounds" in text
    assert "per-replica batch: that part of the speedup" in text
    # what the forecast fits: one device at 16 and 32, the replicas' all-reduce at 3 sizes
    probes = diagnosis.cost_probes
    assert probes["local_step_s_by_batch"] == [
        [16, pytest.approx(16 / median["one_device_replica_batch_compute"])],
        [32, pytest.approx(32 / median["one_device_global_batch_compute"])],
    ]
    assert [int(n) for n, _ in probes["comm_s_by_bytes"]] == [
        probes["gradient_bytes"] // 4 // 4 * 4,
        probes["gradient_bytes"],
        probes["gradient_bytes"] * 4,
    ]
    assert probes["replica_examples"] == 16 and probes["step_examples"] == 32
    strong = weak.with_train(dataclasses.replace(weak.train, scaling="strong"))
    strong_rounds = diagnose_run(strong, steps=6).round_rates
    assert strong_rounds.baseline == "one_device_global_batch"
    assert strong_rounds.from_batch is None and strong_rounds.speedup is not None


def test_a_weak_scaling_speedup_splits_into_batch_and_devices():
    """1,500 against 1,000 ex/s on 2 replicas is 1.5x at efficiency 0.75; one device doing
    1,200 ex/s at the global batch against 1,000 at the per-replica batch makes 1.2x of it
    the batch's, and so 1.25x the devices'."""
    import dataclasses

    from tfscale.tasks.measure.diagnosis import Diagnosis
    from tfscale.tasks.report.console_summary import format_summary
    from tfscale.tasks.report.summary import compare_runs

    diagnosis = Diagnosis(
        "compute-bound", 9e9, 1600.0, 1500.0, 1000.0, 2, 0.02, "evidence",
        compute_1_device_global_batch_examples_per_s=1200.0,
    )  # fmt: skip
    base = train_result()
    dist = dataclasses.replace(base, strategy="mirrored", replicas=2, global_batch=32)
    base, dist = (dataclasses.replace(r, examples_per_s=v) for r, v in ((base, 1000), (dist, 1500)))
    evaluation = type("Eval", (), {"test_accuracy": 0.9, "test_loss": 0.3})()
    summary = compare_runs((base, dist), evaluation, diagnosis, "weak", 0.9)
    assert summary.speedup == pytest.approx(1.5)
    assert summary.scaling_efficiency == pytest.approx(0.75)
    assert summary.speedup_from_batch == pytest.approx(1.2)
    assert summary.speedup_from_devices == pytest.approx(1.25)
    text = format_summary(summary, "ui")
    assert "2 replicas: examples/s 1.50x one device's" in text.splitlines()[0]
    assert (
        "\nsplit             1.20x from the larger global batch (one device) x 1.25x from more "
        "devices\n" in text
    )
    strong = compare_runs((base, dist), evaluation, None, "strong", 0.9)
    assert strong.speedup_from_batch is None and "from more devices" not in format_summary(
        strong, "ui"
    )


def test_a_run_across_processes_gives_its_speedup_epoch_by_epoch_with_the_range():
    """No alternating rounds (workers in processes of their own): epochs 2-4 ran at 1,000,
    800 and 1,000 ex/s on one device and 1,500, 1,280 and 1,500 on 2 replicas, so 1.50x
    (1.50-1.60); the first epoch (tracing) does not enter, nor does an epoch one side lacks."""
    import dataclasses

    from tfscale.tasks.report.console_summary import format_summary
    from tfscale.tasks.report.summary import compare_runs

    base = train_result()
    base = dataclasses.replace(base, examples_per_s=930, history=epoch_history(90, 1000, 800, 1000))
    dist = dataclasses.replace(
        base,
        strategy="multi_worker",
        replicas=2,
        global_batch=32,
        examples_per_s=1420,
        history=epoch_history(9, 1500, 1280, 1500, 1700),
    )
    evaluation = type("Eval", (), {"test_accuracy": 0.9, "test_loss": 0.3})()
    summary = compare_runs((base, dist), evaluation, None, "weak", 0.9)
    assert (summary.speedup, summary.speedup_low, summary.speedup_high) == pytest.approx(
        (1.5, 1.5, 1.6)
    )
    assert (summary.baseline_examples_per_s, summary.distributed_examples_per_s) == (930, 1420)
    assert summary.measured_over.startswith("3 epochs of each training")
    assert summary.recommendation.endswith("faster in every epoch")
    assert "1.50x (1.50-1.60)" in format_summary(summary, "ui")
    # one epoch after the first is no range: the trainings' own ratio, as before
    short = compare_runs(
        (
            dataclasses.replace(base, history=base.history[:2]),
            dataclasses.replace(dist, history=dist.history[:2]),
        ),
        evaluation,
        None,
        "weak",
        0.9,
    )
    assert short.speedup == pytest.approx(1420 / 930) and short.speedup_low is None


def test_a_summary_measured_in_rounds_gives_every_figure_from_those_rounds():
    """Three rounds: one device makes 1,000, 800 and 1,000 ex/s at the per-replica batch
    (a slow spell in round 2), 1,200, 960 and 1,200 at the global batch, and the run
    1,500, 1,200 and 1,600. The speedup is 1.50x round by round, 1.20x of it the batch's
    and 1.25x the devices'; its interval, of 3 rounds too few for the median's, a 95%
    t-interval on the logs of their ratios (1.5, 1.5, 1.6: mean 0.42698, sd 0.037264, t 4.303
    at 2 degrees of freedom: e^(0.42698 +- 0.092576) = 1.397-1.681), never their range
    (1.50-1.60); the throughputs are the medians, and the two trainings' own figures do not
    enter."""
    import dataclasses

    from tfscale.tasks.measure.diagnosis import Diagnosis
    from tfscale.tasks.report.console_summary import format_summary
    from tfscale.tasks.report.summary import compare_runs

    rates = {
        "one_device_replica_batch": [1000.0, 800.0, 1000.0],
        "one_device_global_batch": [1200.0, 960.0, 1200.0],
        "end_to_end": [1500.0, 1200.0, 1600.0],
    }
    rates.update({f"{k}_compute": v for k, v in rates.items()})
    rates.update(compute=rates["end_to_end"], input=[9e9] * 3)
    r = RoundRates(2, "weak", 32, rates)
    diagnosis = Diagnosis(
        "compute-bound", 9e9, 1500.0, 1500.0, 1000.0, 2, 0.02, "e", rounds=r.to_dict()
    )
    base = train_result()
    dist = dataclasses.replace(base, strategy="mirrored", replicas=2, global_batch=32)
    base, dist = (dataclasses.replace(x, examples_per_s=v) for x, v in ((base, 1), (dist, 9)))
    evaluation = type("Eval", (), {"test_accuracy": 0.9, "test_loss": 0.3})()
    summary = compare_runs((base, dist), evaluation, diagnosis, "weak", 0.9)
    assert (summary.baseline_examples_per_s, summary.distributed_examples_per_s) == (1000, 1500)
    assert (summary.speedup, summary.speedup_low, summary.speedup_high) == pytest.approx(
        (1.5, 1.397, 1.681), abs=1e-3
    )
    assert summary.scaling_efficiency == pytest.approx(0.75)
    assert summary.speedup_from_batch == pytest.approx(1.2)
    assert summary.speedup_from_devices == pytest.approx(1.25)
    text = format_summary(summary, "ui")
    assert "examples/s 1.50x (1.40-1.68) one device's" in text.splitlines()[0]
    assert "\nsplit             1.20x from the larger global batch" in text
    assert "3 alternating rounds" in text


@pytest.mark.parametrize(
    ("ratios", "says"),
    [
        ([0.8, 0.85, 0.9], "one device: it trained 1.18x as fast as 2 replicas"),
        ([1.1, 1.2, 1.3], "2 replicas: 1.20x (1.10-1.30) one device's speed"),
        ([0.95, 1.0, 1.1], "either: 2 replicas ran at 1.00x (0.95-1.10)"),
    ],
)
def test_the_summary_recommends_what_every_round_agrees_on(ratios, says):
    from tfscale.tasks.measure.rounds import Spread
    from tfscale.tasks.report.summary import recommend_devices

    assert recommend_devices(Spread.of(ratios), 2).startswith(says)
