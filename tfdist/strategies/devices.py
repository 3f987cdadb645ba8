"""Local devices: splitting the CPU into logical devices for multi-replica training."""

import tensorflow as tf

from tfdist.config.checks import check_arguments
from tfdist.config.sections.strategy import STRATEGY_OPTIONS
from tfdist.strategies.errors import StrategyError


def ensure_logical_cpus(count):
    """Makes the first physical CPU appear as `count` logical devices /cpu:0 .. /cpu:N-1.

    Must run before TensorFlow initialises its devices (before the first tensor op);
    calling it again with the same count is a no-op.

    Returns:
        The names of the logical CPU devices.

    Raises:
        ConfigError: `count` is not an integer from 1 to `limits.MAX_LOGICAL_CPUS`.
        StrategyError: TensorFlow already initialised a different number of CPUs.
    """
    count = check_arguments("ensure_logical_cpus", STRATEGY_OPTIONS["mirrored"],
                            logical_cpus=count)["logical_cpus"]
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured is None or len(configured) != count:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
        except RuntimeError:
            have = len(tf.config.list_logical_devices("CPU"))
            if have != count:
                raise StrategyError(
                    f"logical_cpus={count} must be set before TensorFlow initialises its "
                    f"devices, but it already runs with {have} CPU device(s); create the "
                    "strategy first, before any other TensorFlow operation") from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def default_compute_devices():
    """All GPUs, else all logical CPUs."""
    gpus = tf.config.list_logical_devices("GPU")
    return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
