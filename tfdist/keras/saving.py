"""Saving and loading a Keras model whose optimizer exchanges gradients through tfdist.

A routed optimizer (`tfdist.core.optimizer`) is saved as its Keras base class — same
`module` and `class_name` — under the registered name `SAVED_NAME`, with tfdist's
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
An `hvd.DistributedOptimizer`'s exchange is saved the same way, under the name
``horovod`` (`tfdist.horovod.optimizer.HorovodExchange`).
"""

import importlib
import warnings

import keras
import tensorflow as tf

from tfdist.compression.factory import build
from tfdist.core.hooks import GradientPipeline
from tfdist.core.optimizer import SAVED_KEY, SAVED_NAME, with_gradient_pipeline
from tfdist.keras.distributed_optimizer import DistributedOptimizer, check_strategy

KERAS_PACKAGES = ("keras", "keras_hub", "keras_cv", "keras_nlp")  # as Keras' own lookup
#: Saved exchanges of packages above this one, by name: config -> the pipeline's hooks
#: (`tfdist.horovod.optimizer` registers "horovod" when imported).
SAVED_EXCHANGES = {}


class Loader:
    """What Keras finds under `SAVED_NAME` when loading: rebuilds the routed optimizer."""

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """A `DistributedOptimizer` with the saved exchange around the saved optimizer,
        under the strategy in scope; the plain optimizer (with a warning) if that strategy
        cannot exchange compressed gradients.

        Raises:
            TypeError: the saved optimizer class cannot be found.
        """
        config = dict(config)
        saved = config.pop("decay")[SAVED_KEY]
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
    if compression is None:
        return with_gradient_pipeline(optimizer, GradientPipeline())
    if isinstance(compression, dict) and compression.get("name") in SAVED_EXCHANGES:
        return with_gradient_pipeline(
            optimizer, GradientPipeline(SAVED_EXCHANGES[compression["name"]](compression)))
    if isinstance(compression, dict) and str(compression.get("name")).startswith("horovod"):
        warnings.warn("the model was saved with hvd.DistributedOptimizer; its optimizer loads "
                      f"as a plain {type(optimizer).__name__}. Import tfdist.horovod before "
                      "loading (or load with hvd.load_model) to restore the exchange",
                      stacklevel=2)
        return optimizer
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


keras.saving.get_custom_objects()[SAVED_NAME] = Loader
