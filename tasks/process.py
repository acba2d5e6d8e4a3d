"""Process-wide state, set in one place.

TensorFlow, Keras and Prefect keep state per process: the C++ log level and Prefect's
telemetry switch (read when they are imported), log levels, GPU memory growth and logical
CPU devices (fixed once TensorFlow starts), and Keras's global dtype policy. Each is set
here and nowhere else:

- `set_up_process()` once at each process entry (the `tfscale` command, a deployment's
  flow run, the test session), before TensorFlow or Prefect is imported; worker
  processes inherit its environment from the command that launches them;
- `set_up_devices(choice.logical_cpus)` once the strategy is chosen, before TensorFlow
  starts;
- `use_precision(policy)` before a training run builds its model (a sweep changes it
  between cells).
"""

from __future__ import annotations

import logging
import os

QUIET_ENVIRONMENT = {
    "TF_CPP_MIN_LOG_LEVEL": "2",  # TensorFlow's C++ notices
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no network here for telemetry
}
NOISY_LOGGERS = ("tensorflow", "absl", "httpx")


def set_up_process() -> None:
    """Environment defaults (a value the user set wins) and log levels."""
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def set_up_devices(logical_cpus: int = 0) -> None:
    """GPU memory growth, and the logical CPU devices a multi-replica CPU run needs
    (`StrategyChoice.logical_cpus`)."""
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # TensorFlow already started: it keeps what it had
            pass
    if logical_cpus > 1:
        split_cpu(logical_cpus)


def split_cpu(n: int) -> list[str]:
    """Splits the CPU into `n` logical devices (before TensorFlow starts); their names.

    Raises:
        UserError: TensorFlow already started with fewer devices.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    have = tf.config.get_logical_device_configuration(cpu) or []
    if len(have) < n:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * n
            )
        except RuntimeError:
            pass
    return logical_cpus(n)


def logical_cpus(n: int) -> list[str]:
    """The names of the first `n` logical CPU devices.

    Raises:
        UserError: fewer exist (they are set up before TensorFlow starts).
    """
    import tensorflow as tf

    from tasks.errors import UserError

    devices = tf.config.list_logical_devices("CPU")
    if len(devices) < n:
        raise UserError(
            f"Expected {n} logical CPU devices for {n} replicas, but TensorFlow was "
            f"already initialised with {len(devices)}",
            "start a fresh process (as 'tfscale train' does).",
        )
    return [d.name for d in devices[:n]]


def use_precision(policy: str) -> None:
    """Keras's global dtype policy for the run about to build its model."""
    import keras

    keras.mixed_precision.set_global_policy(policy)
