"""Building the tf.distribute strategy a `StrategyChoice` names, and its precision policy."""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from tasks.strategy import COLLECTIVE_TIMEOUT_S, StrategyChoice, ensure_logical_cpus

log = logging.getLogger(__name__)


def build_strategy(choice: StrategyChoice, resolver: Any = None) -> tf.distribute.Strategy:
    """The strategy object, with devices, collectives and precision set up.

    Args:
        choice: what `select_strategy` decided.
        resolver: a cluster resolver for `parameter_server` or `tpu` (default: from the
            environment: `TF_CONFIG`, or the TPU resolver).
    """
    import keras

    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    keras.mixed_precision.set_global_policy(choice.precision)
    gpus = tf.config.list_physical_devices("GPU")
    if choice.kind == "one_device":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if choice.kind == "mirrored":
        if gpus:
            return _mirrored_on_gpus()
        # Reduction to one device: collective all-reduce (the CPU default) keys its
        # instances per process, so a second strategy in the same process can collide.
        return tf.distribute.MirroredStrategy(
            devices=ensure_logical_cpus(choice.replicas),
            cross_device_ops=tf.distribute.ReductionToOneDevice(),
        )
    if choice.kind == "multi_worker":
        implementation = (
            tf.distribute.experimental.CommunicationImplementation.NCCL
            if choice.communication == "nccl"
            else tf.distribute.experimental.CommunicationImplementation.RING
        )
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementation, timeout_seconds=COLLECTIVE_TIMEOUT_S
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if choice.kind == "parameter_server":
        resolver = resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if choice.kind == "tpu":
        resolver = resolver or tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"Unknown strategy {choice.kind!r}")


def _mirrored_on_gpus() -> tf.distribute.Strategy:
    try:
        strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        return strategy
    except (tf.errors.OpError, RuntimeError, ValueError) as exc:
        log.warning("NCCL all-reduce unavailable (%s); using hierarchical copy", exc)
        return tf.distribute.MirroredStrategy(
            cross_device_ops=tf.distribute.HierarchicalCopyAllReduce()
        )
