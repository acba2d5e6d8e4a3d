"""Training for real under OneDevice, Mirrored (2 logical CPUs), MultiWorkerMirrored (2 worker
processes) and ParameterServer (in-process cluster); accumulation, loss scaling, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from helpers import INNER_LIMIT_S, ROOT, scaled

from tfscale.tasks.distribute.hardware import detect_hardware
from tfscale.tasks.distribute.launch import WorkerError
from tfscale.tasks.distribute.run import Run
from tfscale.tasks.distribute.strategy import select_strategy
from tfscale.tasks.execute.trainings import run_training
from tfscale.tasks.settings.config import load_config
from tfscale.tasks.train.training import batch_sizes, train_model

FAST = {
    "train.model": "mlp",
    "train.epochs": 2,
    "train.precision": "float32",
    "train.jit_compile": False,
}


def configure(digits, tmp_path, **train):
    overrides, manifest, data_dir = digits
    values = dict(overrides, **FAST, **{"train.runs_dir": str(tmp_path / "runs")})
    values.update({f"train.{k}": v for k, v in train.items()})
    config = load_config(None, values)
    report = detect_hardware()
    return Run(config, manifest, data_dir, select_strategy(report, config.train), report)


def test_batch_sizes_for_weak_and_strong_scaling():
    cfg = load_config(None, {"train.batch_size_per_replica": 64}).train
    assert batch_sizes(cfg, 4) == (64, 256)
    strong = load_config(None, {"train.batch_size_per_replica": 64, "train.scaling": "strong"})
    assert batch_sizes(strong.train, 4) == (16, 64)


def test_throughput_leaves_out_the_first_epoch():
    """The first epoch traces the step: 1,000 examples in 9 s there, then 2,000 in 2 s and
    1,000 in 2 s is 3,000 examples in 4 s. A run of one epoch has only that one."""
    from tfscale.tasks.train.result import examples_per_s

    history = [
        {"examples": 1000, "seconds": 9.0},
        {"examples": 2000, "seconds": 2.0},
        {"examples": 1000, "seconds": 2.0},
    ]
    assert examples_per_s(history) == 750.0
    assert examples_per_s(history[:1]) == pytest.approx(1000 / 9)


def test_one_device_learns(digits, tmp_path):
    run = configure(digits, tmp_path, strategy="one_device", epochs=3)
    result = train_model(run).result
    losses = [h["loss"] for h in result.history]
    assert result.replicas == 1 and result.global_batch == 32
    assert losses[-1] < losses[0] * 0.5
    assert result.steps_per_epoch == 1437 // 32
    assert Path(result.model_path).exists()


def test_mirrored_over_two_logical_cpus_keeps_replicas_in_sync(digits, tmp_path):
    """After training on different examples, each variable's copy on each replica holds
    the same values: the gradients were all-reduced before every update."""
    run = configure(digits, tmp_path, strategy="mirrored", replicas=2)
    trained = train_model(run)
    result = trained.result
    assert (result.strategy, result.replicas, result.global_batch) == ("mirrored", 2, 64)
    assert result.history[-1]["accuracy"] > 0.5
    variables = trained.setup.model.trainable_variables
    assert variables
    for variable in variables:
        copies = [np.array(copy) for copy in variable.value.values]  # a MirroredVariable
        assert len(copies) == 2, variable.name
        np.testing.assert_allclose(copies[0], copies[1], rtol=0, atol=0, err_msg=variable.name)


def test_a_trainings_stage_line_says_which_epochs_its_speed_covers():
    """The stage line's examples/s leave the first epoch (tracing) out, as
    `examples_per_s` does, and the line says so: the summary's rounds are another
    measurement, and a reader comparing the two must know which is which."""
    from tfscale.tasks.execute.trainings import trained_line
    from tfscale.tasks.train.result import TrainResult, examples_per_s

    history = [
        {"epoch": 1, "examples": 100, "seconds": 1.0, "accuracy": 0.5},
        {"epoch": 2, "examples": 100, "seconds": 0.02, "accuracy": 0.8},
        {"epoch": 3, "examples": 100, "seconds": 0.03, "accuracy": 0.9},
    ]
    fields = dict(run_dir="r", model_path="m", strategy="mirrored", reason="")
    fields |= dict(replicas=2, workers=1, precision="float32", per_replica_batch=32)
    fields |= dict(global_batch=64, grad_accum_steps=1, learning_rate=0.1, steps_per_epoch=2)
    three = TrainResult(**fields, history=history, examples_per_s=examples_per_s(history))
    assert trained_line(three) == (
        "4,000 examples/s over epochs 2-3, 2 replicas, global batch 64, train accuracy 0.9000"
    )
    one = TrainResult(**fields, history=history[:1], examples_per_s=examples_per_s(history[:1]))
    assert trained_line(one).startswith("100 examples/s over its one epoch, 2 replicas")


@pytest.mark.parametrize("devices", [["/cpu:0"], ["/cpu:0", "/cpu:1"]])
def test_fused_adam_updates_as_kerass_adam_does(devices):
    """Five updates of the warm-up schedule from the same gradients: FusedAdam's one kernel
    per variable against Keras's Adam, on one device and on each copy under Mirrored over 2
    logical CPUs (which sums the replicas' gradients first)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfscale.tasks.train.steps import FusedAdam, make_warmup_schedule

    strategy = tf.distribute.MirroredStrategy(devices)
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=3).astype("float32")]
    grads = [[rng.normal(size=w.shape).astype("float32") for w in start] for _ in range(5)]

    def train(optimizer_class) -> list[list[np.ndarray]]:
        with strategy.scope():
            weights = [keras.Variable(w) for w in start]
            optimizer = optimizer_class(make_warmup_schedule(1e-3, 4e-3, 3))
            optimizer.build(weights)

        def replica_update(step_grads):  # each replica's gradients made on its device
            optimizer.apply([tf.identity(g) for g in step_grads], weights)

        @tf.function
        def update(step_grads):
            strategy.run(replica_update, args=(step_grads,))

        for step_grads in grads:
            update([tf.constant(g) for g in step_grads])
        return [[c.numpy() for c in strategy.experimental_local_results(w.value)] for w in weights]

    fused, plain = train(FusedAdam), train(keras.optimizers.Adam)
    for fused_copies, plain_copies, first in zip(fused, plain, start, strict=True):
        assert len(fused_copies) == len(devices)
        for copy in fused_copies:
            np.testing.assert_array_equal(copy, fused_copies[0])  # the replicas agree
        np.testing.assert_allclose(fused_copies[0], plain_copies[0], rtol=1e-5, atol=1e-7)
        assert np.abs(fused_copies[0] - first).min() > 1e-4  # every weight moved


def test_distributed_input_runs_no_autotuning_thread(digits, tmp_path):
    """Deleting a distributed iterator waits for tf.data's autotuning thread to end its
    sleep (up to 60 s; `tasks.data.inputs.distributed_iterator`): neither the input pipeline
    nor the per-device datasets behind the iterator may run one."""
    import tensorflow as tf

    from tfscale.tasks.data.inputs import build_dataset, distributed_iterator

    _, manifest, data_dir = digits
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    iterator = distributed_iterator(
        strategy, lambda ctx: build_dataset(manifest, data_dir, "train", 16, training=True)
    )
    images, labels = next(iterator)
    assert [t.shape[0] for t in strategy.experimental_local_results(labels)] == [16, 16]
    # the distributed iterator's host iterator and its per-device iterators
    device_iterators = iterator._iterators[0]._iterator._device_iterators
    assert len(device_iterators) == 2
    datasets = [it._dataset for it in device_iterators]
    datasets.append(build_dataset(manifest, data_dir, "train", 16, training=True))
    assert [d.options().autotune.enabled for d in datasets] == [False, False, False]


def test_gradient_accumulation_equals_the_larger_batch_under_mirrored(digits, tmp_path):
    """One update of 2 replicas x 32 against 2 replicas x 2 micro-batches of 16: the same 64
    examples give the same weights. One step: Adam's sign-like early updates would turn
    float round-off in near-zero gradients into visible differences over an epoch."""
    import dataclasses

    weights = []
    for batch, accum in ((32, 1), (16, 2)):
        run = configure(
            digits,
            tmp_path,
            strategy="mirrored",
            replicas=2,
            epochs=1,
            batch_size_per_replica=batch,
            grad_accum_steps=accum,
        )
        one_step = dataclasses.replace(run.manifest, splits=dict(run.manifest.splits, train=64))
        result = train_model(dataclasses.replace(run, manifest=one_step)).result
        assert result.steps_per_epoch == 1
        assert result.learning_rate == pytest.approx(0.002)
        from tfscale.tasks.train.models import load_trained_model

        model = load_trained_model(result.model_path)
        weights.append([w.numpy() for w in model.weights])
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_mixed_float16_scales_the_loss_under_mirrored(digits, tmp_path):
    import keras

    run = configure(digits, tmp_path, strategy="mirrored", precision="mixed_float16", epochs=1)
    try:
        result = train_model(run).result
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert result.precision == "mixed_float16"
    assert np.isfinite(result.history[0]["loss"]) and result.history[0]["accuracy"] > 0.2


@pytest.mark.cluster(alone=False)  # local processes, no speed claimed
def test_multi_worker_two_processes_end_with_identical_weights(digits, tmp_path, monkeypatch):
    """Two worker processes on this host train in lock-step: the same weights, the same
    globally reduced loss and accuracy, only the chief's outputs kept. On a host with 4 GPUs
    (faked: this machine has none) each sees 2 through CUDA_VISIBLE_DEVICES; more workers
    than GPUs is a usage error. (Diagnosed in the worker processes, its class read from
    measured speeds, and the forecast fitted to such a run: test_sweep's emulated links,
    alone on the machine.)"""
    import tensorflow as tf

    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.distribute.launch import gpu_shares

    run = configure(digits, tmp_path, strategy="multi_worker", workers=2)
    real = tf.config.list_physical_devices
    fake = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(4)]
    monkeypatch.setattr(
        tf.config,
        "list_physical_devices",
        lambda kind=None: fake if kind == "GPU" else real(kind),
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = run_training(run)
    run_dir = Path(result.run_dir)
    logs = [(run_dir / f"worker-{i}.log").read_text() for i in range(2)]
    assert "worker 0: CUDA_VISIBLE_DEVICES=0,1" in logs[0]
    assert "worker 1: CUDA_VISIBLE_DEVICES=2,3" in logs[1]
    results = [json.loads((run_dir / f"worker-{i}-result.json").read_text()) for i in range(2)]
    digests = [r["weights_digest"] for r in results]
    assert digests[0] == digests[1] != ""
    # loss and accuracy are reduced across both workers: each reports the same global figure
    histories = [[(h["loss"], h["accuracy"]) for h in r["history"]] for r in results]
    assert histories[0] == histories[1]
    assert results[0]["history"][-1]["accuracy"] > 0.6  # a local count would cap it at 0.5
    assert (result.replicas, result.global_batch) == (2, 64)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["strategy"] == "multi_worker" and len(metrics["history"]) == 2
    assert not list(run_dir.glob(".worker-1-checkpoints"))  # only the chief keeps outputs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert gpu_shares(3) == ["4", "5", "6"]
    with pytest.raises(UsageError, match="5 workers for 4 GPUs"):
        gpu_shares(5)


@pytest.mark.cluster(alone=False)  # one process; the diagnosis's class not asserted
def test_parameter_server_on_an_in_process_cluster(digits, tmp_path):
    overrides, _, _ = digits
    out = run_cli(
        ["train", "--strategy", "parameter_server", "--workers", "2", "--model", "mlp"]
        + ["--epochs", "2", "--precision", "float32", "--data-dir", overrides["prepare.data_dir"]]
        + ["--runs-dir", str(tmp_path / "runs")]
    )
    assert "parameter_server, 2 replicas" in out
    assert "measured:   in the coordinator and 2 workers" in out  # diagnosed in place
    (metrics,) = (tmp_path / "runs" / "digits").glob("*/metrics.json")
    history = json.loads(metrics.read_text())["history"]
    assert len(history) == 2 and history[1]["loss"] < history[0]["loss"]


LOST_WORKER_S = 10  # a dead worker's job fails within this, on the reference machine


@pytest.mark.cluster(alone=False)  # local processes, no speed claimed
def test_a_dead_worker_stops_the_job_with_a_clear_error(digits, tmp_path):
    run = configure(digits, tmp_path, strategy="multi_worker", workers=2, epochs=500)
    outcome = {}

    def train():
        try:
            run_training(run)
        except WorkerError as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=train)
    thread.start()
    victim = wait_for_worker(1, tmp_path)
    killed = time.monotonic()
    victim.kill()
    thread.join(timeout=scaled(120))  # a hang's limit; the job's own is far shorter
    assert not thread.is_alive(), "the job hung after a worker died"
    # the launcher polls its workers every 0.5 s and kills the others at once: the error
    # comes within seconds (work, so scaled), not at a timeout's end
    failed_s = time.monotonic() - killed
    assert failed_s <= scaled(LOST_WORKER_S), f"the job failed {failed_s:.1f} s after"
    assert "worker 1 exited with code -9" in outcome["error"]
    assert not [
        p
        for p in psutil.Process().children(recursive=True)
        if "tfscale.flows.worker" in " ".join(p.cmdline())
    ]


def test_the_launchers_error_names_the_worker_killed_not_the_peer_it_failed(tmp_path):
    """A killed worker's peer fails its collective at once: seen together in one poll, the
    error names the one killed by a signal, whatever its index, and the others after it;
    a preempted worker before either (its advice: run again); else the first that failed."""
    from types import SimpleNamespace

    from tfscale.tasks.distribute.launch import _raise_first_cause

    def exited(*codes):
        return [SimpleNamespace(poll=lambda c=c: c, returncode=c) for c in codes]

    logs = [tmp_path / f"worker-{i}.log" for i in range(3)]
    with pytest.raises(WorkerError, match="worker 1 exited with code -9") as raised:
        _raise_first_cause(exited(1, -9, None), logs)
    assert "(in the same poll: worker 0 with code 1)" in raised.value.message
    with pytest.raises(WorkerError, match="worker 0 exited with code 1"):
        _raise_first_cause(exited(1, 2, None), logs)
    # a preempted worker first, its advice kept: run again, it resumes
    with pytest.raises(WorkerError, match="worker 2 was preempted") as raised:
        _raise_first_cause(exited(-9, None, 42), logs)
    assert "resumes" in raised.value.fix
    _raise_first_cause(exited(0, None, 0), logs)  # none failed: nothing raised


def wait_for_worker(index: int, tmp_path: Path) -> psutil.Process:
    """The worker process with this index, once it has finished an epoch."""
    deadline = time.monotonic() + scaled(120)
    while time.monotonic() < deadline:
        if list((tmp_path / "runs").glob("*/*/history.json")):
            for proc in psutil.Process().children(recursive=True):
                env = proc.environ()
                if "TF_CONFIG" in env and json.loads(env["TF_CONFIG"])["task"]["index"] == index:
                    return proc
        time.sleep(0.1)
    raise AssertionError("workers never finished an epoch")


@pytest.mark.integration
def test_default_config_reaches_95_percent_on_digits(digits, tmp_path):
    """`tfscale train` then `tfscale evaluate` on params.yaml as shipped, in this process
    (the claim is the accuracy, not the process)."""
    import keras
    from helpers import run_main

    overrides, _, _ = digits
    common = ["--data-dir", overrides["prepare.data_dir"], "--runs-dir", str(tmp_path / "runs")]
    params = ["--params", str(ROOT / "params.yaml")]
    try:
        code, out, err = run_main([*params, "train", "--no-diagnose", *common], tmp_path)
        assert code == 0, err[-3000:]
        code, out, err = run_main([*params, "evaluate", *common], tmp_path)
        assert code == 0, err[-3000:]
    finally:
        keras.mixed_precision.set_global_policy("float32")  # `auto` may have chosen another
    (eval_json,) = (tmp_path / "runs" / "digits").glob("*/eval.json")
    result = json.loads(eval_json.read_text())
    assert result["examples"] == 360 and sum(map(sum, result["confusion_matrix"])) == 360
    assert result["test_accuracy"] >= 0.95, out
    assert (eval_json.parent / "confusion_matrix.png").stat().st_size > 1000


def run_cli(args: list[str]) -> str:
    # a crash names its Python stack: the parameter-server run died once in 13 with SIGSEGV
    # right after TensorFlow started, and its stderr said nothing more
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONFAULTHANDLER="1")
    proc = subprocess.run(
        [sys.executable, "-m", "tfscale.flows.cli", "--params", str(ROOT / "params.yaml"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(INNER_LIMIT_S),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.cluster(alone=False)  # local processes, no speed claimed
def test_a_large_table_is_split_across_two_ps_tasks_and_learns(digits):
    """The embedding model's 4 MiB table on a cluster with two ps tasks: each ps holds a
    part, and the loss falls as it does with the table whole on one ps."""
    _, _, data_dir = digits
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "support" / "partition_check.py"), str(data_dir)],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        timeout=scaled(INNER_LIMIT_S),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    split, whole = found["2"], found["1"]
    assert [d.split("/device")[0] for d in split["devices"]] == [
        "/job:ps/replica:0/task:0",
        "/job:ps/replica:0/task:1",
    ]
    assert split["rows"] == [32_768, 32_768] and whole["rows"] == [65_536]
    for curve in (split["losses"], whole["losses"]):
        assert curve[-1] < curve[0] - 0.02, found


@pytest.mark.unit
def test_steps_per_call_sets_how_many_steps_each_graph_call_runs(digits, monkeypatch):
    """`train.steps_per_call: 4`: 10 steps of tfscale's loop run as graph calls of 4, 4
    and 2 steps (the default, 1: ten calls of one)."""
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.train import steps as step_module
    from tfscale.tasks.train.training import set_up_training, train_dataset_fn

    overrides, manifest, data_dir = digits
    real, calls = step_module.run_in_calls, []

    def counted(train_steps, steps, per_call, after_steps):
        real(train_steps, steps, per_call, lambda n: (calls.append(n), after_steps(n)))

    monkeypatch.setattr(step_module, "run_in_calls", counted)
    for per_call, expected in ((4, [4, 4, 2]), (1, [1] * 10)):
        values = {**overrides, "train.strategy": "one_device", "train.model": "mlp"}
        config = load_config(None, {**values, "train.steps_per_call": per_call})
        choice = select_strategy(detect_hardware(), config.train)
        setup = set_up_training(config.train, manifest, choice)
        dataset_fn = train_dataset_fn(config.train, setup.manifest, data_dir, setup.per_replica)
        calls.clear()
        setup.epoch_runner(choice, dataset_fn)(10)
        assert calls == expected, per_call


def test_preemption_is_checked_inside_an_epoch_and_after_its_record_not_in_its_last_call():
    """A preemption saved inside an epoch's last call would leave that epoch unrecorded in
    history.json while its steps are in the checkpoint: the loop checks after recording."""
    import tensorflow as tf

    from tfscale.tasks.train.training import _StepCounter

    checked = []
    step = tf.Variable(0, dtype=tf.int64)
    counter = _StepCounter(step, 0, lambda: checked.append(counter.count))
    counter.epoch_ends_at = 22
    for n in (10, 10, 2):  # steps_per_call 10, 22 steps per epoch
        counter(n)
    assert checked == [10, 20] and int(step.numpy()) == 22
    counter.check_preemption()  # the loop, once the epoch is recorded
    assert checked == [10, 20, 22]


@pytest.mark.integration  # trains, times rounds or starts a process
def test_a_run_directory_in_use_is_refused_naming_its_holder(tmp_path):
    """While this process holds a run directory, another process asking for it gets a
    clear error naming this one; once released, it gets the directory."""
    from tfscale.tasks.core.run_lock import hold

    run_dir = tmp_path / "runs" / "digits" / "mirrored-2x-float32-abc"
    script = (
        "import sys\nfrom pathlib import Path\nfrom tasks.core.run_lock import hold, RunInUse\n"
        "try:\n    with hold(Path(sys.argv[1])):\n        print('held')\n"
        "except RunInUse as exc:\n    print(exc)\n"
    )

    def other() -> str:
        argv = [sys.executable, "-c", script, str(run_dir)]
        return subprocess.run(
            argv, capture_output=True, text=True, check=True, timeout=scaled(INNER_LIMIT_S)
        ).stdout

    with hold(run_dir), hold(run_dir):  # this process may take it again (train, then measure)
        refused = other()
    assert f"is in use by pid {os.getpid()}" in refused, refused
    assert other().strip() == "held"


@pytest.mark.unit
def test_the_learning_rate_asked_for_is_the_rate_a_built_in_model_trains_at(digits):
    """`train.learning_rate` is the base rate of a model compiled without one (a built-in):
    0.005 and 0.02 at the base batch, one device (no rule scales it there)."""
    from tfscale.tasks.train.training import set_up_training

    overrides, manifest, _ = digits
    for rate in (0.005, 0.02):
        values = {**overrides, "train.strategy": "one_device", "train.model": "mlp"}
        config = load_config(None, {**values, "train.learning_rate": rate})
        choice = select_strategy(detect_hardware(), config.train)
        assert set_up_training(config.train, manifest, choice).learning_rate == rate


@pytest.mark.unit
def test_train_cache_decides_whether_the_training_pipeline_caches_its_examples(digits, monkeypatch):
    """`train.cache: false` reads the shards afresh every epoch: no cache in the training's
    pipeline; `true` (the default) caches the decoded examples once."""
    import tensorflow as tf

    from tfscale.tasks.train.training import train_dataset_fn

    overrides, manifest, data_dir = digits
    cached, real = [], tf.data.Dataset.cache

    def counted(self, *args, **kwargs):
        cached.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tf.data.Dataset, "cache", counted)
    for cache in (False, True):
        config = load_config(None, {**overrides, "train.cache": cache})
        cached.clear()
        train_dataset_fn(config.train, manifest, data_dir, 16)(None)
        assert len(cached) == int(cache), cache
