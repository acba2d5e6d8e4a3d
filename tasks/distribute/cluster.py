"""What one task of a cluster does, as a cluster manager launches it.

Kubeflow's TFJob and Slurm run the same `tfscale train` on every task and describe the
cluster in `TF_CONFIG` or `SLURM_*` variables
(`tasks.distribute.hardware.cluster_from_environment`).
The task's role follows from its type and the strategy kind:

| strategy          | chief                 | worker                | ps     | evaluator |
| ----------------- | --------------------- | --------------------- | ------ | --------- |
| multi_worker      | trains, writes outputs| trains                | -      | evaluates |
| parameter_server  | coordinates the loop  | serves                | serves | evaluates |

Without a chief, worker 0 is the chief. "Serves" is a `tf.distribute.Server` that runs
until the chief's address has answered and then stops answering (the coordinator is
done), then exits 0. "Evaluates" is a sidecar that evaluates each new checkpoint in the
chief's run directory as it appears, until the run's metrics are written.

A task that is lost (killed, or cut off by the network) fails the others' collectives
within `cluster.collective_timeout_s`; `lost_task` turns that TensorFlow error into one
that names the task and its host.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from tfscale.tasks.core.errors import UsageError, UserError
from tfscale.tasks.core.process import set_up_worker
from tfscale.tasks.core.run_layout import METRICS
from tfscale.tasks.distribute.hardware import ClusterInfo, slurm_task_cpus
from tfscale.tasks.settings.kinds import StrategyKind

log = logging.getLogger(__name__)

CHIEF, WORKER, SERVER, EVALUATOR = "chief", "worker", "server", "evaluator"
EXIT_PREEMPTED = 42  # TensorFlow's restart code: a checkpoint was saved, rerun to resume
EXIT_TASK_LOST = 3  # another task of the cluster was lost; rerun to resume
POLL_S = 1.0
GONE_AFTER = 3  # consecutive refused polls before the chief counts as done


class TaskLost(UserError):
    """Another task of the cluster died or became unreachable."""

    exit_code = EXIT_TASK_LOST


class ChiefNeverCame(UserError):
    """A serving task waited for the chief longer than `cluster.chief_wait_s`."""


def role_of(cluster: ClusterInfo | None, kind: StrategyKind) -> str:
    """What this task does (see the module's table); no cluster: the chief of one.

    Raises:
        UsageError: a parameter-server cluster with no chief (nothing would coordinate).
    """
    if cluster is None:
        return CHIEF
    if cluster.task_type == "evaluator":
        return EVALUATOR
    if kind.tasks_serve:
        if not cluster.chief:
            raise UsageError(
                f"the {cluster.source} cluster has ps tasks but no chief",
                "add one 'chief' task: it coordinates; ps and worker tasks serve.",
            )
        return CHIEF if cluster.task_type == "chief" else SERVER
    return CHIEF if cluster.is_chief else WORKER


def describe_as_tf_config(cluster: ClusterInfo, env: dict[str, str]) -> None:
    """Sets `TF_CONFIG` in `env` (os.environ) from a cluster Slurm described, so that every
    strategy's TF_CONFIG resolver sees the same cluster this task was given."""
    if cluster.source != "TF_CONFIG" and not env.get("TF_CONFIG"):
        task = {"type": cluster.task_type, "index": cluster.task_index}
        env["TF_CONFIG"] = json.dumps({"cluster": cluster.spec, "task": task})


def join(cluster: ClusterInfo) -> None:
    """Makes this process the task `cluster` describes: its `TF_CONFIG` set (from Slurm's
    variables too) and, under Slurm, TensorFlow's thread pools sized to the CPUs Slurm gave
    this task, not every core of a node its other tasks share."""
    describe_as_tf_config(cluster, os.environ)
    threads = slurm_task_cpus(dict(os.environ)) if cluster.source == "Slurm" else None
    if threads:
        set_up_worker(None, threads)
        cpus = f"{threads} CPU" + ("s" if threads > 1 else "")
        print(f"threads: {threads} per TensorFlow pool (Slurm gave this task {cpus})")


def serve_task(cluster: ClusterInfo, chief_wait_s: float) -> None:
    """Runs this task's `tf.distribute.Server` until the coordinator is done.

    Raises:
        ChiefNeverCame: the chief did not answer within `chief_wait_s`.
    """
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    if cluster.task_type == "ps":
        config.device_count["GPU"] = 0  # variables live on the ps tasks' CPUs
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster.spec),
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        protocol="grpc",
        config=config,
    )
    chief = cluster.chief[0]
    print(f"{cluster.task_name} serving at {server.target}; waiting for the chief {chief}")
    wait_for_chief_to_finish(chief, chief_wait_s)
    print(f"{cluster.task_name}: the chief {chief} is done; exiting")


def wait_for_chief_to_finish(address: str, chief_wait_s: float) -> None:
    """Returns once `address` has accepted connections and then refused `GONE_AFTER` polls
    in a row.

    Raises:
        ChiefNeverCame: it never accepted within `chief_wait_s`.
    """
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + chief_wait_s
    seen, refused = False, 0
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=POLL_S):
                seen, refused = True, 0
        except OSError:
            refused += 1
            if seen and refused >= GONE_AFTER:
                return
            if not seen and time.monotonic() > deadline:
                raise ChiefNeverCame(
                    f"the chief {address} did not answer within {chief_wait_s:.0f} s",
                    "start the chief task too, or raise cluster.chief_wait_s.",
                ) from None
        time.sleep(POLL_S)


TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")


def lost_task(exc: BaseException, cluster: ClusterInfo | None, resume: str) -> TaskLost | None:
    """A `TaskLost` naming the task (and its host) a TensorFlow runtime error points at,
    or None when `exc` is not a lost peer."""
    import tensorflow as tf

    lost_kinds = (
        tf.errors.UnavailableError,
        tf.errors.AbortedError,
        tf.errors.DeadlineExceededError,
        tf.errors.CancelledError,
        tf.errors.InternalError,
    )
    if cluster is None or not isinstance(exc, lost_kinds):
        return None
    text = str(exc)
    own = (cluster.task_type, cluster.task_index)
    named = [(job, int(i)) for job, i in TASK.findall(text) if (job, int(i)) != own]
    leader = ("chief", 0) if cluster.chief else ("worker", 0)
    if not named and "CoordinationService" in text and own != leader:
        named = [leader]  # heartbeats to the coordination service (on the chief) failed
    if named:
        job, index = named[0]
        who = f"task {job}:{index} ({cluster.address_of(job, index)})"
    else:
        who = "another task of the cluster"
    cause = "timed out" if isinstance(exc, tf.errors.DeadlineExceededError) else "failed"
    first_line = text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
    return TaskLost(
        f"{cluster.task_name}: a collective with {who} {cause} "
        f"({type(exc).__name__}: {first_line[:200]})",
        f"check that task and the network to it, then rerun the same command on every "
        f"task; {resume}.",
    )


def evaluate_checkpoints(
    build_model: Any,
    evaluate: Any,
    run_dir: Path,
    timeout_s: float,
) -> list[dict[str, float]]:
    """The evaluator sidecar: evaluates each new checkpoint in `run_dir/checkpoints` as it
    appears, writing `run_dir/evaluator.json`, until `run_dir/metrics.json` exists and the
    newest checkpoint is evaluated.

    Args:
        build_model: () -> a fresh Keras model of the run's architecture.
        evaluate: (model) -> {"test_loss": ..., "test_accuracy": ...}.
        timeout_s: how long to wait for the first checkpoint.
    """
    import tensorflow as tf

    from tfscale.tasks.core.files import write_json_atomic

    model = build_model()
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, step=step)
    directory, records, seen = run_dir / "checkpoints", [], None
    deadline = time.monotonic() + timeout_s
    while True:
        done = (run_dir / METRICS).exists()
        latest = tf.train.latest_checkpoint(str(directory))
        if latest and latest != seen:
            checkpoint.restore(latest).expect_partial()
            record = {"checkpoint": Path(latest).name, "step": int(step.numpy())}
            record.update(evaluate(model))
            records.append(record)
            write_json_atomic(run_dir / "evaluator.json", records)
            print(json.dumps(record), flush=True)
            seen = latest
            continue
        if done:
            return records
        if not records and time.monotonic() > deadline:
            raise ChiefNeverCame(
                f"no checkpoint appeared in {directory} within {timeout_s:.0f} s",
                "start the chief and worker tasks, or raise cluster.chief_wait_s.",
            )
        time.sleep(POLL_S)
