"""The rows of the global batch each replica holds in a step, whatever the split.

TensorFlow splits a global batch the replicas do not divide unevenly (16 over 3: 6/6/4),
and Keras' `fit` averages each replica's own mean (its loss is scaled by 1/replicas), so
the examples of a smaller share weigh more. tfdist's strategies weigh the training step
Keras' trainer (and `tfdist.Trainer`) runs on each replica (`weighing`): the gradient
exchange (`tfdist.step.hooks.GradientPipeline`) multiplies each replica's gradient by its
rows times the replicas over all rows, so the step is the average over the global batch,
as on one device; local SGD's synchronisations weigh each replica's weights by the rows
it trained since the last one (`rows`) likewise. Your own loop scales its loss itself
(`tf.nn.compute_average_loss(..., global_batch_size=...)` is already exact): nothing is
weighed there.

`replica_batch_size` is the input side: a dataset function's share of a global batch that
the replicas need not divide (an elastic job keeps its global batch at every size).
"""

import contextlib
import numbers
import threading

import tensorflow as tf

_state = threading.local()  # MirroredStrategy traces each replica in a thread of its own


@contextlib.contextmanager
def weighing(data):
    """(replica context) Inside, `weight()` is this replica's weight in the step traced:
    its rows of `data` times the replicas over all replicas' rows (1.0 where every
    replica holds as many)."""
    stack = _stack()
    stack.append(_Share(leading_rows(data)))
    try:
        yield
    finally:
        stack.pop()


def weight():
    """(replica context) This replica's weight in the step being traced (`weighing`), a
    float32 scalar, or None on one replica, outside `weighing` or for data without rows.
    The rows' sum is all-reduced on the first call of a step (a local step of local SGD
    makes none); its input is known from the step's start, so it runs beside the forward
    and backward passes (collectives are ordered among themselves only)."""
    stack = _stack()
    return stack[-1].weight() if stack else None


def rows():
    """(replica context) This replica's rows in the step being traced (`weighing`), a
    float32 scalar, or None outside `weighing` or for data without rows: what a local step
    of local SGD counts, so that a synchronisation weighs each replica by the rows it
    trained (`tfdist.local_sgd.synchroniser`)."""
    stack = _stack()
    if not stack or stack[-1].rows is None:
        return None
    return tf.cast(stack[-1].rows, tf.float32)


class _Share:
    def __init__(self, rows):
        self.rows, self._weight = rows, None

    def weight(self):
        context = tf.distribute.get_replica_context()
        if self.rows is None or context is None or context.num_replicas_in_sync == 1:
            return None
        if self._weight is None:
            rows = tf.cast(self.rows, tf.float32)
            total = context.all_reduce(tf.distribute.ReduceOp.SUM, rows)
            self._weight = rows * context.num_replicas_in_sync / tf.maximum(total, 1.0)
        return self._weight


def leading_rows(data):
    """The rows of a batch (x, (x, y), (x, y, sample_weight), dicts...): the leading
    dimension of its first tensor of rank 1 or more, as Keras' trainer counts them for its
    loss tracker; None if it has none."""
    for leaf in tf.nest.flatten(data):
        if isinstance(leaf, (tf.Tensor, tf.Variable)) and leaf.shape.rank:
            return tf.shape(leaf, out_type=tf.int32)[0]
    return None


def replica_batch_size(context, global_batch_size):
    """The batch size of each replica fed by the input pipeline of `context`, such that the
    replicas' batches add up to `global_batch_size` whether or not they divide it: where
    they do not, pipeline i of P (one replica each, as under MultiWorkerMirroredStrategy)
    takes one row more than the others for i < global_batch_size % P (16 over 3: 6, 5, 5).
    tfdist weighs each replica's gradient by its rows, so the step is the global batch's
    average (`tfdist.strategies.batch_rows`). TensorFlow's
    `InputContext.get_per_replica_batch_size` refuses such a batch.

    Args:
        context: the `tf.distribute.InputContext` a dataset function receives.
        global_batch_size: the rows of every step, over all replicas.

    Returns:
        An int.

    Raises:
        TypeError: `context` is not an input context.
        ValueError: `global_batch_size` is not a positive integer, is smaller than the
            number of replicas, or is not divided by the replicas of one pipeline (several
            replicas of one pipeline take batches of one size).
    """
    _check_whole(global_batch_size)
    replicas, pipelines, pipeline = _pipelines(context)
    if global_batch_size < replicas:
        raise ValueError(f"a global batch of {global_batch_size} rows leaves a replica of "
                         f"{replicas} without any: use at least {replicas}. Received: "
                         f"global_batch_size={global_batch_size}")
    if global_batch_size % replicas == 0:
        return int(global_batch_size) // replicas
    if replicas != pipelines:
        raise ValueError(f"a global batch of {global_batch_size} rows over {replicas} replicas "
                         f"fed by {pipelines} input pipeline(s): the replicas of one pipeline "
                         "take batches of one size, so the global batch must be a multiple of "
                         f"{replicas}. Received: global_batch_size={global_batch_size}")
    share, more = divmod(int(global_batch_size), pipelines)
    return share + (pipeline < more)


def _check_whole(global_batch_size):
    """Raises `ValueError` unless `global_batch_size` is an integer (not a bool)."""
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, numbers.Integral):
        raise ValueError("replica_batch_size needs the global batch as a whole number of "
                         f"rows. Received: global_batch_size={global_batch_size!r}")


def _pipelines(context):
    """(replicas, input pipelines, this pipeline's id) of an input `context`."""
    try:
        replicas, pipelines = context.num_replicas_in_sync, context.num_input_pipelines
        return replicas, pipelines, context.input_pipeline_id
    except AttributeError:
        raise TypeError("replica_batch_size needs the tf.distribute.InputContext a dataset "
                        f"function receives. Received: context={context!r:.80}") from None


def _stack():
    if not hasattr(_state, "rows"):
        _state.rows = []
    return _state.rows


class WeighsTrainSteps:
    """Strategy mixin: the training step Keras' trainer runs (`model.train_step`, your
    override too) runs `weighing` its batch on each replica (see the module docstring);
    every other function is run as it is."""

    def run(self, fn, args=(), kwargs=None, options=None):
        if keras_train_step(fn) and args:
            step = fn

            def fn(data, *rest, **named):
                with weighing(data):
                    return step(data, *rest, **named)

        return super().run(fn, args, kwargs, options)


def keras_train_step(fn):
    """Whether `fn` is the `train_step` of a Keras model, which Keras' TensorFlow trainer
    hands to `strategy.run` (3.10-3.15; tests/unit/seam/test_keras_seams.py checks it still
    does)."""
    import keras

    return (getattr(fn, "__name__", None) == "train_step"
            and isinstance(getattr(fn, "__self__", None), keras.Model))
