"""The Keras behaviour tfdist's optimizer seam relies on, checked on the real optimizer
class before it is routed (`tfdist.seam.optimizer.routed_class`)."""

import threading

import keras
import numpy as np
import tensorflow as tf

from tfdist.step.variables import underlying
from tfdist.versions import KERAS_CHECKED, KERAS_FIX, UnsupportedVersionError

_SEAM_CHECKED = set()  # optimizer classes whose behaviour check_seam saw


def refuse(finding):
    raise UnsupportedVersionError(
        f"Keras {keras.__version__} cannot run tfdist's optimizer seam: {finding} "
        f"(tfdist/seam/optimizer.py; checked on Keras {', '.join(KERAS_CHECKED)}); "
        f"{KERAS_FIX}")


def check_seam(base, config=None):
    """Checks, on optimizer class `base` built from `config` (None: by Keras' base class
    alone, which needs neither a user's schedule nor their constructor's arguments), the
    Keras behaviour the routed class relies on: every layer variable is a `keras.Variable`
    wrapping a `tf.Variable` (`underlying`), and `apply` itself counts the step once,
    after `_backend_apply_gradients` (Keras ≤ 3.9 counted it inside that method, which the
    routed class replaces: `iterations` would never advance). Runs once per class, eagerly,
    in a thread of its own (no strategy there), on a one-element variable.

    Raises:
        UnsupportedVersionError: the behaviour differs; the message names the Keras floor.
    """
    if base in _SEAM_CHECKED:
        return
    found = {}

    def probe():
        try:
            found["finding"] = _seam_finding(base, config)
        except Exception as error:  # noqa: BLE001 (reported in the calling thread)
            found["error"] = error

    thread = threading.Thread(target=probe, name="tfdist-keras-seam-check")
    thread.start()
    thread.join()
    if "error" in found:
        raise found["error"]
    if found["finding"]:
        refuse(found["finding"])
    _SEAM_CHECKED.add(base)


def _seam_finding(base, config):
    """What `check_seam` found wrong, or None."""
    layer = keras.layers.Dense(1)
    layer.build((None, 1))
    if not isinstance(layer.kernel, keras.Variable) or not isinstance(
            underlying(layer.kernel), tf.Variable):
        return (f"a layer's variable is a {type(layer.kernel).__name__}, not a keras.Variable "
                "wrapping a tf.Variable")
    counted = type(base.__name__, (base,), {"_backend_apply_gradients": lambda *_: None})
    if config is None:  # Keras' base __init__ and build: `apply` is the class's own
        counted.build = keras.optimizers.Optimizer.build
        optimizer = counted.__new__(counted)
        keras.optimizers.Optimizer.__init__(optimizer, learning_rate=0.01)
    else:
        optimizer = counted.from_config(dict(config, gradient_accumulation_steps=None))
    variable = keras.Variable(np.zeros(1, np.float32))
    optimizer.build([variable])
    before = int(optimizer.iterations.numpy())
    optimizer.apply([tf.zeros(1)], [variable])
    steps = int(optimizer.iterations.numpy()) - before
    if steps != 1:
        return (f"its optimizer's apply counted {steps} steps, not 1, around "
                "_backend_apply_gradients, which tfdist replaces (Keras 3.9 and older count "
                "the step inside it, so training would never advance the step)")
    return None
