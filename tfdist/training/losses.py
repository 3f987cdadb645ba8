"""What `tfdist.Trainer` takes as its loss and metrics: a Keras loss, its name or a
function; Keras metrics, their names or functions ("accuracy" as `model.compile` reads
it), each made under the strategy's scope."""

import keras
import tensorflow as tf

from tfdist.step.variables import underlying


class FunctionLoss(keras.losses.Loss):
    """A loss function ``fn(y_true, y_pred) -> per-example values`` as a Keras Loss."""

    def __init__(self, fn):
        name = getattr(fn, "__name__", "")
        super().__init__(name=name if name.isidentifier() else "loss")  # not "<lambda>"
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)


def as_loss(loss):
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        return loss
    if callable(loss):
        return FunctionLoss(loss)
    raise ValueError(f"expected a Keras loss, its name, or a function. Received: loss={loss!r}")


def in_scope(metric, strategy):
    """`metric`, or, if its state was created outside `strategy`'s scope, a new one from its
    config made in it (under the caller's scope): with several replicas or workers, a metric
    created outside lives on one device of one worker, so its replicas race on it and
    each worker logs its own share."""
    if all(strategy.extended.variable_created_in_scope(underlying(v)) for v in metric.variables):
        return metric
    try:
        return type(metric).from_config(metric.get_config())
    except Exception as e:  # noqa: BLE001 - any failure means the same to the user
        raise ValueError(
            f"the metric {metric.name!r} was created outside the strategy's scope and cannot "
            "be re-created from its config; create it under strategy.scope(). "
            f"Received: {metric!r} ({e})") from e


#: What `model.compile` makes of "accuracy" for each loss (its labels' kind).
_ACCURACIES = ((keras.losses.SparseCategoricalCrossentropy, keras.metrics.SparseCategoricalAccuracy),
               (keras.losses.CategoricalCrossentropy, keras.metrics.CategoricalAccuracy),
               (keras.losses.BinaryCrossentropy, keras.metrics.BinaryAccuracy),
               (keras.losses.BinaryFocalCrossentropy, keras.metrics.BinaryAccuracy))


def accuracy(name, loss, model):
    """The accuracy `model.compile(metrics=[name])` would use: binary for one output unit,
    else the one the loss's labels call for (sparse for integer labels, categorical for
    one-hot).

    Raises:
        ValueError: a loss of your own, which does not say what its labels are.
    """
    units = [output.shape[-1] for output in tf.nest.flatten(getattr(model, "outputs", None) or [])]
    if units and all(u == 1 for u in units):
        return keras.metrics.BinaryAccuracy(name=name)
    for kind, metric in _ACCURACIES:
        if isinstance(loss, kind):
            return metric(name=name)
    raise ValueError(
        f"metrics=[{name!r}] needs labels tfdist.Trainer can tell from the loss (compile "
        "looks at the data): with a loss of your own, name the metric, "
        "keras.metrics.SparseCategoricalAccuracy() for integer labels or "
        f"CategoricalAccuracy() for one-hot ones. Received: loss={loss.name!r}")


def as_metric(metric, loss=None, model=None):
    if isinstance(metric, str) and metric.lower() in ("accuracy", "acc"):
        return accuracy(metric, loss, model)
    if isinstance(metric, str):
        name, metric = metric, keras.metrics.get(metric)
        if isinstance(metric, keras.metrics.Metric) and metric.name != name:
            metric = type(metric).from_config({**metric.get_config(), "name": name})
    if isinstance(metric, keras.metrics.Metric):
        return metric
    if callable(metric):
        return keras.metrics.MeanMetricWrapper(metric, name=getattr(metric, "__name__", "metric"))
    raise ValueError(f"expected a Keras metric or its name. Received: metric={metric!r}")


def weighed_by(committed, y_pred, sample_weight):
    """(the loss's weight, the metrics' sample weights) that count nothing when the step
    did not commit: weights of 0 rather than a `tf.cond` around the updates (metric
    variables that aggregate, as under central storage, cannot be written in a cond in
    replica context)."""
    keep = tf.cast(committed, tf.float32)
    if sample_weight is None:
        sample_weight = tf.ones(tf.shape(tf.nest.flatten(y_pred)[0])[:1])
    return keep, sample_weight * tf.cast(keep, sample_weight.dtype)


def update_state(metric, *args):
    metric.update_state(*args)
