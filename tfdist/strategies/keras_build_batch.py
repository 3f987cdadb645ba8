"""Keras' look at the first batch, answered from this replica without a collective."""

import collections
import sys

import tensorflow as tf

KERAS_TRAINER = "keras.src.backend.tensorflow.trainer"


class LocalBuildBatch:
    """Strategy mixin: Keras 3's `_maybe_symbolic_build` gets this replica's first batch.

    Keras 3's TensorFlow trainer (3.10-3.15 at least) starts every `fit` and `evaluate`
    under a strategy by reducing the whole first batch across all replicas
    (``strategy.reduce("MEAN", batch, axis=None)``), only to read its shapes and dtypes
    and build the model from them. That costs one batch across the network per call,
    and where the global batch does not split evenly between replicas (32 on 3 workers:
    11, 11, 10 rows) the reduction fails before the first step ("Inputs to operation AddN
    must have the same size and shape", or with several workers "Shape mismatch in the
    collective instance").

    When the caller is that Keras function, `reduce` returns this worker's first
    replica's batch instead: the same feature shapes and dtypes, no communication, any
    split. Every other call is the strategy's own. `keras_fixes["local_build_batch"]`
    counts the calls answered, so a test notices when Keras stops making them.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not hasattr(self, "keras_fixes"):
            self.keras_fixes = collections.Counter()

    def reduce(self, reduce_op, value, axis=None):
        if called_from_keras_trainer("_maybe_symbolic_build", depth=3):
            self.keras_fixes["local_build_batch"] += 1
            return tf.nest.map_structure(self._first_local, value)
        return super().reduce(reduce_op, value, axis)

    def _first_local(self, value):
        if isinstance(value, tf.distribute.DistributedValues):
            return self.experimental_local_results(value)[0]
        return value


def called_from_keras_trainer(function=None, depth=4):
    """True if Keras' TensorFlow trainer module (its `function`, if given) is among the
    `depth` callers of the strategy method calling this one: the seam by which tfdist's
    strategies tell Keras' calls from a user's (subclasses wrapping the method add
    frames). tests/unit/seam/test_keras_seams.py checks that each use still sees Keras."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if (frame.f_globals.get("__name__", "").startswith(KERAS_TRAINER)
                and function in (None, frame.f_code.co_name)):
            return True
        frame = frame.f_back
    return False


#: Keras' entry points that distribute a dataset.
KERAS_ENTRY_POINTS = ("fit", "evaluate", "predict")


def keras_entry_point(depth=8):
    """The Keras 3 trainer method (`fit`, `evaluate` or `predict`) among the `depth`
    callers of the strategy method calling this one, or None (tests/unit/seam/test_keras_seams.py
    checks that each is still found)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        if (frame.f_globals.get("__name__", "").startswith(KERAS_TRAINER)
                and frame.f_code.co_name in KERAS_ENTRY_POINTS):
            return frame.f_code.co_name
        frame = frame.f_back
    return None
