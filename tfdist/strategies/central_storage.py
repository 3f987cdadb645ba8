"""CentralStorageStrategy on which Keras 3 state variables and metrics work."""

import collections
import contextlib

import tensorflow as tf
from tensorflow.python.distribute import ps_values  # the variable type this class fixes

_NONE = (None, tf.VariableAggregation.NONE)


class CentralStorageStrategy(tf.distribute.experimental.CentralStorageStrategy):
    """`CentralStorageStrategy` fixed for the two ways Keras 3 updates its state.

    Central storage keeps each variable once, on the parameter device, wrapped in an
    `AggregatingVariable` that aggregates writes made in replica context.

    1. Keras 3 creates non-trainable state (BatchNormalization moving statistics, the
       seed of Dropout and other random layers) with aggregation "none", and updating it
       fails: "You must specify an aggregation method to update a AggregatingVariable in
       Replica Context". Here such variables get aggregation MEAN (floating point: the
       moving statistics become the mean over replicas) or ONLY_FIRST_REPLICA (integers,
       such as seed counters that every replica advances alike).
    2. Keras 3 implements `assign_add` as ``assign(value + delta)``, and an
       AggregatingVariable with SUM aggregation sums the *assigned values*, so every
       metric total (``loss``, accuracy...) comes out wrong (n * old + sum of deltas).
       Here SUM variables turn a replica-context `assign` back into the increment it is.

    Both fixes act only inside this strategy's `scope()`, through a variable creator;
    trainable variables and explicit aggregations are untouched. `keras_fixes` counts
    the variables changed, so a test notices if Keras stops needing them.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keras_fixes = collections.Counter()

    @contextlib.contextmanager
    def scope(self):
        with super().scope(), tf.variable_creator_scope(self._fix_keras_state):
            yield

    def _fix_keras_state(self, next_creator, **kwargs):
        if not kwargs.get("trainable", True) and kwargs.get("aggregation") in _NONE:
            dtype = kwargs.get("dtype") or getattr(kwargs.get("initial_value"), "dtype", None)
            floating = dtype is None or tf.as_dtype(dtype).is_floating
            kwargs["aggregation"] = (tf.VariableAggregation.MEAN if floating
                                     else tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self.keras_fixes[f"state_{kwargs['aggregation'].name.lower()}"] += 1
        variable = next_creator(**kwargs)
        if (isinstance(variable, ps_values.AggregatingVariable)
                and variable.aggregation == tf.VariableAggregation.SUM):
            self.keras_fixes["sum_assign"] += 1
            return SumOfIncrementsVariable(self, variable._v, variable.aggregation)
        return variable


class SumOfIncrementsVariable(ps_values.AggregatingVariable):
    """A SUM `AggregatingVariable` whose replica-context `assign` adds the increments.

    Each replica assigns ``old + delta_i``; the result is ``old + sum(delta_i)``, which is
    what Keras' ``assign_add(delta_i)`` means.
    """

    def assign(self, value, use_locking=False, name=None, read_value=True):
        if tf.distribute.in_cross_replica_context():
            return super().assign(value, use_locking=use_locking, name=name,
                                  read_value=read_value)
        increment = tf.convert_to_tensor(value, self.dtype) - self.read_value()
        return super().assign_add(increment, use_locking=use_locking, name=name,
                                  read_value=read_value)
