"""Keras metrics updated from functions a `ClusterCoordinator` schedules on the workers,
and read across replicas with one all-reduce.

Under ParameterServerStrategy, a metric's variables live on a parameter server and every
worker updates them concurrently. Keras 3 implements `assign_add` as `assign(read + delta)`,
so concurrent updates overwrite each other: measured, a metric updated from 300 scheduled
functions counted 191. `update_metric` applies the same update as one atomic `assign_add`
of its increment per variable. `tfdist.Trainer` uses it; a hand-written coordinator loop
(TensorFlow's parameter-server tutorial) calls it instead of `metric.update_state`.
"""

import tensorflow as tf

from tfdist.step.variables import underlying


def update_metric(metric, *args, **kwargs):
    """`metric.update_state(*args, **kwargs)`, safe under concurrent workers.

    The increment is the metric's update applied to a zero state, added to each state
    variable atomically: exact for metrics whose state is sums and counts (every Keras
    streaming metric: Mean, Sum, accuracies, confusion-matrix counts, AUC's buckets).
    Call it where you would call `update_state`: inside the function given to
    `coordinator.schedule` (or anywhere else; it is also correct without concurrency).

    Args:
        metric: a built Keras 3 metric, created under the strategy's scope.
        *args: what `metric.update_state` takes (y_true, y_pred, sample_weight).
        **kwargs: the same, by name.
    """
    zeros = [tf.zeros(v.shape, v.dtype) for v in metric.variables]
    increments = metric.stateless_update_state(zeros, *args, **kwargs)
    for variable, increment in zip(metric.variables, increments):
        underlying(variable).assign_add(increment)


def can_read_at_once(metrics):
    """Whether `read_at_once` can read `metrics`: their states aggregate by sum or mean."""
    return all(getattr(v, "aggregation", None) in ("sum", "mean")
               for m in metrics for v in m.variables)


def read_at_once(metrics, across=True):
    """{name: result} of `metrics` over every replica, read in replica context with one
    all-reduce of all their states (the same on every replica); with `across` False, this
    replica's own, with no collective (islands between synchronisations).

    A metric's state lives on each replica (Keras' on-read variables); reading its result
    in cross-replica context all-reduces each state variable on its own: 5 collectives a
    step for a loss, a mean IoU and a pixel accuracy, against plain tf.distribute's one.
    """
    states = [v for m in metrics for v in m.variables]
    if not states:
        return {}
    local = [tf.convert_to_tensor(v.value) for v in states]
    flat = tf.concat([tf.reshape(tf.cast(x, tf.float64), [-1]) for x in local], 0)
    context = tf.distribute.get_replica_context()
    summed = context.all_reduce(tf.distribute.ReduceOp.SUM, flat) if across else flat
    sizes = [x.shape.num_elements() for x in local]
    values, results = [], {}
    for part, x, v in zip(tf.split(summed, sizes), local, states):
        if v.aggregation == "mean" and across:
            part = part / context.num_replicas_in_sync
        values.append(tf.cast(tf.reshape(part, tf.shape(x)), x.dtype))
    for m in metrics:
        count = len(m.variables)
        results[m.name], values = m.stateless_result(values[:count]), values[count:]
    return results
