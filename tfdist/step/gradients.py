"""Gradients as models produce them, made into what the exchange can rely on.

A model's gradient of one variable is one of three things:

- a dense tensor whose *static* shape may be only partly known: a `Dense` layer over a
  sequence (`tensordot`) has a kernel gradient of static shape `(None, units)` whenever the
  batch dimension is unknown (always under MultiWorkerMirroredStrategy). Its shape is the
  variable's, so `with_variable_shapes` gives it that static shape;
- a `tf.IndexedSlices` (an `Embedding`, any `tf.gather` of a variable): the rows a step
  touched, duplicates included. It crosses the wire as those rows
  (`tfdist.step.wire.all_gather_rows`),
  exactly as TensorFlow's own strategies send it (an all-gather of values and indices,
  duplicates kept), so a step is the one a single device computes with the same optimizer:
  Keras' Adam squares each duplicated row before summing (its sparse update), and so does
  tfdist;
- None (an unused branch, a frozen layer): it passes through untouched.
"""

import tensorflow as tf


def is_sparse(grad):
    return isinstance(grad, tf.IndexedSlices)


def with_variable_shapes(grads_and_vars):
    """`grads_and_vars` with each gradient's static shape the variable's: a dense gradient
    reshaped (free: the shape is already that at run time), an `IndexedSlices`' rows given
    the variable's row shape and `dense_shape`. None gradients are kept."""
    return [(_with_shape(g, v.shape), v) for g, v in grads_and_vars]


def _with_shape(grad, shape):
    if grad is None or not shape.is_fully_defined():
        return grad
    if is_sparse(grad):
        values = tf.reshape(grad.values, [-1, *shape[1:]])
        return tf.IndexedSlices(values, grad.indices, tf.constant(shape.as_list(), tf.int64))
    if grad.shape == shape:
        return grad
    return tf.reshape(grad, shape)


def scaled(grad, factor):
    """`grad * factor`, an `IndexedSlices` kept sparse."""
    if is_sparse(grad):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def rows_like(slices, like):
    """`slices` (gathered rows) in `like`'s dtype, row shape and dense shape."""
    values = tf.reshape(tf.cast(slices.values, like.values.dtype), [-1, *like.values.shape[1:]])
    return tf.IndexedSlices(values, slices.indices, like.dense_shape)


def cast(grad, dtype):
    """`grad` in `dtype`, an `IndexedSlices` kept sparse (its values cast)."""
    if is_sparse(grad):
        return tf.IndexedSlices(tf.cast(grad.values, dtype), grad.indices, grad.dense_shape)
    return tf.cast(grad, dtype)


def rows_bytes(slices, rows=None):
    """Bytes of `rows` rows of `slices` (its own by default) as they cross the wire: the
    values and their indices, an int64 scalar tensor (the row count is known when the step
    runs)."""
    rows = tf.shape(slices.indices, out_type=tf.int64)[0] if rows is None else rows
    row = slices.values.shape[1:].num_elements() * slices.values.dtype.size
    return tf.cast(rows, tf.int64) * (row + slices.indices.dtype.size)
