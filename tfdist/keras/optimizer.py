"""Routing a Keras 3 optimizer's step through tfdist: the gradient pipeline and the
transactional update.

Keras 3's TensorFlow optimizer applies gradients in `apply` → `_backend_apply_gradients`
(clipping, weight decay, gradient accumulation, EMA) → `_backend_update_step`, which
all-reduces the gradients in replica context (the loss already scaled by 1/replicas) and
updates each variable through `merge_call` and `strategy.extended.update`. tfdist builds a
subclass of the optimizer's own class — no global patch — that overrides those three
methods (`tests/test_keras_seams.py` fails loudly if Keras moves them):

- the exchange is a `GradientPipeline` (compression, local SGD, your hooks);
- the step is a transaction (`tfdist.core.transaction`): one all-reduced finiteness flag
  decides whether it commits, every variable, slot, accumulator and EMA update and the
  `iterations` count depend on it, and a refused step then fails with a clear error;
- gradient accumulation works under MirroredStrategy and MultiWorkerMirroredStrategy:
  Keras chooses "accumulate" or "exchange and update" with a `tf.cond` around the
  all-reduce, and a collective inside a cond in replica context is refused (`merge_call
  called while defining a new graph`). Here the choice is a Python phase
  (`AccumulationPhase`): the step is traced once for each branch and the loop picks the
  right one, so the exchange happens once per accumulated step.
"""

import keras
import tensorflow as tf

from tfdist.core import transaction
from tfdist.keras import saving
from tfdist.keras.variables import underlying
from tfdist.training.hooks import GradientPipeline, PhasedFunction, TrainingHook

#: Keras methods the routed subclass overrides, and those it calls (all must exist).
OVERRIDDEN = ("apply", "_backend_apply_gradients", "_backend_update_step", "build")
CALLED = ("update_step", "_clip_gradients", "_use_weight_decay",
          "_update_model_variables_moving_average",
          "_overwrite_model_variables_with_average_value", "_get_variable_index")
_ROUTED = {}  # optimizer class -> its tfdist subclass


def with_gradient_pipeline(optimizer, pipeline, step=None):
    """A copy of `optimizer` whose gradient exchange is `pipeline`.

    Args:
        optimizer: a Keras 3 optimizer (instance or name) not yet built.
        pipeline: a `GradientPipeline`.
        step: a zero-argument callable giving the int64 step tensor for the hooks;
            defaults to the optimizer's own `iterations`.

    Returns:
        A new optimizer of a subclass of `type(optimizer)` (same name and options; a saved
        model loads it routed again where tfdist is imported, and as the original class
        elsewhere — see `tfdist.keras.saving`). Create it under the strategy scope;
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
    for name in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if hasattr(optimizer, name):  # set by exclude_from_weight_decay(), not in the config
            setattr(wrapped, name, getattr(optimizer, name))
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


def phased_step(fn, optimizer):
    """`tf.function(fn)` for your own training loop, traced once per phase of the
    optimizer's exchange: with a delayed start (`start_step`), the step exchanges
    uncompressed gradients first and compressed ones from `start_step` on, and
    collectives cannot be switched inside one compiled step. `model.fit` (with
    `tfdist.callbacks.HookPhases`) and `tfdist.Trainer` do this for you.

        step = tfdist.keras.phased_step(
            lambda x, y: strategy.run(train_step, args=(x, y)), optimizer)
        for x, y in distributed_dataset:
            step(x, y)

    Args:
        fn: the Python step function (it calls `strategy.run`).
        optimizer: the optimizer `fn` applies gradients with, routed through tfdist
            (`DistributedOptimizer`); its `iterations` says which phase a call is in.

    Returns:
        A callable with the signature of `fn`.

    Raises:
        ValueError: the optimizer does not exchange through tfdist.
    """
    pipeline = getattr(optimizer, "_tfdist_pipeline", None)
    if pipeline is None:
        raise ValueError("phased_step needs an optimizer that exchanges through tfdist, e.g. "
                         f"tfdist.keras.DistributedOptimizer(...). Received: {optimizer}")
    functions = PhasedFunction(lambda: tf.function(fn), pipeline)

    def step(*args, **kwargs):
        return functions.for_step(int(optimizer.iterations.numpy()))(*args, **kwargs)

    return step


def routed_class(base):
    """The subclass of optimizer class `base` with tfdist's seams (one per class)."""
    if getattr(base, "_tfdist_routed", False):
        return base
    if base not in _ROUTED:
        for seam in OVERRIDDEN + CALLED:
            if not hasattr(base, seam):
                raise RuntimeError(f"Keras {keras.__version__}: {base.__name__} has no {seam}; "
                                   "tfdist's optimizer seam moved — see tfdist/keras/optimizer.py")
        _ROUTED[base] = type(base.__name__, (base,), {
            "apply": _apply, "build": _build, "_backend_apply_gradients": _apply_gradients,
            "_backend_update_step": _update_step, "_tfdist_update_variables": _update_variables,
            "get_config": saving.get_config, "_tfdist_routed": True,
            "__module__": base.__module__, "__qualname__": base.__qualname__})
        saving.register(_ROUTED[base])
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


def _base(optimizer):
    """The Keras class a routed optimizer's class derives from."""
    return type(optimizer).__mro__[1]


def _apply(self, grads, trainable_variables=None):
    """Keras' `apply` as one transaction; returns whether the step committed (bool tensor).

    Raises (when the step runs): InvalidArgumentError if a gradient on any replica of any
    worker is NaN or Inf — after the step has left every replica's state as it was.
    """
    if not self.built and tf.distribute.has_strategy() and tf.distribute.get_replica_context():
        raise ValueError(
            "build the optimizer before the first `strategy.run`: its slots and the exchange's "
            "state must be created under the strategy's scope, not inside a replica. Call "
            "`optimizer.build(model.trainable_variables)` in `with strategy.scope():` "
            f"(model.fit and tfdist.Trainer do it for you). Received: optimizer={self.name}")
    decision = transaction.decide(list(grads))
    with transaction.active(decision):
        _base(self).apply(self, grads, trainable_variables)
    # Keras counted the step; a refused one is taken back (nothing read the count since).
    taken_back = tf.cast(decision.committed, tf.int64) - 1
    decision.done.append(underlying(self._iterations).assign_add(taken_back))
    transaction.fail_if_refused(decision)
    return decision.committed


def _apply_gradients(self, grads, trainable_variables):
    """Keras' `_backend_apply_gradients` with every state change conditional on the step's
    decision; accumulation chosen in Python (see the module docstring); weight decay
    applied with each variable's update (`_update_step`)."""
    steps = self.gradient_accumulation_steps
    decision = transaction.current()
    if steps:
        self._tfdist_pipeline.check_phases_driven()
        accumulators = [self._accumulated_gradients[self._get_variable_index(v)]
                        for v in trainable_variables]
        grads = _average_accumulated(self, grads, accumulators)
        if grads is None:  # accumulated locally, nothing exchanged
            return
    self._backend_update_step(self._clip_gradients(grads), trainable_variables,
                              self.learning_rate)
    if steps:
        for accumulator in self._accumulated_gradients:
            transaction.assign(underlying(accumulator), tf.zeros(accumulator.shape,
                                                                 accumulator.dtype))
    if self.use_ema:
        decision.cond(lambda: _update_ema(self))


def _average_accumulated(self, grads, accumulators):
    """In an accumulating micro-step, adds `grads` to the accumulators (unless refused)
    and returns None; in the exchanging one, returns the mean of the micro-steps."""
    context = tf.distribute.get_replica_context()
    stored_once = isinstance(tf.distribute.get_strategy(),
                             tf.distribute.experimental.CentralStorageStrategy)
    if self._tfdist_accumulating:  # local only: no exchange
        decision = transaction.current()
        grads = [tf.convert_to_tensor(g) for g in grads]
        grads = [decision.gate(g, tf.zeros_like(g)) for g in grads]
        if stored_once and context is not None:  # one accumulator for all (local) replicas
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        self._backend_increment_gradient_accumulators(grads, accumulators)
        return None
    if stored_once and context is not None:  # the sum below adds it once per replica
        accumulators = [a / context.num_replicas_in_sync for a in accumulators]
    steps = self.gradient_accumulation_steps
    return [(g + a) / steps for g, a in zip(grads, accumulators)]  # as Keras does


def _update_ema(self):
    """Keras' moving average of the weights (`use_ema`), as in `_backend_apply_gradients`."""
    self._update_model_variables_moving_average(self._trainable_variables)
    if self.ema_overwrite_frequency:
        overwrite = (self.iterations + 1) % self.ema_overwrite_frequency == 0
        tf.cond(overwrite, lambda: self._overwrite_model_variables_with_average_value(
            self._trainable_variables) or tf.constant(True), lambda: tf.constant(False))


def _build(self, variables):
    """Keras' build, then the pipeline's hooks get the same variables (same scope)."""
    _base(self).build(self, variables)
    self._tfdist_pipeline.build(tf.distribute.get_strategy(), variables)


def _update_step(self, grads, trainable_variables, learning_rate):
    """Keras' `_backend_update_step`: the pipeline exchanges the gradients (replica
    context), then each variable is updated, if the step commits."""
    decision = transaction.current()
    grads_and_vars = list(zip(grads, [underlying(v) for v in trainable_variables]))
    if tf.distribute.get_replica_context():  # cross-replica: nothing to exchange, as in Keras
        self._tfdist_pipeline.check_phases_driven()
        step = self._tfdist_step() if self._tfdist_step else self.iterations
        grads_and_vars = self._tfdist_pipeline(grads_and_vars, tf.cast(step, tf.int64))
        decision.settle()  # if the exchange did not carry the verdict (local SGD), now
        decision.done += [g for g, _ in grads_and_vars if g is not None]
    tf.__internal__.distribute.interim.maybe_merge_call(
        self._tfdist_update_variables, self._distribution_strategy, grads_and_vars,
        learning_rate, decision.committed)


def _update_variables(self, distribution, grads_and_vars, learning_rate, committed):
    """Cross-replica: weight decay and `update_step` of each variable, on its devices,
    if `committed`. With a push compressor (ParameterServerStrategy), each gradient is
    encoded here, on the worker, and decoded inside the update, which runs on the
    variable's parameter server: the encoded payload is what crosses."""
    from tfdist.compression.buffers import pack, unpack  # here: compression builds on this

    push = self._tfdist_pipeline.push_compressor()

    def update(variable, *payload_rate_committed, layout=None):
        *payload, rate, commit = payload_rate_committed
        grad = payload[0] if push is None else unpack(push.decode(tuple(payload), layout,
                                                                  None), layout)[0]

        def apply():
            if self.weight_decay is not None and self._use_weight_decay(variable):
                decay = tf.cast(self.weight_decay, variable.dtype) * tf.cast(rate, variable.dtype)
                variable.assign_sub(variable * decay)
            self.update_step(tf.cast(grad, variable.dtype), variable, rate)
            return tf.constant(True)

        return tf.cond(commit, apply, lambda: tf.constant(False))

    for grad, variable in grads_and_vars:
        if grad is None:
            continue
        payload, layout = (grad,), None
        if push is not None:
            buffer, layout = pack([grad], push.align)
            payload = push.encode(buffer, layout, None)
        distribution.extended.update(variable, update, args=(*payload, learning_rate, committed),
                                     kwargs={"layout": layout}, group=False)
