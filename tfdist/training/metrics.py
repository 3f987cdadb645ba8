"""Keras metrics updated from functions a `ClusterCoordinator` schedules on the workers.

Under ParameterServerStrategy, a metric's variables live on a parameter server and every
worker updates them concurrently. Keras 3 implements `assign_add` as `assign(read + delta)`,
so concurrent updates overwrite each other: measured, a metric updated from 300 scheduled
functions counted 191. `update_metric` applies the same update as one atomic `assign_add`
of its increment per variable. `tfdist.Trainer` uses it; a hand-written coordinator loop
(TensorFlow's parameter-server tutorial) calls it instead of `metric.update_state`.
"""

import tensorflow as tf

from tfdist.core.variables import underlying


def update_metric(metric, *args, **kwargs):
    """`metric.update_state(*args, **kwargs)`, safe under concurrent workers.

    The increment is the metric's update applied to a zero state, added to each state
    variable atomically: exact for metrics whose state is sums and counts (every Keras
    streaming metric: Mean, Sum, accuracies, confusion-matrix counts, AUC's buckets).
    Call it where you would call `update_state`: inside the function given to
    `coordinator.schedule` (or anywhere else; it is also correct without concurrency).

    Args:
        metric: a built Keras 3 metric, created under the strategy's scope.
        *args, **kwargs: what `metric.update_state` takes (y_true, y_pred, sample_weight).
    """
    zeros = [tf.zeros(v.shape, v.dtype) for v in metric.variables]
    increments = metric.stateless_update_state(zeros, *args, **kwargs)
    for variable, increment in zip(metric.variables, increments):
        underlying(variable).assign_add(increment)
