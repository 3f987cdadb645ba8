"""Which row of the capability table a strategy instance is."""

import tensorflow as tf

from tfdist.capabilities import CAPABILITIES

# Most specific first; tfdist's classes subclass these, so they match too.
_CLASSES = (
    ("multi_worker_mirrored", tf.distribute.MultiWorkerMirroredStrategy),
    ("mirrored", tf.distribute.MirroredStrategy),
    ("central_storage", tf.distribute.experimental.CentralStorageStrategy),
    ("parameter_server", tf.distribute.ParameterServerStrategy),
    ("one_device", tf.distribute.OneDeviceStrategy),
)


def strategy_name(strategy=None):
    """The config name of `strategy` (by default the one in scope).

    TF's classes and tfdist's subclasses alike; any other strategy (TF's default
    strategy, or one tfdist does not know) is "default": no exchange to compress, no
    local SGD.
    """
    strategy = strategy or tf.distribute.get_strategy()
    return next((name for name, cls in _CLASSES if isinstance(strategy, cls)), "default")


def capabilities_of(strategy=None):
    """The `Capabilities` of a strategy instance (by default the one in scope)."""
    return CAPABILITIES[strategy_name(strategy)]
