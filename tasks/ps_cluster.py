"""An in-process parameter-server cluster (ps and worker servers in this process)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import tensorflow as tf


@contextmanager
def in_process_cluster(workers: int, ps: int = 1) -> Iterator[object]:
    """Starts `workers` worker and `ps` ps servers on free localhost ports; yields a resolver.

    TensorFlow's own helper sizes each server's inter-op pool to workers + 1 threads;
    with fewer (the default on a 2-core host) the cluster deadlocks.
    """
    from tensorflow.python.distribute import multi_worker_test_base

    spec = multi_worker_test_base.create_in_process_cluster(num_workers=workers, num_ps=ps)
    yield tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), rpc_layer="grpc"
    )
