"""Saving and loading a Keras model whose optimizer exchanges gradients through tfdist.

A routed optimizer (`tfdist.keras.optimizer.routed_class`) is saved as its Keras base
class — same `module` and `class_name` — under the registered name `NAME`, with tfdist's
settings in the config key ``decay``:

    {"module": "keras.src.optimizers.adam", "class_name": "Adam",
     "registered_name": "tfdist>DistributedOptimizer",
     "config": {...Adam's config..., "decay": {"tfdist": {"version": 1,
                "optimizer": {"module": ..., "class": ..., "registered_name": ...},
                "compression": {"name": "topk", "ratio": 0.01, ...} or None}}}}

Keras looks the registered name up first, so where tfdist's routing is imported `Loader`
rebuilds the `DistributedOptimizer`. Without tfdist the name is unknown, Keras imports
`module` and builds the plain class, whose `__init__` accepts `decay` and ignores it with
a warning ("Argument `decay` is no longer supported"): the model loads and trains with
Keras' own all-reduce. `tests/test_keras_seams.py` checks both Keras behaviours.
Error-feedback residuals and PowerSGD's Qs are not saved: they restart from zero / Q0.
"""

import importlib
import warnings

import keras
import tensorflow as tf

PACKAGE, CLASS = "tfdist", "DistributedOptimizer"
NAME = f"{PACKAGE}>{CLASS}"  # the registered name every routed class is saved under
KEY = "tfdist"
VERSION = 1
KERAS_PACKAGES = ("keras", "keras_hub", "keras_cv", "keras_nlp")  # as Keras' own lookup


def register(routed):
    """Registers the routed class `routed` under `NAME` for saving; `Loader` stays the
    class the name loads (the registry maps a name to one class)."""
    keras.saving.register_keras_serializable(PACKAGE, CLASS)(routed)
    keras.saving.get_custom_objects()[NAME] = Loader


def get_config(self):
    """`get_config` of a routed optimizer: its base class's config plus tfdist's part.

    Raises:
        ValueError: the base config already uses ``decay``, or the compression cannot be
            described by options (see `GradientCompression.get_config`).
    """
    config = super(type(self), self).get_config()
    if config.get("decay") is not None:
        raise ValueError("tfdist saves its settings in the optimizer config key 'decay', "
                         f"which {type(self).__name__} uses itself. Received: {config}")
    base = type(self).__mro__[1]
    config["decay"] = {KEY: {
        "version": VERSION,
        "optimizer": {"module": base.__module__, "class": base.__name__,
                      "registered_name": keras.saving.get_registered_name(base)},
        "compression": _compression_config(self._tfdist_pipeline)}}
    return config


def _compression_config(pipeline):
    from tfdist.compression.exchange import GradientCompression  # it imports tfdist.keras

    hooks = [h for h in pipeline.hooks if isinstance(h, GradientCompression)]
    return hooks[0].get_config() if hooks else None


class Loader:
    """What Keras finds under `NAME` when loading: rebuilds the routed optimizer."""

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """A `DistributedOptimizer` with the saved exchange around the saved optimizer,
        under the strategy in scope; the plain optimizer (with a warning) if that strategy
        cannot exchange compressed gradients.

        Raises:
            TypeError: the saved optimizer class cannot be found.
        """
        config = dict(config)
        saved = config.pop("decay")[KEY]
        base = _base_class(saved["optimizer"])
        return _route(base.from_config(config), saved["compression"])


def _base_class(identity):
    """The optimizer class saved as `identity`: registered, or a Keras class."""
    found = keras.saving.get_registered_object(identity["registered_name"])
    module = identity["module"]
    if found is None and module.split(".")[0] in KERAS_PACKAGES:
        found = getattr(importlib.import_module(module), identity["class"], None)
    if not (isinstance(found, type) and issubclass(found, keras.optimizers.Optimizer)):
        raise TypeError(f"cannot find the optimizer class {identity['registered_name']!r} "
                        f"({module}.{identity['class']}); register it with "
                        f"keras.saving.register_keras_serializable. Received: {identity}")
    return found


def _route(optimizer, compression):
    """`optimizer` routed through tfdist with `compression` (a hook config or None)."""
    from tfdist.compression.factory import build
    from tfdist.keras.distributed_optimizer import DistributedOptimizer, check_strategy
    from tfdist.keras.optimizer import with_gradient_pipeline
    from tfdist.training.hooks import GradientPipeline

    if compression is None:
        return with_gradient_pipeline(optimizer, GradientPipeline())
    hook = build(**compression)
    try:
        check_strategy(tf.distribute.get_strategy(), hook)
    except ValueError as error:
        warnings.warn(f"the model was saved with compression {compression['name']!r}, "
                      "which the strategy in scope cannot exchange; its optimizer loads as "
                      f"a plain {type(optimizer).__name__}. Load the model under the "
                      f"strategy's scope to restore the compression ({error})", stacklevel=2)
        return optimizer
    return DistributedOptimizer(optimizer, hook)


keras.saving.get_custom_objects()[NAME] = Loader  # before any routed class exists
