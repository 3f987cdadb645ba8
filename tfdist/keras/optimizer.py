"""Routing a Keras 3 optimizer's gradient all-reduce through a `GradientPipeline`.

Keras 3's TensorFlow optimizer all-reduces gradients in one private method,
`_all_reduce_sum_gradients(grads_and_vars)`, called in replica context with the loss
already scaled by 1/num_replicas. That is the one seam where `model.fit` (and any loop
that calls `apply_gradients`) can exchange gradients differently. This module builds a
subclass of the optimizer's own class that overrides just that method — no global
patch; `tests/test_keras_seams.py` fails loudly if Keras moves it. Keras versions
tested: 3.5 - 3.15.
"""

import keras
import tensorflow as tf

SEAM = "_all_reduce_sum_gradients"
UPDATE_SEAM = "_distributed_tf_update_step"


def with_gradient_pipeline(optimizer, pipeline, step=None):
    """A copy of `optimizer` whose gradient exchange is `pipeline`.

    Args:
        optimizer: a Keras 3 optimizer (instance or name) not yet built.
        pipeline: a `GradientPipeline`.
        step: a zero-argument callable giving the int64 step tensor for the hooks;
            defaults to the optimizer's own `iterations`.

    Returns:
        A new optimizer of a subclass of `type(optimizer)` (same name, same config, so a
        saved model loads it as the original class). Create it under the strategy scope;
        building it (Keras does, before training) also builds the pipeline's hooks.

    Raises:
        ValueError: the optimizer is already built or already routed through a pipeline.
    """
    optimizer = keras.optimizers.get(optimizer)
    if getattr(optimizer, "_tfdist_pipeline", None) is not None:
        raise ValueError("this optimizer already exchanges gradients through tfdist; "
                         f"wrap the original optimizer only once. Received: {optimizer}")
    if optimizer.built:
        raise ValueError("the optimizer already has variables; pass a fresh optimizer so "
                         f"its state is created under the strategy scope. Received: {optimizer}")
    base = type(optimizer)
    for seam in (SEAM, UPDATE_SEAM):
        if not hasattr(base, seam):
            raise RuntimeError(f"Keras {keras.__version__}: {base.__name__} has no {seam}; "
                               "tfdist's gradient seam moved — see tfdist/keras/optimizer.py")
    cls = type(base.__name__, (base,), {SEAM: _exchange_gradients, "build": _build,
                                        UPDATE_SEAM: _update_with_push,
                                        "__module__": base.__module__,
                                        "__qualname__": base.__qualname__})
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._tfdist_pipeline = pipeline
    wrapped._tfdist_step = step
    return wrapped


def _build(self, variables):
    """Keras' build, then the pipeline's hooks get the same variables (same scope)."""
    type(self).__mro__[1].build(self, variables)
    self._tfdist_pipeline.build(tf.distribute.get_strategy(), variables)


def _update_with_push(self, distribution, grads_and_vars, learning_rate):
    """Keras' per-variable update; with a push compressor (ParameterServerStrategy), each
    gradient is encoded here, on the worker, and decoded inside the update, which runs
    on the variable's parameter server: the encoded payload is what crosses."""
    from tfdist.compression.buffers import pack, unpack  # here: compression builds on this

    push = self._tfdist_pipeline.push_compressor()
    base = type(self).__mro__[1]
    if push is None:
        return getattr(base, UPDATE_SEAM)(self, distribution, grads_and_vars, learning_rate)

    def apply(variable, *payload_and_rate, layout):
        *payload, rate = payload_and_rate
        grad, = unpack(push.decode(tuple(payload), layout, None), layout)
        return self.update_step(tf.cast(grad, variable.dtype), variable, rate)

    for grad, variable in grads_and_vars:
        buffer, layout = pack([grad], push.align)
        payload = push.encode(buffer, layout, None)
        distribution.extended.update(variable, apply, args=(*payload, learning_rate),
                                     kwargs={"layout": layout}, group=False)


def _exchange_gradients(self, grads_and_vars):
    """Replaces Keras' SUM all-reduce with the pipeline (same contract, same context)."""
    if not tf.distribute.get_replica_context():
        return grads_and_vars  # cross-replica context: nothing to exchange, as in Keras
    self._tfdist_pipeline.check_phases_driven()
    step = self._tfdist_step() if self._tfdist_step else self.iterations
    return self._tfdist_pipeline(grads_and_vars, tf.cast(step, tf.int64))
