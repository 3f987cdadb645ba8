"""Hook points of the training step, and the gradient pipeline that runs them.

A training step computes local gradients on each replica, exchanges them across
replicas, and applies them. Hooks plug into that step at four points:

    before_exchange(grads, variables, step)   local gradients (replica context)
    exchange(grads, variables, step)          the cross-replica exchange itself
    after_exchange(grads, variables, step)    exchanged gradients (replica context)
    on_step_end(step)                         after the update (cross-replica context)

and, outside the compiled step, in Python on every worker:

    after_step(model, steps_done)             between two steps
    before_read(model)                        before anything reads or saves the model

Gradient compression replaces `exchange` (compress, communicate the payload,
decompress); local SGD replaces it with "no exchange" between averages and averages
the model in `after_step` and `before_read`. The same `GradientPipeline` runs inside
`tfdist.Trainer` and, through the optimizer wrapper in `tfdist.keras`, inside `model.fit`.
"""

import tensorflow as tf

from tfdist.core import transaction


class TrainingHook:
    """Base class of a training-step plug-in; override only what you need.

    Gradient methods run inside `tf.function`, once per replica: `grads` is a list of
    tensors (or IndexedSlices) aligned with `variables`, `step` an int64 scalar tensor
    counting the steps done before this one. Create variables in `build`.
    """

    #: True when this hook performs the cross-replica exchange (at most one per step).
    replaces_exchange = False
    #: True when `phase` changes during training (the step must then be traced again).
    phased = False

    def build(self, strategy, variables):
        """Creates the hook's state; called once, under `strategy.scope()`."""

    def before_exchange(self, grads, variables, step):
        return grads

    def exchange(self, grads, variables, step):
        """Returns the exchanged gradients, summed over replicas (if `replaces_exchange`)."""
        raise NotImplementedError

    def after_exchange(self, grads, variables, step):
        return grads

    def on_step_end(self, step):
        """Runs after the optimizer update, in cross-replica context; `step` counts it."""
        return None  # a body AutoGraph can convert (a docstring alone is not)

    def after_step(self, model, steps_done):
        """Runs in Python between steps, on every worker; `steps_done` counts the steps."""

    def before_read(self, model):
        """Runs in Python on every worker before validation, checkpoints, the end of an
        epoch or of training: whatever reads the model must see one model."""

    def phase(self, step):
        """What the traced step depends on at Python step `step` (e.g. "compressing").

        Collectives cannot sit inside `tf.cond` in replica context, so a hook whose
        exchange changes at some step (delayed start, local-SGD warm-up) says so here;
        when any hook's phase changes, the step function is traced again.
        """
        return None


def all_reduce_sum(grads):
    """The exchange Keras 3 performs: a SUM all-reduce over the replicas in sync (which
    also carries the step's finiteness verdict, `tfdist.core.transaction`)."""
    if not grads:
        return []
    return transaction.all_reduce_sum(tf.distribute.get_replica_context(), grads)


class GradientPipeline:
    """Runs the hooks around one gradient exchange.

    Args:
        hooks: `TrainingHook`s, applied in order (before/after exchange, step end).

    Raises:
        ValueError: more than one hook replaces the exchange.
    """

    def __init__(self, hooks=()):
        self.hooks = []
        self._exchange = lambda g, v, s: all_reduce_sum(g)
        for hook in hooks:
            self.add(hook)

    def add(self, hook):
        """Appends `hook`; raises ValueError if it would be a second exchange owner."""
        owners = [h for h in [*self.hooks, hook] if h.replaces_exchange]
        if len(owners) > 1:
            names = ", ".join(type(h).__name__ for h in owners)
            raise ValueError(f"only one hook may replace the gradient exchange. Received: {names}")
        self.hooks.append(hook)
        self._exchange = owners[0].exchange if owners else (lambda g, v, s: all_reduce_sum(g))

    def build(self, strategy, variables):
        for hook in self.hooks:
            hook.build(strategy, variables)

    def __call__(self, grads_and_vars, step):
        """Exchanges gradients in replica context; None gradients pass through untouched."""
        grads_and_vars = list(grads_and_vars)
        present = [i for i, (g, _) in enumerate(grads_and_vars) if g is not None]
        grads = [grads_and_vars[i][0] for i in present]
        variables = [grads_and_vars[i][1] for i in present]
        for hook in self.hooks:
            grads = hook.before_exchange(grads, variables, step)
        grads = self._exchange(grads, variables, step)
        for hook in self.hooks:
            grads = hook.after_exchange(grads, variables, step)
        result = [(None, v) for _, v in grads_and_vars]
        for i, g in zip(present, grads):
            result[i] = (g, grads_and_vars[i][1])
        return result

    def on_step_end(self, step):
        for hook in self.hooks:
            hook.on_step_end(step)

    def after_step(self, model, steps_done):
        for hook in self.hooks:
            hook.after_step(model, steps_done)

    def before_read(self, model):
        for hook in self.hooks:
            hook.before_read(model)

    def enter_phase(self, step):
        """Sets every hook's phase for Python step `step`; True if any phase changed
        (the caller must then trace its step function again)."""
        phases = tuple(hook.phase(step) for hook in self.hooks)
        changed = phases != getattr(self, "_phases", None)
        self._phases = phases
        return changed

    @property
    def phases(self):
        """The phases set by the last `enter_phase` (a key for cached step functions)."""
        return getattr(self, "_phases", None)

    def push_compressor(self):
        """The compressor of the gradient push to parameter servers, if a hook has one."""
        for hook in self.hooks:
            if getattr(hook, "push", False) and hook.compressor.name != "none":
                return hook.compressor
        return None

    def check_phases_driven(self):
        """Raises if a phased hook would be traced before anyone set its phase."""
        phased = [type(h).__name__ for h in self.hooks if h.phased]
        if phased and not hasattr(self, "_phases"):
            raise RuntimeError(
                f"{', '.join(phased)} changes phase during training (e.g. compression from "
                "start_step on), which needs the train step traced again: with model.fit add "
                "tfdist.callbacks.HookPhases() to the callbacks; in your own loop compile the "
                "step with tfdist.keras.phased_step(fn, optimizer) instead of tf.function "
                "(tfdist.Trainer does it itself)")


class PhasedFunction:
    """A compiled step traced once per phase of a pipeline's hooks; `for_step` gives the
    one for a step. Collectives cannot be switched inside a compiled step (see
    `TrainingHook.phase`), so a step whose exchange changes during training (delayed start,
    local-SGD warm-up, gradient accumulation) is traced once for each phase.

    Args:
        make: a zero-argument callable returning a new compiled step (once per phase).
        pipeline: the `GradientPipeline` whose hooks' phases select the step.
    """

    def __init__(self, make, pipeline):
        self.make, self.pipeline = make, pipeline
        self._functions = {}  # hooks' phases -> the step traced for them

    def __contains__(self, function):
        """Whether `function` is one of the steps traced here."""
        return any(function is f for f in self._functions.values())

    def for_step(self, step):
        """The compiled step for Python step `step` (sets every hook's phase first)."""
        self.pipeline.enter_phase(step)
        key = self.pipeline.phases
        if key not in self._functions:
            self._functions[key] = self.make()
        return self._functions[key]
