"""CentralStorageStrategy on which Keras 3 state variables and metrics work."""

import tensorflow as tf
from tensorflow.python.distribute import ps_values  # the variable type this class fixes

from tfdist.strategies.batch_rows import WeighsTrainSteps
from tfdist.strategies.input_pipelines import StallFreeInput
from tfdist.strategies.keras_step_options import SupportedStepOptions
from tfdist.strategies.keras_state import AggregatedKerasState


class CentralStorageStrategy(SupportedStepOptions, WeighsTrainSteps, StallFreeInput,
                             AggregatedKerasState,
                             tf.distribute.experimental.CentralStorageStrategy):
    """`CentralStorageStrategy` fixed for the two ways Keras 3 updates its state.

    Central storage keeps each variable once, on the parameter device, wrapped in an
    `AggregatingVariable` that aggregates writes made in replica context.

    1. Keras 3 state created with aggregation "none" (BatchNormalization, Dropout)
       cannot be written at all; see `AggregatedKerasState`.
    2. Keras 3 implements `assign_add` as ``assign(value + delta)``, and an
       AggregatingVariable with SUM aggregation sums the *assigned values*, so every
       metric total (``loss``, accuracy...) comes out wrong (n * old + sum of deltas).
       Here SUM variables turn a replica-context `assign` back into the increment it is.

    Its datasets' iterators end without a pause (`StallFreeInput`).
    """

    def _after_create(self, variable):
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
