"""A routed optimizer class (`tfdist.core.optimizer.routed_class`): its Keras base, and
how it is saved — as that base class, under a registered name, with tfdist's part in the
config key Keras' optimizers accept and ignore (`tfdist.keras.saving` loads it back)."""

import keras

SAVED_PACKAGE, SAVED_CLASS = "tfdist", "DistributedOptimizer"
SAVED_NAME = f"{SAVED_PACKAGE}>{SAVED_CLASS}"  # the registered name of every routed class
SAVED_KEY, SAVED_VERSION = "tfdist", 1


def keras_base(optimizer):
    """The Keras class a routed optimizer's class derives from."""
    return type(optimizer).__mro__[1]


def register(routed):
    """Registers `routed` for saving under `SAVED_NAME`, keeping whatever loads that name
    (`tfdist.keras.saving.Loader`): the registry maps one name to one class."""
    objects = keras.saving.get_custom_objects()
    loader = objects.get(SAVED_NAME)
    keras.saving.register_keras_serializable(SAVED_PACKAGE, SAVED_CLASS)(routed)
    if loader is not None:
        objects[SAVED_NAME] = loader


def get_config(self):
    """The base class's config plus tfdist's part under `SAVED_KEY` of ``decay`` (a key
    Keras' optimizers accept and ignore, so a process without tfdist still loads it).

    Raises:
        ValueError: the base config already uses ``decay``, or the exchange cannot be
            described by options (see `GradientCompression.get_config`).
    """
    config = keras_base(self).get_config(self)
    if config.get("decay") is not None:
        raise ValueError("tfdist saves its settings in the optimizer config key 'decay', "
                         f"which {type(self).__name__} uses itself. Received: {config}")
    base = keras_base(self)
    config["decay"] = {SAVED_KEY: {
        "version": SAVED_VERSION,
        "optimizer": {"module": base.__module__, "class": base.__name__,
                      "registered_name": keras.saving.get_registered_name(base)},
        "compression": self._tfdist_pipeline.saved_config()}}
    return config
