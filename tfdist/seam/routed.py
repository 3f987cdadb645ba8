"""A routed optimizer class (`tfdist.seam.optimizer.routed_class`): its Keras base, and
how it is saved — as that base class, under a registered name, with tfdist's part in the
config key Keras' optimizers accept and ignore (`tfdist.keras.saving` loads it back)."""

import sys
import warnings

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


def saving_check(optimizer, depth=24):
    """Warns, in one line, where `optimizer` is being saved by a model whose class
    overrides `compile` but not `compile_from_config` (KerasHub's `CausalLM`, a custom
    `compile`): `keras.models.load_model` skips compiling such a model from the file, so
    the optimizer it gets back is the one its own `compile` makes, without tfdist's
    exchange or this optimizer's state. Looks `depth` frames up for Keras'
    `get_compile_config`; anything else says nothing."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return
        model = frame.f_locals.get("self")
        if frame.f_code.co_name == "get_compile_config" and isinstance(model, keras.Model):
            if compile_is_custom(type(model)):
                saved = optimizer._tfdist_pipeline.saved_config() or {"name": "Keras' own"}
                warnings.warn(
                    f"{type(model).__name__} overrides compile(), so keras.models.load_model "
                    f"will not compile it from this file: tfdist's exchange "
                    f"({saved.get('name')!r}) and the optimizer's state (its step and slots) "
                    "are dropped for the optimizer its compile() makes; load it with "
                    "tfdist.keras.load_model(path) under the strategy's scope, which compiles "
                    f"it back with both. Received: model={type(model).__name__}", stacklevel=2)
            return
        frame = frame.f_back


def compile_is_custom(model_class):
    """Whether Keras' `compile_from_config` skips compiling `model_class` from a file (its
    own test: `compile` overridden), and the class did not take that over."""
    from keras.src.trainers.trainer import Trainer  # Keras' own test names it

    return (model_class.compile is not Trainer.compile
            and model_class.compile_from_config is Trainer.compile_from_config)
