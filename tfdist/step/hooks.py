"""The hook contract of a training step, and the gradient pipeline that runs the hooks.

A training step computes local gradients on each replica, exchanges them across
replicas, and applies them. Hooks plug into that step, in the same way and at the same
moments under `model.fit`, `tfdist.Trainer` and your own loop (`tfdist.function`):

    in the compiled step (the optimizer seam, `tfdist.seam.optimizer`, calls them):
    before_exchange(grads, variables, step)   local gradients (replica context)
    exchange(grads, variables, step)          the cross-replica exchange itself
    after_exchange(grads, variables, step)    exchanged gradients (replica context)
    on_step_end(step)                         after the update (cross-replica context)

    in Python, on every worker (the loop's `HookDriver`, `tfdist.loop.driver`, calls them):
    plan(steps)                               before training: the step it plans to end at
    prepare(step)                             before each step's phase is read: the one
                                              moment to time the link or run a collective
    phase(step)                               a pure query: no collective, no output
    enter_phase(phase)                        before the first step, and before a step
                                              whose phase differs
    after_step(model, steps_done)             after each step
    before_read(model)                        before validation, a checkpoint, the end of
                                              an epoch or of training — once per change

Abilities only some hooks have (whether a step couples every worker, skipping a step
call, preparing a backup, changing the update) are not in the base: they are small
protocols the pipeline looks up (`tfdist.step.abilities`); so is what a backup keeps of a
hook (`tfdist.step.saved_state`).

Gradient compression replaces `exchange` (compress, communicate the payload,
decompress); local SGD replaces it with "no exchange" between averages and averages
the model in `after_step` and `before_read`.
"""

import tensorflow as tf

from tfdist.step import gradients, wire
from tfdist.step.abilities import CouplesWorkers, PreparesBackups, SkipsCalls, Updates, found
from tfdist.step.buckets import DEFAULT_BUCKET_BYTES, all_reduce_in_buckets, checked_bucket_bytes
from tfdist.step.saved_state import SavedState
from tfdist.step.step_clock import StepClock
from tfdist.step.update import Updater
from tfdist.strategies import batch_rows


class TrainingHook:
    """Base class of a training-step plug-in; override only what you need.

    Gradient methods run inside `tf.function`, once per replica: `grads` is a list of
    tensors (or IndexedSlices) aligned with `variables`, `step` an int64 scalar tensor
    counting the optimizer's updates before this one. Create variables in `build`.

    A hook whose compiled code differs during training (a delayed start, a warm-up)
    says so with `phase(step)`, a pure function of the step; the driver calls
    `enter_phase` when it changes and traces the step again, and the hook's compiled
    code reads `self.current_phase`.
    """

    #: True when this hook performs the cross-replica exchange (at most one per step).
    replaces_exchange = False
    #: True when `phase` changes during training (the step must then be traced again).
    phased = False
    #: The phase the step is traced for (set by `enter_phase`; None before a driver ran).
    current_phase = None
    #: Parts of the hook that have optional abilities (`tfdist.step.abilities`).
    abilities = ()
    #: True when the replicas train apart (local SGD): each replica's weights and optimizer
    #: slots are its own, and a backup keeps every replica's (`tfdist.keras.backup`).
    replicas_apart = False
    #: The replicas the exchange runs between when they are not the strategy's: a replica
    #: context (`tfdist.horovod`'s workers, one process each; set when built), or None.
    replica_group = None
    #: The pipeline's `tfdist.step.wire.WireMeter` (set when the pipeline builds): a hook
    #: that exchanges outside the step (a model average) counts its bytes there.
    wire_meter = None
    #: The optimizer step the loop plans to end at (`plan`), or None: not known.
    planned_steps = None

    def build(self, strategy, variables):
        """Creates the hook's state; called once, under `strategy.scope()`."""

    def prepare(self, step):
        """Called by the driver in Python on every worker before the phase of optimizer
        step `step` is read (every step of a `phased` hook): the one moment a hook may
        time the link, run a collective or say something to decide its phase
        (`compression: auto` before its first step)."""

    def phase(self, step):
        """What the traced step depends on at optimizer step `step` (e.g. "compressing"):
        a pure query of the step and of what `prepare` decided — no collective, no
        output, no state changed. Collectives cannot sit inside `tf.cond` in replica
        context, so a hook whose exchange changes at some step says so here."""
        return None

    def plan(self, steps):
        """Called by the driver before training, on every worker, with the optimizer step
        the loop plans to end at (`model.fit`'s and `tfdist.Trainer.fit`'s epochs and
        steps per epoch), or None when it plans no length (your own loop, or data read
        until it ends)."""
        self.planned_steps = steps

    def enter_phase(self, phase):
        """Called by the driver, in Python on every worker, before the first step and before
        the first step of a new phase; override to change state there (and call
        `super().enter_phase(phase)`)."""
        self.current_phase = phase

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
        """Runs in Python after each step, on every worker; `steps_done` counts the steps."""

    def before_read(self, model):
        """Runs in Python on every worker before anything reads the model (validation,
        checkpoints, the end of an epoch or of training), once after each change: whatever
        reads the model must see one model."""

    def get_config(self):
        """Options that rebuild this hook when a model is loaded, or None (not saved)."""
        return None


def all_reduce_sum(grads, bucket_bytes=None, sparse_dtype=None):
    """The exchange Keras 3 performs: a SUM all-reduce over the replicas in sync (which
    also carries the step's finiteness verdict, `tfdist.step.transaction`), in buckets of
    `bucket_bytes` that overlap the backward pass (`tfdist.step.buckets`; None: one). An
    `IndexedSlices` goes as its rows, all-gathered as TensorFlow's strategies do (in
    `sparse_dtype` if given: a cast's compression; `tfdist.step.wire.all_gather_rows`)."""
    bucket_bytes = checked_bucket_bytes(bucket_bytes, "all_reduce_sum")
    context = tf.distribute.get_replica_context()
    return exchange_rows_apart(
        grads, lambda dense: all_reduce_in_buckets(context, dense, bucket_bytes) if dense
        else [], sparse_dtype=sparse_dtype)


def weighed_by_rows(grads, owner=None):
    """(replica context) `grads`, each times this replica's share of the step's rows
    (`tfdist.strategies.batch_rows.weight`: rows x replicas / all rows), so that their sum
    over the replicas averages the global batch however it was split (16 over 3: 6/6/4);
    as they are where no share is known (your own loop, one replica) or where `owner`
    steps each replica on its own gradient (a local step of local SGD: `synchronous`
    False)."""
    weight = batch_rows.weight() if getattr(owner, "synchronous", True) else None
    if weight is None:
        return grads
    return [gradients.scaled(g, weight) for g in grads]


def exchange_rows_apart(grads, exchange_dense, sparse_dtype=None, context=None):
    """`exchange_dense(the dense gradients)`, the `IndexedSlices` among `grads` all-gathered
    as rows (in `sparse_dtype` if given) over `context`'s replicas (None: the replica
    context's), put back in order."""
    sparse = [i for i, g in enumerate(grads) if gradients.is_sparse(g)]
    dense = [i for i, g in enumerate(grads) if not gradients.is_sparse(g)]
    summed = dict(zip(dense, exchange_dense([grads[i] for i in dense])))
    rows = [grads[i] for i in sparse]
    context = context or tf.distribute.get_replica_context()
    summed.update(zip(sparse, wire.all_gather_rows(
        context, rows, sparse_dtype and [sparse_dtype] * len(rows))))
    return [summed[i] for i in range(len(grads))]


class GradientPipeline:
    """Runs the hooks around one gradient exchange.

    Args:
        hooks: `TrainingHook`s, applied in order (before/after exchange, step end).
        bucket_bytes: bucket size of the plain all-reduce when no hook replaces it
            (`tfdist.step.buckets`; None: `DEFAULT_BUCKET_BYTES`, 0: one fused buffer).

    Raises:
        ValueError: more than one hook replaces the exchange.
    """

    def __init__(self, hooks=(), bucket_bytes=None):
        self.bucket_bytes = checked_bucket_bytes(
            DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes, "GradientPipeline")
        self.hooks = []
        self.meter = wire.WireMeter()  # what the optimizer's steps sent (CommStats)
        self.clock = StepClock()  # where each worker's step time went (StepTimes)
        self.driven = False   # a driver has set the hooks' phases
        self.changed = False  # a step ran since the hooks last made one model
        for hook in hooks:
            self.add(hook)

    def add(self, hook):
        """Appends `hook`; raises ValueError if it would be a second exchange owner."""
        owners = [h for h in [*self.hooks, hook] if h.replaces_exchange]
        if len(owners) > 1:
            names = ", ".join(type(h).__name__ for h in owners)
            raise ValueError(f"only one hook may replace the gradient exchange. Received: {names}")
        self.hooks.append(hook)

    @property
    def exchange_owner(self):
        """The hook that replaces the exchange, or None (Keras' all-reduce)."""
        return next((h for h in self.hooks if h.replaces_exchange), None)

    @property
    def replica_group(self):
        """The replicas the hooks exchange between when not the strategy's (a backup
        gathers each one's state over them), or None."""
        return next((h.replica_group for h in self.hooks if h.replica_group is not None), None)

    def build(self, strategy, variables):
        self.meter.build()
        if not any(getattr(hook, "islands", None) for hook in self.hooks):  # see StepClock
            self.clock.build(strategy)
        for hook in self.hooks:
            hook.wire_meter = self.meter
            hook.build(strategy, variables)

    def __call__(self, grads_and_vars, step):
        """Exchanges gradients in replica context; None gradients pass through untouched.
        Each gradient gets its variable's static shape first (`tfdist.step.gradients`)."""
        grads_and_vars = gradients.with_variable_shapes(grads_and_vars)
        present = [i for i, (g, _) in enumerate(grads_and_vars) if g is not None]
        grads = [grads_and_vars[i][0] for i in present]
        variables = [grads_and_vars[i][1] for i in present]
        for hook in self.hooks:
            grads = hook.before_exchange(grads, variables, step)
        owner = self.exchange_owner
        grads = weighed_by_rows(grads, owner)
        grads = (owner.exchange(grads, variables, step) if owner
                 else all_reduce_sum(grads, self.bucket_bytes))
        for hook in self.hooks:
            grads = hook.after_exchange(grads, variables, step)
        result = [(None, v) for _, v in grads_and_vars]
        for i, g in zip(present, grads):
            result[i] = (g, grads_and_vars[i][1])
        return result

    def on_step_end(self, step):
        for hook in self.hooks:
            hook.on_step_end(step)

    def trains_next(self):
        return all(part.trains_next() for part in found(self.hooks, SkipsCalls))

    def couples_workers(self):
        return all(part.couples_workers() for part in found(self.hooks, CouplesWorkers))

    def skipped(self):
        for part in found(self.hooks, SkipsCalls):
            part.skipped()

    def before_backup(self, model, steps_done):
        """Each hook prepares a backup (`PreparesBackups`), or makes one model."""
        for hook in self.hooks:
            parts = found([hook], PreparesBackups)
            for part in parts:
                part.before_backup(model, steps_done)
            if not parts:
                hook.before_read(model)

    def updater(self):
        """(trace time) The update stage's `Updater`: Keras' own, built on by each hook
        that `Updates`, in order (`tfdist.step.update`)."""
        updater = Updater()
        for part in found(self.hooks, Updates):
            made = part.updater(updater)
            if not isinstance(made, Updater):
                raise TypeError(
                    f"{type(part).__name__}.updater(inner) must return a tfdist.step.update."
                    "Updater (inner itself, or one built on it: subclass tfdist.step.update."
                    f"Wrapping). Received: {made!r:.80}")
            updater = made
        return updater

    @property
    def saved_state(self):
        """What a backup keeps of the hooks (`tfdist.step.saved_state`)."""
        return SavedState(self.hooks)

    def saved_config(self):
        """What a saved model keeps of the exchange: its owner's `get_config()`, or None."""
        owner = self.exchange_owner
        return owner.get_config() if owner is not None else None

    def check_phases_driven(self):
        """Raises if a phased hook would be traced before a driver set its phase."""
        phased = [type(h).__name__ for h in self.hooks if h.phased]
        if phased and not self.driven:
            raise RuntimeError(
                f"{', '.join(phased)} changes phase during training (e.g. compression from "
                "start_step on), which needs the train step traced again: with model.fit add "
                "tfdist.callbacks.TrainingHooks() to the callbacks; in your own loop compile "
                "the step with tfdist.function(fn, model=model) instead of tf.function "
                "(tfdist.Trainer does it itself)")
