"""MultiWorkerMirroredStrategy on which Keras 3 `fit`, `evaluate` and `predict` work."""

import collections

import tensorflow as tf


class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """`tf.distribute.MultiWorkerMirroredStrategy` on which Keras 3 trains.

    Keras 3 (keras #20585, tensorflow #72388) fails before the first step with two or
    more workers, through two calls to `Strategy.reduce`:

    - `TensorFlowTrainer._maybe_symbolic_build` reduces a *nested* batch
      (``reduce("MEAN", (x, y), axis=None)``), which TF's `reduce` does not accept;
    - `reduce_per_replica` reduces scalar metrics with ``axis=0``, a dimension a scalar
      does not have.

    Here `reduce` maps over nested structures leaf by leaf, and treats ``axis=0`` on
    scalars as a reduction over replicas only (``axis=None``), the only meaning it can
    have. Every other call is TF's own. `keras_fixes` counts each fix applied, so a test
    notices if Keras stops making these calls.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keras_fixes = collections.Counter()

    def reduce(self, reduce_op, value, axis):
        if tf.nest.is_nested(value):
            self.keras_fixes["nested"] += 1
            return tf.nest.map_structure(lambda v: self.reduce(reduce_op, v, axis), value)
        if axis == 0 and _rank(self, value) == 0:
            self.keras_fixes["scalar_axis"] += 1
            axis = None
        return super().reduce(reduce_op, value, axis)


def _rank(strategy, value):
    """The rank of one replica's component of `value`, or None if unknown."""
    local = strategy.experimental_local_results(value)
    shape = getattr(local[0], "shape", None) if local else None
    return shape.rank if shape is not None else None
