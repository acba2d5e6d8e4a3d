"""How each `tf.distribute` strategy is built, for the table of kinds that names them
(`tasks.settings.kinds`, bound late by name): (choice, cluster resolver or None, collective
timeout in seconds) -> tf.distribute.Strategy, each importing TensorFlow only when called;
and what a built strategy spans (`cluster_spec_of`, `replicas_of`)."""

from __future__ import annotations

from typing import Any

from tfscale.tasks.core.internals import cluster_resolver_of
from tfscale.tasks.core.process import wait_for_peers_at_exit


def replicas_of(kind: Any, strategy: Any) -> tuple[int, int]:
    """(replicas, workers) of a strategy of `kind` (a `StrategyKind`) once built: the only
    source of the global batch, the loss divisor, steps per epoch and every examples/s
    figure."""
    spec = cluster_spec_of(strategy)
    workers = max(len(spec.get("worker", [])) + len(spec.get("chief", [])), 1)
    in_sync = strategy.num_replicas_in_sync
    if kind.one_worker_per_step:  # each worker steps on its own: concurrency is workers
        workers = max(len(spec.get("worker", [])), 1)
        return in_sync * workers, workers
    return in_sync, workers


def cluster_spec_of(strategy: Any) -> dict[str, list[str]]:
    """The cluster a built strategy spans ({} for one process)."""
    resolver = cluster_resolver_of(strategy)
    return resolver.cluster_spec().as_dict() if resolver is not None else {}


def build_one_device(choice: Any, resolver: Any = None, timeout_s: float = 60.0) -> Any:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")


def build_mirrored(choice: Any, resolver: Any = None, timeout_s: float = 60.0) -> Any:
    import tensorflow as tf

    from tfscale.tasks.core.process import logical_cpus

    if tf.config.list_physical_devices("GPU"):
        return _mirrored_on_gpus()
    # Reduction to one device: collective all-reduce (the CPU default) keys its
    # instances per process, so a second strategy in the same process can collide.
    return tf.distribute.MirroredStrategy(
        devices=logical_cpus(choice.replicas),
        cross_device_ops=tf.distribute.ReductionToOneDevice(),
    )


def _mirrored_on_gpus() -> Any:
    """Mirrored over every local GPU with NCCL, or hierarchical copy where NCCL fails."""
    import logging

    import tensorflow as tf

    try:
        strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        return strategy
    except (tf.errors.OpError, RuntimeError, ValueError) as exc:
        logging.getLogger(__name__).warning(
            "NCCL all-reduce unavailable (%s); using hierarchical copy", exc
        )
        return tf.distribute.MirroredStrategy(
            cross_device_ops=tf.distribute.HierarchicalCopyAllReduce()
        )


def build_multi_worker(choice: Any, resolver: Any = None, timeout_s: float = 60.0) -> Any:
    """Collectives over RING (NCCL on GPUs) that fail after `timeout_s` on a lost peer."""
    import tensorflow as tf

    implementation = (
        tf.distribute.experimental.CommunicationImplementation.NCCL
        if choice.communication == "nccl"
        else tf.distribute.experimental.CommunicationImplementation.RING
    )
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=timeout_s
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    wait_for_peers_at_exit(timeout_s)
    return strategy


def build_parameter_server(choice: Any, resolver: Any = None, timeout_s: float = 60.0) -> Any:
    import tensorflow as tf

    from tfscale.tasks.core.process import fail_fast_rpcs

    fail_fast_rpcs()
    resolver = resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(resolver)


def build_tpu(choice: Any, resolver: Any = None, timeout_s: float = 60.0) -> Any:
    import tensorflow as tf

    resolver = resolver or tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
