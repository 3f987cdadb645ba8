"""MirroredStrategy whose replicas keep one copy of Keras 3 state."""

import tensorflow as tf

from tfdist.strategies.keras_state import AggregatedKerasState


class MirroredStrategy(AggregatedKerasState, tf.distribute.MirroredStrategy):
    """`tf.distribute.MirroredStrategy` with Keras 3 state aggregated across replicas.

    `model.fit` works on the plain strategy, but BatchNormalization moving statistics
    (aggregation "none") drift apart between replicas; here they are the mean over
    replicas, as in tf.keras 2. See `AggregatedKerasState`.
    """
