"""The routed optimizer's step: the methods `tfdist.seam.optimizer.routed_class` gives
a Keras 3 optimizer's class — `apply` as one transaction, `_backend_apply_gradients`
with every state change conditional on the step's decision and accumulation chosen in
Python, `_backend_update_step` (the exchange, then the update stage,
`tfdist.step.update`), and `build` (the hooks built beside the slots) — with the
bookkeeping they keep: the optimizers built so far (`built_on`) and those a loop's
driver drives (`driving`). See `tfdist.seam.optimizer` for the seam as a whole.
"""

import contextlib
import itertools
import weakref

import tensorflow as tf

from tfdist.errors import UnsupportedError
from tfdist.seam.accumulation import average_accumulated
from tfdist.seam.frozen_variance import check_update_rule
from tfdist.seam.routed import keras_base
from tfdist.step import transaction, wire
from tfdist.step.preemption import preemption
from tfdist.step.variables import underlying
from tfdist.strategies.initial_values import identical_initial_values
from tfdist.strategies.kind import capabilities_of

_BUILT = weakref.WeakValueDictionary()  # creation number -> a built routed optimizer
_NUMBERS = itertools.count()
_DRIVEN = []  # stack of the optimizers a loop's driver drives in the call being traced


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


def slots_context(optimizer):
    """`identical_initial_values()` for the slots of Keras' own optimizer classes (zeros
    and constants); any other class's build keeps the broadcast (its slots might be
    random)."""
    keras_own = keras_base(optimizer).__module__.startswith("keras.")
    return identical_initial_values() if keras_own else contextlib.nullcontext()


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
        keras_base(self).apply(self, grads, trainable_variables)
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
        grads = average_accumulated(self, grads, accumulators)
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
        keras_base(self).build(self, variables)
    with identical_initial_values():
        self._tfdist_pipeline.build(tf.distribute.get_strategy(), variables)
    keep_hook_state(self)
    _BUILT[next(_NUMBERS)] = self


def keep_hook_state(optimizer):
    """The hooks' `saveables()` as an attribute Keras' saving walks, so the optimizer's
    checkpoint (`save_weights`, `BackupAndRestore`) holds their state."""
    optimizer.tfdist_hook_state = optimizer._tfdist_pipeline.saved_state.saveables()


def _update_step(self, grads, trainable_variables, learning_rate):
    """Keras' `_backend_update_step`: the pipeline exchanges the gradients (replica
    context), then each variable is updated, if the step commits."""
    decision = transaction.current()
    grads_and_vars = list(zip(grads, [underlying(v) for v in trainable_variables]))
    clocked = None  # the step clock's stamps and sum (`tfdist.step.step_clock`)
    if tf.distribute.get_replica_context():  # cross-replica: nothing to exchange, as in Keras
        self._tfdist_pipeline.check_phases_driven()
        step = tf.cast(self.iterations, tf.int64)
        clock = self._tfdist_pipeline.clock
        ready = clock.stamp(grads) if clock.active else None
        if clock.active and not decision.settled:
            decision.clock = clock.rider(tf.distribute.get_replica_context())
        with wire.recording() as record:  # what this replica sends, for the WireMeter
            present = [(g, v) for g, v in grads_and_vars if g is not None]
            record["dense"] = sum(wire.nbytes(g, v) for g, v in present)
            record["tensorflow"] = sum(wire.sent_bytes(g, v) for g, v in present)
            grads_and_vars = self._tfdist_pipeline(grads_and_vars, step)
            decision.settle()  # if the exchange did not carry the verdict (local SGD), now
        self._tfdist_pipeline.meter.traced(record)
        decision.done += [g for g, _ in grads_and_vars if g is not None]
        if clock.active:
            clocked = (ready, clock.stamp([*decision.done, decision.refusals]),
                       decision.clock_sum)
    guard = decision.fail_first(_refusal_hint(self, grads))
    tf.__internal__.distribute.interim.maybe_merge_call(
        self._tfdist_update_variables, self._distribution_strategy, grads_and_vars,
        learning_rate, decision.committed if guard is None else guard, decision.preempted,
        guard is not None, clocked)


def _update_variables(self, distribution, grads_and_vars, learning_rate, committed,
                      preempted=None, guarded=False, clocked=None):
    """Cross-replica, after the exchange: the update stage, then the commit."""
    pushed = _update_stage(self, distribution, grads_and_vars, learning_rate, committed,
                           guarded)
    _commit(self, distribution, committed, pushed, preempted, clocked)


def _update_stage(self, distribution, grads_and_vars, learning_rate, committed, guarded):
    """For each variable the pipeline's updater updates (`tfdist.step.update`): what it
    encodes here crosses to the variable's devices (under parameter servers: the worker's
    push), where weight decay and the updater's `apply` run if `committed` — `guarded`:
    after it, which a refused step never reaches (`Decision.fail_first`), else in a
    `tf.cond`. Returns the bytes pushed."""
    updater = self._tfdist_pipeline.updater()

    def update(variable, *payload_rate_committed, meta=None):
        *payload, rate, commit = payload_rate_committed

        def apply():
            if self.weight_decay is not None and self._use_weight_decay(variable):
                decay = tf.cast(self.weight_decay, variable.dtype) * tf.cast(rate, variable.dtype)
                variable.assign_sub(variable * decay)
            updater.apply(self, tuple(payload), meta, variable, rate)
            return tf.constant(True)

        if guarded:
            with tf.control_dependencies([commit]):
                return apply()
        return tf.cond(commit, apply, lambda: tf.constant(False))

    pushed, pushes = 0, capabilities_of(distribution).push
    for grad, variable in grads_and_vars:
        if grad is None or not updater.updates(variable):
            continue
        payload, meta = updater.encode(grad, variable)
        pushed += updater.payload_bytes(payload, variable) if pushes else 0
        distribution.extended.update(variable, update, args=(*payload, learning_rate, committed),
                                     kwargs={"meta": meta}, group=False)
    return pushed


def _commit(self, distribution, committed, pushed, preempted, clocked):
    """The step's end, on every replica and worker alike: what it sent counted, the tasks
    told to stop recorded, the step clock's account, then the hooks' `on_step_end`."""
    meter = self._tfdist_pipeline.meter
    meter.add(pushed=pushed)
    meter.count()  # what this step sent, each time it runs (skipped steps too)
    preemption().record(distribution, preempted)  # how many tasks were told to stop
    if clocked is not None:
        self._tfdist_pipeline.clock.account(distribution, *clocked)
    # The step counts once `apply` ends; here it is this update's number if it commits.
    committed = distribution.experimental_local_results(committed)[0]  # same everywhere
    self._tfdist_pipeline.on_step_end(tf.cast(self.iterations, tf.int64)
                                      + tf.cast(committed, tf.int64))
