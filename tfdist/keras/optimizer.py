"""Routing a Keras 3 optimizer's gradient all-reduce through a `GradientPipeline`.

Keras 3's TensorFlow optimizer all-reduces gradients in one private method,
`_all_reduce_sum_gradients(grads_and_vars)`, called in replica context with the loss
already scaled by 1/num_replicas. That is the one seam where `model.fit` (and any loop
that calls `apply_gradients`) can exchange gradients differently. This module builds a
subclass of the optimizer's own class that overrides just that method — no global
patch; `tests/test_keras_seams.py` fails loudly if Keras moves it. Keras versions
tested: 3.5 - 3.15.

The same subclass fixes Keras' gradient accumulation under MirroredStrategy and
MultiWorkerMirroredStrategy: Keras chooses "accumulate" or "exchange and update" with a
`tf.cond` around the all-reduce, and a collective inside a cond in replica context is
refused (`merge_call called while defining a new graph`). Here the choice is a Python
phase (`AccumulationPhase`): the step is traced once for each branch and the loop picks
the right one, so the exchange happens once per accumulated step.
"""

import keras
import tensorflow as tf

from tfdist.training.hooks import GradientPipeline, TrainingHook

SEAM = "_all_reduce_sum_gradients"
UPDATE_SEAM = "_distributed_tf_update_step"
APPLY_SEAM = "_backend_apply_gradients"
_ROUTED = {}  # optimizer class -> its tfdist subclass


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
    wrapped = routed_class(type(optimizer)).from_config(optimizer.get_config())
    _route(wrapped, pipeline, step)
    return wrapped


def add_hook(optimizer, hook, strategy):
    """Adds `hook` to `optimizer`'s pipeline, in place — routing the optimizer through a
    pipeline first if it is a plain Keras optimizer (its class becomes tfdist's subclass
    of its own class; nothing else changes). A hook of the same class already there (a
    callback of an earlier `fit`) is replaced. Builds the hook if the optimizer is built.
    """
    if getattr(optimizer, "_tfdist_pipeline", None) is None:
        optimizer.__class__ = routed_class(type(optimizer))
        _route(optimizer, GradientPipeline(), None)
    pipeline = optimizer._tfdist_pipeline
    if hook in pipeline.hooks:
        return
    pipeline.hooks = [h for h in pipeline.hooks if type(h) is not type(hook)]
    pipeline.add(hook)
    if optimizer.built:
        with strategy.scope():
            hook.build(strategy, list(optimizer._trainable_variables))


def before_read(model):
    """Lets the hooks of `model.optimizer` make one model of the replicas (local SGD
    averages them) before something reads or saves it; on every worker."""
    pipeline = getattr(getattr(model, "optimizer", None), "_tfdist_pipeline", None)
    if pipeline is not None:
        pipeline.before_read(model)


def routed_class(base):
    """The subclass of optimizer class `base` with tfdist's seams (one per class)."""
    if getattr(base, "_tfdist_routed", False):
        return base
    if base not in _ROUTED:
        for seam in (SEAM, UPDATE_SEAM, APPLY_SEAM):
            if not hasattr(base, seam):
                raise RuntimeError(f"Keras {keras.__version__}: {base.__name__} has no {seam}; "
                                   "tfdist's gradient seam moved — see tfdist/keras/optimizer.py")
        _ROUTED[base] = type(base.__name__, (base,), {
            SEAM: _exchange_gradients, "build": _build, UPDATE_SEAM: _update_with_push,
            APPLY_SEAM: _apply_gradients, "_tfdist_routed": True,
            "__module__": base.__module__, "__qualname__": base.__qualname__})
    return _ROUTED[base]


def _route(optimizer, pipeline, step):
    optimizer._tfdist_pipeline = pipeline
    optimizer._tfdist_step = step
    optimizer._tfdist_accumulating = False
    if optimizer.gradient_accumulation_steps:
        if isinstance(tf.distribute.get_strategy(), tf.distribute.ParameterServerStrategy):
            raise ValueError(
                "gradient_accumulation_steps does not apply under ParameterServerStrategy: "
                "workers update the variables asynchronously, one step at a time; give each "
                "worker a larger batch instead")
        if optimizer.use_ema:
            raise ValueError("tfdist does not combine gradient_accumulation_steps with "
                             "use_ema; use one of them")
        pipeline.add(AccumulationPhase(optimizer))


class AccumulationPhase(TrainingHook):
    """The phase of Keras' gradient accumulation: accumulate, or exchange and update."""

    phased = True

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def phase(self, step):
        micro_steps = int(self.optimizer._iterations.numpy())
        steps = self.optimizer.gradient_accumulation_steps
        self.optimizer._tfdist_accumulating = (micro_steps + 1) % steps != 0
        return self.optimizer._tfdist_accumulating


def _apply_gradients(self, grads, trainable_variables):
    """Keras' gradient application, with accumulation chosen in Python (see above)."""
    base = type(self).__mro__[1]
    steps = self.gradient_accumulation_steps
    if not steps:
        return getattr(base, APPLY_SEAM)(self, grads, trainable_variables)
    self._tfdist_pipeline.check_phases_driven()
    accumulators = [self._accumulated_gradients[self._get_variable_index(v)]
                    for v in trainable_variables]
    context = tf.distribute.get_replica_context()
    stored_once = isinstance(tf.distribute.get_strategy(),
                             tf.distribute.experimental.CentralStorageStrategy)
    if self._tfdist_accumulating:  # local only: no exchange
        if stored_once and context is not None:  # one accumulator for all (local) replicas
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        return self._backend_increment_gradient_accumulators(grads, accumulators)
    if stored_once and context is not None:  # the sum below adds it once per replica
        accumulators = [a / context.num_replicas_in_sync for a in accumulators]
    grads = [(g + a) / steps for g, a in zip(grads, accumulators)]  # as Keras does
    grads = self._clip_gradients(grads)
    self._apply_weight_decay(trainable_variables)
    self._backend_update_step(grads, trainable_variables, self.learning_rate)
    self._backend_reset_gradient_accumulators()


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
