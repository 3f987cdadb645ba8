"""Saving and loading a Keras model whose optimizer exchanges gradients through tfdist.

A routed optimizer (`tfdist.seam.optimizer`) is saved as its Keras base class — same
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
Keras' own all-reduce. `tests/unit/seam/test_keras_seams.py` checks both Keras behaviours.
Error-feedback residuals and PowerSGD's Qs are not saved: they restart from zero / Q0.
A model whose class overrides `compile` (KerasHub's `CausalLM`) is not compiled from the
file by `keras.models.load_model` (Keras skips `compile_from_config` for it), so saving it
warns in one line (`tfdist.seam.routed.saving_check`) and `load_model` here compiles it
back: the saved exchange and the optimizer's state.
An `hvd.DistributedOptimizer`'s exchange is saved the same way, under the name
``horovod`` (`tfdist.horovod.optimizer.HorovodExchange`).
"""

import importlib
import inspect
import io
import json
import os
import warnings
import zipfile

import keras
import tensorflow as tf

from tfdist.compression.factory import build
from tfdist.keras.distributed_optimizer import DistributedOptimizer, check_strategy
from tfdist.seam.optimizer import SAVED_KEY, SAVED_NAME, is_routed, with_gradient_pipeline
from tfdist.seam.routed import compile_is_custom
from tfdist.step.hooks import GradientPipeline

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


#: Keras' warnings while loading a model that `load_model` then compiles back.
SUPERSEDED = ("`compile()` was not called as part of model loading",
              "Skipping variable loading for optimizer")


def checked_filepath(filepath):
    """Refuses in one line a `filepath` that no saved model can have (not a path or a file
    object, or one with a NUL, which Keras would print raw)."""
    if not isinstance(filepath, (str, os.PathLike, io.IOBase)) or "\0" in str(filepath):
        raise ValueError("filepath must be the path of a saved model (.keras), without NUL "
                         f"characters. Received: filepath={filepath!r:.200}")


def load_model(filepath, custom_objects=None, compile=True, safe_mode=True):  # noqa: A002
    """`keras.models.load_model`, and a model whose class overrides `compile` (KerasHub's
    `CausalLM`), which Keras does not compile from the file, compiled back as saved: its
    saved compile arguments through its own `compile`, tfdist's exchange and the
    optimizer's state (step, slots). Call it under the strategy's scope.

    Args: those of `keras.models.load_model`.

    Returns:
        The model.

    Raises:
        ValueError: `filepath` is not a `.keras` file Keras can load (Keras' errors).
    """
    checked_filepath(filepath)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.models.load_model(filepath, custom_objects=custom_objects,
                                        compile=compile, safe_mode=safe_mode)
    config = _saved_compile_config(filepath) if compile else None
    back = config is not None and compile_is_custom(type(model)) and not is_routed(
        getattr(model, "optimizer", None))
    for warning in caught:
        if not (back and str(warning.message).startswith(SUPERSEDED)):
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
    if back:
        _compile_back(model, config, filepath, custom_objects, safe_mode)
    return model


def _saved_compile_config(filepath):
    """The compile config a `.keras` file holds, if its optimizer is tfdist's; else None."""
    if not str(filepath).endswith(".keras") or not zipfile.is_zipfile(filepath):
        return None
    with zipfile.ZipFile(filepath) as archive:
        config = json.loads(archive.read("config.json")).get("compile_config")
    optimizer = (config or {}).get("optimizer")
    return config if isinstance(optimizer, dict) and optimizer.get(
        "registered_name") == SAVED_NAME else None


def _compile_back(model, config, filepath, custom_objects, safe_mode):
    """Compiles `model` through its own `compile` with the saved arguments it takes, then
    loads the optimizer's saved state (`load_weights` of the same file)."""
    arguments = keras.saving.deserialize_keras_object(config, custom_objects=custom_objects,
                                                      safe_mode=safe_mode)
    accepted = inspect.signature(model.compile).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        arguments = {k: v for k, v in arguments.items() if k in accepted}
    model.compile(**arguments)
    if model.built:
        model.optimizer.build(model.trainable_variables)
        model.load_weights(filepath)


keras.saving.get_custom_objects()[SAVED_NAME] = Loader
