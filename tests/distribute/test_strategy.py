"""Selection policy over faked hardware reports, cluster detection from the environment,
and the TPU branch with the TPU resolver faked (this machine has no TPU)."""

from __future__ import annotations

import json
import os

import pytest
from helpers import report

from tfscale.tasks.distribute.hardware import ClusterInfo, cluster_from_environment
from tfscale.tasks.distribute.strategy import select_strategy
from tfscale.tasks.settings.config import load_config


def choose(hw, **train):
    return select_strategy(hw, load_config(None, {f"train.{k}": v for k, v in train.items()}).train)


@pytest.mark.parametrize(
    ("hw", "train", "kind", "replicas", "precision", "communication"),
    [
        (report(), {"replicas": 1}, "one_device", 1, "float32", "auto"),
        (report(), {"replicas": 4}, "mirrored", 4, "float32", "auto"),
        (
            report(flags=["avx512f", "avx512_bf16"]),
            {"replicas": 1},
            "one_device",
            1,
            "mixed_bfloat16",
            "auto",
        ),
        (report(flags=["amx_bf16"]), {}, "mirrored", 2, "mixed_bfloat16", "auto"),
        (report(gpus=[(8, 0)] * 4), {}, "mirrored", 4, "mixed_float16", "nccl"),
        (report(gpus=[(6, 1)]), {}, "one_device", 1, "float32", "auto"),
        (report(gpus=[(7, 5)]), {}, "one_device", 1, "mixed_float16", "auto"),
        (report(gpus=[(8, 0), (6, 0)]), {}, "mirrored", 2, "float32", "nccl"),
        (report(), {"workers": 3}, "multi_worker", 3, "float32", "ring"),
        (report(tpu="grpc://10.0.0.2:8470"), {"replicas": 8}, "tpu", 8, "mixed_bfloat16", "auto"),
        (
            report(cluster=ClusterInfo("TF_CONFIG", ["a:1", "b:1"], ps=["c:1"])),
            {},
            "parameter_server",
            2,
            "float32",
            "auto",
        ),
        (
            report(gpus=[(8, 0)] * 2, cluster=ClusterInfo("Slurm", ["a:1", "b:1", "c:1"])),
            {},
            "multi_worker",
            6,
            "mixed_float16",
            "nccl",
        ),
        (
            report(gpus=[(8, 0)] * 2),
            {"strategy": "one_device", "precision": "float32"},
            "one_device",
            1,
            "float32",
            "auto",
        ),
    ],
)
def test_policy_table(hw, train, kind, replicas, precision, communication):
    choice = select_strategy(
        hw, load_config(None, {f"train.{k}": v for k, v in train.items()}).train
    )
    assert (choice.kind, choice.replicas, choice.precision, choice.communication) == (
        kind,
        replicas,
        precision,
        communication,
    )
    assert choice.reason.count(";") == 2  # strategy reason; precision reason; XLA reason


def test_reason_says_why():
    assert "amx_bf16" in choose(report(flags=["amx_bf16"]), replicas=1).reason
    assert "requested" in choose(report(), strategy="mirrored").reason
    assert "3 workers" in choose(report(cluster=ClusterInfo("Slurm", ["a", "b", "c"]))).reason


def test_cluster_from_tf_config():
    env = {
        "TF_CONFIG": json.dumps(
            {
                "cluster": {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "ps": ["h3:1"]},
                "task": {"type": "worker", "index": 1},
            }
        )
    }
    cluster = cluster_from_environment(env)
    # with ps tasks the chief coordinates: the workers that step are the two workers
    assert (cluster.source, cluster.num_workers, cluster.ps) == ("TF_CONFIG", 2, ["h3:1"])
    assert (cluster.task_type, cluster.task_index, cluster.is_chief) == ("worker", 1, False)
    assert cluster.spec == {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "ps": ["h3:1"]}
    assert cluster.address_of("ps", 0) == "h3:1" and cluster.task_name == "worker:1"
    assert cluster_from_environment({}) is None


@pytest.mark.parametrize(
    ("tf_config", "says"),
    [
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 5}}', "worker:5"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "ps:0"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}', "worker:-1"),
        ('{"cluster": {}, "task": {"type": "worker", "index": 0}}', "no chief, worker or ps"),
        ('{"cluster": {"worker": ["a:1"]', "not a valid cluster description"),
        ('["a:1"]', "not a valid cluster description"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"index": "one"}}', "not a valid"),
        (  # a string, not a list: one task per character, before
            '{"cluster": {"worker": "127.0.0.1:1"}, "task": {"type": "worker", "index": 0}}',
            'cluster "worker" is \'127.0.0.1:1\', not a list of "host:port"',
        ),
        ('{"cluster": {"worker": ["a"]}, "task": {"index": 0}}', "not a list of"),
        ('{"cluster": {"workers": ["a:1"]}, "task": {"index": 0}}', "job(s) workers"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "boss"}}', "task type 'boss'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"index": 0.5}}', "not a valid"),
    ],
)
def test_a_task_outside_its_cluster_is_a_usage_error_naming_tf_config(tf_config, says):
    """A TFJob replica given an index past its cluster trained the whole job alone, as
    Mirrored, and exited 0."""
    from tfscale.tasks.core.errors import UsageError

    with pytest.raises(UsageError, match="TF_CONFIG") as raised:
        cluster_from_environment({"TF_CONFIG": tf_config})
    assert says in raised.value.message and "TF_CONFIG" in raised.value.fix


def test_cluster_from_slurm_variables(monkeypatch):
    slurm = {
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_STEP_NODELIST": "node[1-2]",
        "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    }
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    cluster = cluster_from_environment(slurm)
    assert cluster.source == "Slurm"
    assert cluster.workers == ["node1:8888", "node2:8888"]
    assert (cluster.task_type, cluster.task_index) == ("worker", 1)
    assert choose(report(cluster=cluster)).kind == "multi_worker"


class FakeTpuResolver:
    """Stands in for TPUClusterResolver: this machine has no TPU."""

    def __init__(self, *args, **kwargs):
        self.created = True

    def master(self):
        return "grpc://fake-tpu:8470"

    def cluster_spec(self):
        import tensorflow as tf

        return tf.train.ClusterSpec({"worker": ["fake-tpu:8470"]})


class EightCoreTpuStrategy:
    """A real one-device strategy that reports the 8 replicas of a v3-8 TPU (none here)."""

    num_replicas_in_sync = 8

    def __init__(self, resolver):
        import tensorflow as tf

        self.cluster_resolver = resolver
        self._inner = tf.distribute.OneDeviceStrategy("/cpu:0")

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_tpu_detection_with_tpu_resolver_faked(monkeypatch):
    import tensorflow as tf

    from tfscale.tasks.distribute.hardware import detect_tpu

    monkeypatch.delenv("TPU_NAME", raising=False)
    assert detect_tpu() is None  # no hint: the resolver is never asked
    monkeypatch.setenv("TPU_NAME", "fake-tpu")
    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", FakeTpuResolver)
    assert detect_tpu() == "grpc://fake-tpu:8470"


def test_tpu_training_setup_with_tpu_resolver_faked(monkeypatch):
    import tensorflow as tf

    from tfscale.tasks.distribute.strategy import build_strategy

    calls = []
    monkeypatch.setattr(
        tf.config, "experimental_connect_to_cluster", lambda r: calls.append(("connect", r))
    )
    monkeypatch.setattr(
        tf.tpu.experimental, "initialize_tpu_system", lambda r: calls.append(("initialize", r))
    )
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda r: ("TPUStrategy", r))
    resolver = FakeTpuResolver()
    choice = choose(report(tpu="fake"), replicas=8)
    try:
        assert build_strategy(choice, resolver) == ("TPUStrategy", resolver)
    finally:
        import keras

        keras.mixed_precision.set_global_policy("float32")
    assert calls == [("connect", resolver), ("initialize", resolver)]


def test_tpu_replicas_come_from_the_strategy_not_the_config(digits, monkeypatch):
    """A v3-8 has 8 cores while train.replicas says 2: the global batch, steps per epoch and
    the logged replicas follow the 8 the strategy reports."""
    import tensorflow as tf

    from tfscale.tasks.train.training import set_up_training

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", lambda r: None)
    monkeypatch.setattr(tf.distribute, "TPUStrategy", EightCoreTpuStrategy)
    _, manifest, _ = digits
    config = load_config(None, {"train.model": "mlp", "train.precision": "float32"})
    choice = select_strategy(report(tpu="fake"), config.train)
    assert (choice.kind, choice.replicas) == ("tpu", 2)  # what the config alone says
    setup = set_up_training(config.train, manifest, choice, FakeTpuResolver())
    assert (setup.replicas, setup.workers) == (8, 1)
    assert (setup.per_replica, setup.global_batch) == (32, 256)
    assert setup.steps == manifest.splits["train"] // 256


def test_every_kind_is_one_row_of_the_table_and_an_unknown_one_lists_them():
    from tfscale.tasks.settings.kinds import KINDS, UnknownStrategy, kind_of

    assert set(KINDS) == {
        "one_device",
        "mirrored",
        "multi_worker",
        "parameter_server",
        "tpu",
        "pipeline",
        "tensor_parallel",
    }
    with pytest.raises(UnknownStrategy) as error:
        kind_of("horovod")
    assert "'horovod'" in str(error.value)
    assert all(name in str(error.value) for name in KINDS)


def test_a_new_in_process_kind_needs_only_its_row(monkeypatch):
    """Selection, replica count, communication, placement and building all come from the
    row: no other module names the strategy."""
    import dataclasses

    from tfscale.tasks.distribute.strategy import StrategyChoice, build_strategy
    from tfscale.tasks.settings import kinds as strategy_kinds

    built = []
    row = dataclasses.replace(
        strategy_kinds.KINDS["mirrored"],
        name="central_storage",
        count_replicas=lambda replicas, gpus, workers: 3,
        build=lambda choice, resolver, timeout_s: built.append(choice) or "a strategy",
    )
    monkeypatch.setitem(strategy_kinds.KINDS, "central_storage", row)
    choice = StrategyChoice("central_storage", 3, 1, "float32", "test")
    assert choice.spec is row and choice.spec.runs_here and choice.logical_cpus == 3
    assert choice.spec.communication("gpu") == "nccl"
    assert build_strategy(choice) == "a strategy" and built == [choice]


@pytest.mark.parametrize(
    ("kind", "runs_here", "step_examples"),
    [
        ("one_device", True, 64),
        ("mirrored", True, 64),
        ("tpu", True, 64),
        ("multi_worker", False, 64),
        ("parameter_server", False, 16),  # one worker's batch per step
    ],
)
def test_where_each_kind_runs_and_what_a_step_consumes(kind, runs_here, step_examples):
    from tfscale.tasks.settings.kinds import kind_of

    spec = kind_of(kind)
    assert spec.runs_here == runs_here
    assert spec.step_examples(per_replica=8, global_batch=32, accum_steps=2) == step_examples


MW = {"worker": ["a:1", "b:1"]}
PS = {"chief": ["c:1"], "worker": ["a:1", "b:1"], "ps": ["p:1"]}


@pytest.mark.parametrize(
    ("spec", "task", "role"),
    [
        (None, None, "chief"),
        (MW, ("worker", 0), "chief"),
        (MW, ("worker", 1), "worker"),
        (MW, ("evaluator", 0), "evaluator"),
        (PS, ("chief", 0), "chief"),
        (PS, ("worker", 0), "server"),
        (PS, ("ps", 0), "server"),
        (PS, ("evaluator", 0), "evaluator"),
    ],
)
def test_each_task_of_a_cluster_gets_its_role(spec, task, role):
    from tfscale.tasks.distribute.cluster import role_of

    cluster = None
    if spec:
        tf_config = {"cluster": spec, "task": {"type": task[0], "index": task[1]}}
        cluster = cluster_from_environment({"TF_CONFIG": json.dumps(tf_config)})
    assert role_of(cluster, choose(report(cluster=cluster), precision="float32").spec) == role


def test_a_parameter_server_cluster_without_a_chief_is_a_usage_error():
    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.distribute.cluster import role_of

    tf_config = {"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "ps"}}
    cluster = cluster_from_environment({"TF_CONFIG": json.dumps(tf_config)})
    with pytest.raises(UsageError, match="no chief"):
        role_of(cluster, choose(report(cluster=cluster)).spec)


def test_a_lost_peer_is_named_with_its_host():
    import tensorflow as tf

    from tfscale.tasks.distribute.cluster import lost_task

    def as_task(kind, index):
        tf_config = {"cluster": MW, "task": {"type": kind, "index": index}}
        return cluster_from_environment({"TF_CONFIG": json.dumps(tf_config)})

    closed = tf.errors.UnavailableError(
        None, None, "from remote target /job:worker/replica:0/task:1: Socket closed"
    )
    lost = lost_task(closed, as_task("worker", 0), "it resumes")
    assert "task worker:1 (b:1)" in lost.message and lost.exit_code == 3
    heartbeat = tf.errors.DeadlineExceededError(None, None, "RPC: /CoordinationService/Heartbeat")
    lost = lost_task(heartbeat, as_task("worker", 1), "it resumes")
    assert "task worker:0 (a:1) timed out" in lost.message  # the coordination service leader
    assert lost_task(ValueError("not a peer"), as_task("worker", 0), "") is None
    assert lost_task(closed, None, "") is None  # one process: nothing to name


def test_a_serving_task_waits_for_the_chief_to_come_and_go():
    import socket
    import threading

    from tfscale.tasks.distribute.cluster import ChiefNeverCame, wait_for_chief_to_finish

    chief = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{chief.getsockname()[1]}"
    gone = threading.Event()

    def go() -> None:  # once the waiting task has seen it answer, the chief goes
        connection, _ = chief.accept()
        connection.close()
        gone.set()
        chief.close()

    threading.Thread(target=go, daemon=True).start()
    wait_for_chief_to_finish(address, chief_wait_s=30)
    assert gone.is_set()  # it returned after the chief went away, not when it first answered
    with pytest.raises(ChiefNeverCame, match="did not answer within 1 s"):
        wait_for_chief_to_finish(address, chief_wait_s=1)


def test_a_slurm_task_gets_the_cpus_slurm_gave_it_not_every_core_of_its_node():
    from tfscale.tasks.distribute.hardware import slurm_task_cpus

    assert slurm_task_cpus({}) is None  # not a Slurm task
    assert slurm_task_cpus({"SLURM_CPUS_PER_TASK": "4", "SLURM_CPUS_ON_NODE": "32"}) == 4
    node = {"SLURM_CPUS_ON_NODE": "32"}
    assert slurm_task_cpus({**node, "SLURM_NTASKS_PER_NODE": "4"}) == 8
    # --ntasks over nodes unevenly: this node's entry of "2(x3),1"
    uneven = {**node, "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert [slurm_task_cpus({**uneven, "SLURM_NODEID": str(i)}) for i in range(4)] == [
        16,
        16,
        16,
        32,
    ]
    assert slurm_task_cpus({"SLURM_CPUS_ON_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x2)"}) == 1
    assert slurm_task_cpus({"SLURM_CPUS_ON_NODE": "2", "SLURM_NTASKS_PER_NODE": "4"}) == 1


def test_slurm_jobs_by_rank_are_read_and_a_wrong_split_is_refused_with_the_fix():
    from tfscale.tasks.core.errors import UsageError
    from tfscale.tasks.distribute.hardware import slurm_jobs

    env = {"SLURM_NTASKS": "4", "TFSCALE_SLURM_JOBS": "chief:1, worker:2, ps:1"}
    assert slurm_jobs(env) == {"chief": 1, "worker": 2, "ps": 1}
    assert slurm_jobs({"SLURM_NTASKS": "4"}) is None  # every task a worker
    for wrong in ("chief:1,worker:2", "chief:1,gpu:3", "chief=1"):
        with pytest.raises(UsageError) as error:
            slurm_jobs({**env, "TFSCALE_SLURM_JOBS": wrong})
        assert (
            "TFSCALE_SLURM_JOBS" in str(error.value) and "chief:1,worker:2,ps:1" in error.value.fix
        )
