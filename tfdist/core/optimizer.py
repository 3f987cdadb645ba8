"""The optimizer seam: a Keras 3 optimizer's step routed through tfdist's gradient
pipeline, as one transaction. The one module that touches Keras optimizer privates.

Keras 3's TensorFlow optimizer applies gradients in `apply` → `_backend_apply_gradients`
(clipping, weight decay, gradient accumulation, EMA) → `_backend_update_step`, which
all-reduces the gradients in replica context (the loss already scaled by 1/replicas) and
updates each variable through `merge_call` and `strategy.extended.update`. tfdist builds a
subclass of the optimizer's own class — no global patch, no change to the object it is
given (as Horovod's `DistributedOptimizer`) — that overrides `OVERRIDDEN` and calls
`CALLED`; `tests/test_keras_seams.py` checks their behaviour on every Keras version in
`tfdist.versions.KERAS_CHECKED`, and `routed_class` refuses a Keras that lost one or whose
behaviour tfdist relies on changed (`check_seam`, run once per class on the real one):

- the exchange is a `GradientPipeline` (compression, local SGD, your hooks), and the
  hooks' `on_step_end` runs after the update, in every loop;
- the step is a transaction (`tfdist.core.transaction`): one all-reduced finiteness flag
  decides whether it commits, every variable, slot, accumulator and EMA update and the
  `iterations` count depend on it, and a refused step then fails with a clear error;
- gradient accumulation works under MirroredStrategy and MultiWorkerMirroredStrategy:
  Keras chooses "accumulate" or "exchange and update" with a `tf.cond` around the
  all-reduce, and a collective inside a cond in replica context is refused (`merge_call
  called while defining a new graph`). Here the choice is a phase (`AccumulationPhase`):
  the step is traced once for each branch and the loop's driver picks the right one.

Saved models (`get_config`) keep the exchange: the routed class is saved as its Keras
base class under the registered name `SAVED_NAME`, with tfdist's part under the config
key `SAVED_KEY` (`tfdist.keras.saving` loads it back).
"""

import contextlib
import itertools
import threading
import weakref

import keras
import numpy as np
import tensorflow as tf

from tfdist.core import loss_scale, transaction, wire
from tfdist.core.hooks import GradientPipeline, TrainingHook
from tfdist.core.preemption import preemption
from tfdist.core.replica_state import SyncReplicaState
from tfdist.core.variables import underlying
from tfdist.errors import UnsupportedError
from tfdist.strategies.initial_values import identical_initial_values
from tfdist.strategies.kind import capabilities_of
from tfdist.versions import KERAS_CHECKED, KERAS_FIX, UnsupportedVersionError

#: Keras methods the routed subclass overrides, and those it calls (all must exist).
OVERRIDDEN = ("apply", "_backend_apply_gradients", "_backend_update_step", "build",
              "get_config")
CALLED = ("update_step", "_clip_gradients", "_use_weight_decay",
          "_update_model_variables_moving_average",
          "_overwrite_model_variables_with_average_value", "_get_variable_index",
          "_backend_increment_gradient_accumulators")
SAVED_PACKAGE, SAVED_CLASS = "tfdist", "DistributedOptimizer"
SAVED_NAME = f"{SAVED_PACKAGE}>{SAVED_CLASS}"  # the registered name of every routed class
SAVED_KEY, SAVED_VERSION = "tfdist", 1
_ROUTED = {}  # optimizer class -> its tfdist subclass
_SEAM_CHECKED = set()  # optimizer classes whose behaviour check_seam saw
_BUILT = weakref.WeakValueDictionary()  # creation number -> a built routed optimizer
_NUMBERS = itertools.count()
_DRIVEN = []  # stack of the optimizers a loop's driver drives in the call being traced


def pipeline_of(optimizer):
    """The `GradientPipeline` a routed optimizer exchanges through (also inside a
    `LossScaleOptimizer`), else None."""
    optimizer = loss_scale.inner_of(optimizer)
    return optimizer._tfdist_pipeline if is_routed(optimizer) else None


def is_routed(optimizer):
    return getattr(type(optimizer), "_tfdist_routed", False)


def learning_rate_schedule(optimizer):
    """The optimizer's `LearningRateSchedule`, or None if its rate is a value."""
    rate = optimizer._learning_rate
    return rate if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) else None


def with_gradient_pipeline(optimizer, pipeline):
    """A copy of `optimizer` whose gradient exchange is `pipeline` (to which a
    `SyncReplicaState` hook is added if it has none: one model on every replica).

    Args:
        optimizer: a Keras 3 optimizer (instance or name) not yet built; a
            `LossScaleOptimizer` gets its inner optimizer routed, and comes back as
            tfdist's `LossScaleOptimizer` with the same settings.
        pipeline: a `GradientPipeline`.

    Returns:
        A new optimizer of a subclass of `type(optimizer)` (same name and options).
        Create it under the strategy scope; building it (Keras does, before training)
        also builds the pipeline's hooks.

    Raises:
        ValueError: the optimizer is already built or already routed through a pipeline.
    """
    optimizer = keras.optimizers.get(optimizer)
    if loss_scale.is_loss_scale(optimizer) and not optimizer.built:
        inner = with_gradient_pipeline(optimizer.inner_optimizer, pipeline)
        return loss_scale.LossScaleOptimizer(
            inner, initial_scale=optimizer.initial_scale,
            dynamic_growth_steps=optimizer.dynamic_growth_steps, name=optimizer.name)
    if pipeline_of(optimizer) is not None:
        raise ValueError("this optimizer already exchanges gradients through tfdist; "
                         f"wrap the original optimizer only once. Received: {optimizer}")
    if optimizer.built:
        raise ValueError("the optimizer already has variables; pass a fresh optimizer so "
                         f"its state is created under the strategy scope. Received: {optimizer}")
    return _routed_copy(optimizer, pipeline)


def with_hook(optimizer, hook, strategy):
    """`optimizer` with `hook` in its pipeline: the same optimizer (hook appended) if it
    is routed, else a routed copy that takes over its state (Horovod's fresh copy; the
    original is left as it was). A hook of the same class already there (a callback of
    an earlier `fit`) is replaced. Builds the hook if the optimizer is built. A
    `LossScaleOptimizer` keeps its place: the optimizer inside it gets the hook."""
    if loss_scale.is_loss_scale(optimizer):
        inner = with_hook(optimizer.inner_optimizer, hook, strategy)
        if inner is not optimizer.inner_optimizer:
            optimizer.inner_optimizer = inner
        return loss_scale.take_over(optimizer)
    pipeline = pipeline_of(optimizer)
    if pipeline is None:
        with strategy.scope():
            copy = _routed_copy(optimizer, GradientPipeline([hook]))
            if optimizer.built:
                copy.build(optimizer._trainable_variables)
                for mine, theirs in zip(copy.variables, optimizer.variables):
                    mine.assign(theirs)
        return copy
    if hook not in pipeline.hooks:
        check_update_rule(optimizer, [hook])
        pipeline.hooks = [h for h in pipeline.hooks if type(h) is not type(hook)]
        pipeline.add(hook)
        if optimizer.built:
            with strategy.scope(), identical_initial_values():
                hook.wire_meter = pipeline.meter
                hook.build(strategy, list(optimizer._trainable_variables))
            keep_hook_state(optimizer)
    return optimizer


def routed_class(base):
    """The subclass of optimizer class `base` with tfdist's seams (one per class).

    Raises:
        UnsupportedVersionError: this Keras lost a method the seam needs.
    """
    if getattr(base, "_tfdist_routed", False):
        return base
    if base not in _ROUTED:
        for seam in OVERRIDDEN + CALLED:
            if not hasattr(base, seam):
                _refuse(f"its {base.__name__} has no {seam}")
        _ROUTED[base] = type(base.__name__, (base,), {
            "apply": _apply, "build": _build, "_backend_apply_gradients": _apply_gradients,
            "_backend_update_step": _update_step, "_tfdist_update_variables": _update_variables,
            "get_config": _get_config, "_tfdist_routed": True, "_tfdist_pipeline": None,
            "__setattr__": _setattr,
            "__module__": base.__module__, "__qualname__": base.__qualname__})
        _register(_ROUTED[base])
    return _ROUTED[base]


def _setattr(self, name, value):
    """Keras' `__setattr__`; `loss_scale_factor` set to None on a tfdist optimizer after
    it was made is Keras' `LossScaleOptimizer.__init__` wrapping it, which tfdist then
    takes over (`tfdist.core.loss_scale.take_over_caller`)."""
    _base(self).__setattr__(self, name, value)
    if name == "loss_scale_factor" and value is None and "_tfdist_pipeline" in self.__dict__:
        loss_scale.take_over_caller(self)


def built_on(variables):
    """The routed optimizers built so far (and alive) that update any of `variables`, in
    the order they were built."""
    wanted, found = {id(underlying(v)) for v in variables}, {}
    for _, optimizer in sorted(_BUILT.items(), key=lambda item: item[0]):
        if any(id(underlying(v)) in wanted for v in optimizer._trainable_variables):
            found.setdefault(id(optimizer), optimizer)
    return list(found.values())


@contextlib.contextmanager
def driving(optimizers):
    """While a loop's driver runs a step for `optimizers`: a routed optimizer traced in it
    that is not one of them is refused by name (its hooks would never run)."""
    _DRIVEN.append({id(o) for o in optimizers})
    try:
        yield
    finally:
        _DRIVEN.pop()


def _check_driven(optimizer):
    if _DRIVEN and id(optimizer) not in _DRIVEN[-1]:
        raise UnsupportedError(
            f"this step applies the tfdist optimizer {optimizer.name!r} "
            f"({type(optimizer).__name__}), which the loop's driver did not find, so its "
            "hooks (phases, local SGD's averages, one model before reads) would never run: "
            "keep it as an attribute of the model (a custom train_step's optimizers), or "
            "name it: tfdist.function(step, model=model, optimizer=[...]). Received: "
            f"optimizer={optimizer.name!r}")


def _refuse(finding):
    raise UnsupportedVersionError(
        f"Keras {keras.__version__} cannot run tfdist's optimizer seam: {finding} "
        f"(tfdist/core/optimizer.py; checked on Keras {', '.join(KERAS_CHECKED)}); "
        f"{KERAS_FIX}")


def check_seam(base, config):
    """Checks, on optimizer class `base` built from `config`, the Keras behaviour the routed
    class relies on: every layer variable is a `keras.Variable` wrapping a `tf.Variable`
    (`underlying`), and `apply` itself counts the step once, after
    `_backend_apply_gradients` (Keras ≤ 3.9 counted it inside that method, which the
    routed class replaces: `iterations` would never advance). Runs once per class, eagerly,
    in a thread of its own (no strategy there), on a one-element variable.

    Raises:
        UnsupportedVersionError: the behaviour differs; the message names the Keras floor.
    """
    if base in _SEAM_CHECKED:
        return
    found = {}

    def probe():
        try:
            found["finding"] = _seam_finding(base, config)
        except Exception as error:  # noqa: BLE001 (reported in the calling thread)
            found["error"] = error

    thread = threading.Thread(target=probe, name="tfdist-keras-seam-check")
    thread.start()
    thread.join()
    if "error" in found:
        raise found["error"]
    if found["finding"]:
        _refuse(found["finding"])
    _SEAM_CHECKED.add(base)


def _seam_finding(base, config):
    """What `check_seam` found wrong, or None."""
    layer = keras.layers.Dense(1)
    layer.build((None, 1))
    if not isinstance(layer.kernel, keras.Variable) or not isinstance(
            underlying(layer.kernel), tf.Variable):
        return (f"a layer's variable is a {type(layer.kernel).__name__}, not a keras.Variable "
                "wrapping a tf.Variable")
    counted = type(base.__name__, (base,), {"_backend_apply_gradients": lambda *_: None})
    optimizer = counted.from_config(dict(config, gradient_accumulation_steps=None))
    variable = keras.Variable(np.zeros(1, np.float32))
    optimizer.build([variable])
    before = int(optimizer.iterations.numpy())
    optimizer.apply([tf.zeros(1)], [variable])
    steps = int(optimizer.iterations.numpy()) - before
    if steps != 1:
        return (f"its optimizer's apply counted {steps} steps, not 1, around "
                "_backend_apply_gradients, which tfdist replaces (Keras 3.9 and older count "
                "the step inside it, so training would never advance the step)")
    return None


def _register(routed):
    """Registers `routed` for saving under `SAVED_NAME`, keeping whatever loads that name
    (`tfdist.keras.saving.Loader`): the registry maps one name to one class."""
    objects = keras.saving.get_custom_objects()
    loader = objects.get(SAVED_NAME)
    keras.saving.register_keras_serializable(SAVED_PACKAGE, SAVED_CLASS)(routed)
    if loader is not None:
        objects[SAVED_NAME] = loader


def _get_config(self):
    """The base class's config plus tfdist's part under `SAVED_KEY` of ``decay`` (a key
    Keras' optimizers accept and ignore, so a process without tfdist still loads it).

    Raises:
        ValueError: the base config already uses ``decay``, or the exchange cannot be
            described by options (see `GradientCompression.get_config`).
    """
    config = _base(self).get_config(self)
    if config.get("decay") is not None:
        raise ValueError("tfdist saves its settings in the optimizer config key 'decay', "
                         f"which {type(self).__name__} uses itself. Received: {config}")
    base = _base(self)
    config["decay"] = {SAVED_KEY: {
        "version": SAVED_VERSION,
        "optimizer": {"module": base.__module__, "class": base.__name__,
                      "registered_name": keras.saving.get_registered_name(base)},
        "compression": self._tfdist_pipeline.saved_config()}}
    return config


def _routed_copy(optimizer, pipeline):
    config = optimizer.get_config()
    check_seam(type(optimizer), config)
    wrapped = routed_class(type(optimizer)).from_config(config)
    for name in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if hasattr(optimizer, name):  # set by exclude_from_weight_decay(), not in the config
            setattr(wrapped, name, getattr(optimizer, name))
    wrapped._tfdist_pipeline = pipeline
    _count_atomically(wrapped._iterations)
    if not any(isinstance(h, SyncReplicaState) for h in pipeline.hooks):
        pipeline.add(SyncReplicaState())  # one model on every replica, in every loop
    if wrapped.gradient_accumulation_steps:
        if not capabilities_of().accumulation:
            raise UnsupportedError(
                "gradient_accumulation_steps does not apply under ParameterServerStrategy: "
                "workers update the variables asynchronously, one step at a time; give each "
                "worker a larger batch instead")
        if wrapped.use_ema:
            raise ValueError("tfdist does not combine gradient_accumulation_steps with "
                             "use_ema; use one of them")
        pipeline.add(AccumulationPhase(wrapped))
    return wrapped


def _count_atomically(counter):
    """Makes Keras' `iterations.assign_add` one atomic add: Keras reads, adds and assigns,
    so workers of a parameter-server job that step at once lose counts (23 of 36 measured);
    the optimizer's count is tfdist's one step counter. Keras counts the step after its
    update; in a refused one (`tfdist.core.transaction`) it adds 0. (This instance only.)"""
    def assign_add(delta):
        delta = tf.cast(delta, counter.dtype)
        decision = transaction.current()
        if decision is not None:  # in a step: a refused one does not count
            delta *= tf.cast(decision.committed, counter.dtype)
        return underlying(counter).assign_add(delta)

    counter.assign_add = assign_add


class AccumulationPhase(TrainingHook):
    """The phase of Keras' gradient accumulation: True while accumulating (no exchange),
    False in the micro-step that exchanges and updates."""

    phased = True

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def phase(self, step):
        micro_steps = int(self.optimizer._iterations.numpy())
        return (micro_steps + 1) % self.optimizer.gradient_accumulation_steps != 0


def _accumulating(self):
    hook = next(h for h in self._tfdist_pipeline.hooks if isinstance(h, AccumulationPhase))
    return hook.current_phase


def slots_context(optimizer):
    """`identical_initial_values()` for the slots of Keras' own optimizer classes (zeros
    and constants); any other class's build keeps the broadcast (its slots might be
    random)."""
    keras_own = _base(optimizer).__module__.startswith("keras.")
    return identical_initial_values() if keras_own else contextlib.nullcontext()


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
    _check_driven(self)
    decision = transaction.decide(list(grads))
    with transaction.active(decision):
        _base(self).apply(self, grads, trainable_variables)
    if decision.guard is None:  # the updates did not wait for the failure (`_update_step`)
        transaction.fail_if_refused(decision, _refusal_hint(self, grads))
    return decision.committed


def _refusal_hint(optimizer, grads):
    """`transaction.FLOAT16_HINT` where the step computes in float16, else ""."""
    float16 = optimizer.__dict__.get("_tfdist_float16") or any(
        g is not None and g.dtype == tf.float16 for g in grads)
    return transaction.FLOAT16_HINT if float16 else ""


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
    stored_once = capabilities_of().stored_once
    if _accumulating(self):  # local only: no exchange
        decision = transaction.current()
        grads = [tf.convert_to_tensor(g) for g in grads]
        grads = [decision.gate(g, tf.zeros_like(g)) for g in grads]
        if stored_once and context is not None:  # one accumulator for all (local) replicas
            grads = wire.all_reduce(context, tf.distribute.ReduceOp.SUM, grads)
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
    """Keras' build, then the pipeline's hooks get the same variables (same scope). Their
    state starts alike on every worker: not broadcast (`identical_initial_values`)."""
    check_update_rule(self, self._tfdist_pipeline.hooks)
    with slots_context(self):
        _base(self).build(self, variables)
    with identical_initial_values():
        self._tfdist_pipeline.build(tf.distribute.get_strategy(), variables)
    keep_hook_state(self)
    _BUILT[next(_NUMBERS)] = self


def keep_hook_state(optimizer):
    """The hooks' `saveables()` as an attribute Keras' saving walks, so the optimizer's
    checkpoint (`save_weights`, `BackupAndRestore`) holds their state."""
    optimizer.tfdist_hook_state = optimizer._tfdist_pipeline.saveables()


def check_update_rule(optimizer, hooks):
    """UnsupportedError if a hook freezes Adam's second moment and `optimizer` has none."""
    freezing = [type(h).__name__ for h in hooks if getattr(h, "freeze_variance", False)]
    if freezing and (not isinstance(optimizer, keras.optimizers.Adam) or optimizer.amsgrad):
        raise UnsupportedError(
            f"{freezing[0]} freezes Adam's second moment after start_step (freeze_variance, "
            "1-bit Adam): it needs keras.optimizers.Adam or AdamW without amsgrad. Received: "
            f"{type(optimizer).__name__}" + (" with amsgrad=True" if getattr(
                optimizer, "amsgrad", False) else ""))


def frozen_variance_adam(gradient, m, v, learning_rate, step, frozen_step, beta_1, beta_2,
                         epsilon):
    """One Adam step with the second moment `v` frozen at optimizer step `frozen_step`
    (1-bit Adam): returns (new first moment, the change of the variable). `step` counts
    from 1 (Keras' `iterations + 1`); v's bias correction stays the one of `frozen_step`."""
    m = m + (gradient - m) * (1 - beta_1)
    alpha = (learning_rate * tf.sqrt(1 - beta_2 ** frozen_step) / (1 - beta_1 ** step))
    return m, -alpha * m / (tf.sqrt(v) + epsilon)


def _frozen_variance_update(self, gradient, variable, learning_rate, frozen_step):
    """Adam's `update_step` with the second moment frozen at `frozen_step` (1-bit Adam)."""
    index = self._get_variable_index(variable)
    m, v = self._momentums[index], self._velocities[index]
    dtype = variable.dtype
    new_m, change = frozen_variance_adam(
        gradient, m, v, tf.cast(learning_rate, dtype), tf.cast(self.iterations + 1, dtype),
        tf.cast(frozen_step, dtype), tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype),
        tf.cast(self.epsilon, dtype))
    m.assign(new_m)
    variable.assign_add(change)


def _update_step(self, grads, trainable_variables, learning_rate):
    """Keras' `_backend_update_step`: the pipeline exchanges the gradients (replica
    context), then each variable is updated, if the step commits."""
    decision = transaction.current()
    grads_and_vars = list(zip(grads, [underlying(v) for v in trainable_variables]))
    if tf.distribute.get_replica_context():  # cross-replica: nothing to exchange, as in Keras
        self._tfdist_pipeline.check_phases_driven()
        step = tf.cast(self.iterations, tf.int64)
        with wire.recording() as record:  # what this replica sends, for the WireMeter
            present = [(g, v) for g, v in grads_and_vars if g is not None]
            record["dense"] = sum(wire.nbytes(g, v) for g, v in present)
            record["tensorflow"] = sum(wire.sent_bytes(g, v) for g, v in present)
            grads_and_vars = self._tfdist_pipeline(grads_and_vars, step)
            decision.settle()  # if the exchange did not carry the verdict (local SGD), now
        self._tfdist_pipeline.meter.traced(record)
        decision.done += [g for g, _ in grads_and_vars if g is not None]
    guard = decision.fail_first(_refusal_hint(self, grads))
    tf.__internal__.distribute.interim.maybe_merge_call(
        self._tfdist_update_variables, self._distribution_strategy, grads_and_vars,
        learning_rate, decision.committed if guard is None else guard, decision.preempted,
        guard is not None)


def _update_variables(self, distribution, grads_and_vars, learning_rate, committed,
                      preempted=None, guarded=False):
    """Cross-replica: weight decay and `update_step` of each variable, on its devices,
    if `committed` — `guarded`: after it, which a refused step never reaches
    (`Decision.fail_first`), else in a `tf.cond`; then the hooks' `on_step_end`. With a
    push codec (parameter servers), each gradient is encoded here, on the worker, and
    decoded inside the update, which runs on the variable's parameter server: the encoded
    payload is what crosses."""
    push = self._tfdist_pipeline.push_codec()
    frozen_step = self._tfdist_pipeline.frozen_variance_step()

    def update(variable, *payload_rate_committed, meta=None):
        *payload, rate, commit = payload_rate_committed
        grad = payload[0] if push is None else push.decode(tuple(payload), meta)

        def apply():
            if self.weight_decay is not None and self._use_weight_decay(variable):
                decay = tf.cast(self.weight_decay, variable.dtype) * tf.cast(rate, variable.dtype)
                variable.assign_sub(variable * decay)
            if frozen_step is None:
                self.update_step(tf.cast(grad, variable.dtype), variable, rate)
            else:
                _frozen_variance_update(self, tf.cast(grad, variable.dtype), variable, rate,
                                        frozen_step)
            return tf.constant(True)

        if guarded:
            with tf.control_dependencies([commit]):
                return apply()
        return tf.cond(commit, apply, lambda: tf.constant(False))

    pushed, pushes = 0, capabilities_of(distribution).push
    for grad, variable in grads_and_vars:
        if grad is None:
            continue
        payload, meta = ((grad,), None) if push is None else push.encode(grad)
        pushed += sum(wire.sent_bytes(p, variable if push is None else None)  # the variable's
                      for p in payload) if pushes else 0  # size where the shape is dynamic
        distribution.extended.update(variable, update, args=(*payload, learning_rate, committed),
                                     kwargs={"meta": meta}, group=False)
    meter = self._tfdist_pipeline.meter
    meter.add(pushed=pushed)
    meter.count()  # what this step sent, each time it runs (skipped steps too)
    preemption().record(distribution, preempted)  # how many tasks were told to stop
    # The step counts once `apply` ends; here it is this update's number if it commits.
    committed = distribution.experimental_local_results(committed)[0]  # same everywhere
    self._tfdist_pipeline.on_step_end(tf.cast(self.iterations, tf.int64)
                                      + tf.cast(committed, tf.int64))
