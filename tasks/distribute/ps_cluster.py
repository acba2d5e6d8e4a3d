"""An in-process parameter-server cluster: ps and worker servers in this process, built from
public `tf.distribute.Server`s on free localhost ports."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import tensorflow as tf

from tfscale.tasks.core.network import free_ports


@contextmanager
def in_process_cluster(workers: int, ps: int = 1) -> Iterator[object]:
    """Starts `workers` worker and `ps` ps servers; yields a resolver for the coordinator.

    Each server's inter-op pool gets workers + 1 threads: with fewer (the default on a
    2-core host) the workers' steps and the coordinator's closures deadlock. TensorFlow
    servers cannot be stopped; they end with the process.
    """
    ports = iter(free_ports(workers + ps))
    spec = {
        "worker": [f"localhost:{next(ports)}" for _ in range(workers)],
        "ps": [f"localhost:{next(ports)}" for _ in range(ps)],
    }
    cluster = tf.train.ClusterSpec(spec)
    configs = {"worker": tf.compat.v1.ConfigProto(), "ps": tf.compat.v1.ConfigProto()}
    configs["worker"].inter_op_parallelism_threads = workers + 1
    configs["ps"].device_count["GPU"] = 0  # variables live on the ps tasks' CPUs
    servers = [
        tf.distribute.Server(
            cluster, job_name=job, task_index=index, protocol="grpc", config=configs[job]
        )
        for job, addresses in spec.items()
        for index in range(len(addresses))
    ]
    yield tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    del servers  # kept alive while the cluster is in use (a collected server stops)
