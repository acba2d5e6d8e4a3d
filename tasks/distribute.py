"""Building the tf.distribute strategy a `StrategyChoice` names, and its precision policy."""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from tasks.strategy import StrategyChoice

log = logging.getLogger(__name__)


def build_strategy(
    choice: StrategyChoice, resolver: Any = None, collective_timeout_s: float = 60.0
) -> tf.distribute.Strategy:
    """The strategy object over the devices `tasks.process` set up.

    Args:
        choice: what `select_strategy` decided.
        resolver: a cluster resolver for `parameter_server` or `tpu` (default: from the
            environment: `TF_CONFIG`, or the TPU resolver).
        collective_timeout_s: how long a cross-process collective waits on a lost peer.
    """
    return choice.spec.build(choice, resolver, collective_timeout_s)


def mirrored_on_gpus() -> tf.distribute.Strategy:
    try:
        strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        return strategy
    except (tf.errors.OpError, RuntimeError, ValueError) as exc:
        log.warning("NCCL all-reduce unavailable (%s); using hierarchical copy", exc)
        return tf.distribute.MirroredStrategy(
            cross_device_ops=tf.distribute.HierarchicalCopyAllReduce()
        )
