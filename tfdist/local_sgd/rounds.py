"""The synchronisations of local SGD carried out between steps: the schedule's moments
(`Schedule`), each fragment's synchroniser (`FragmentSync`), Streaming DiLoCo's overlapped
exchanges in the background, and the islands' agreement at each of them."""

import tensorflow as tf

from tfdist.step.overlap import Background
from tfdist.step.variables import optimizer_slots, per_replica_state, underlying


class Rounds:
    """Synchronises a model's fragments when the schedule says.

    Args:
        warmup: `Warmup` (the synchronous steps before the local ones).
        schedule: `Schedule`.
        synchronisers: one `FragmentSync` per fragment, in order.
        agreement: the islands' agreement (`NoIslands` without islands of workers).
        pacing: heterogeneous islands' `Pacing`, or None.
        overlap_mix: the share of the local weights an overlapped exchange keeps.
        state_of: model -> the other state averaged with the last fragment (per-replica
            Keras state, optimizer slots), as tf.Variables.
    """

    def __init__(self, warmup, schedule, synchronisers, agreement, pacing=None,
                 overlap_mix=0.5, state_of=lambda model: []):
        self.warmup, self.schedule, self.synchronisers = warmup, schedule, synchronisers
        self.agreement, self.pacing, self.overlap_mix = agreement, pacing, overlap_mix
        self.state_of = state_of
        self.background = Background() if schedule.overlap_steps else None
        self.last_steps_done = None

    def after_step(self, model, steps_done):
        """After `steps_done` steps: the warm-up's own work, or the synchronisations due
        (once per count: the micro-batches of an accumulated step call it again)."""
        steps_done = self.agreement.steps(steps_done, self.warmup.steps)  # skips count too
        if steps_done == self.last_steps_done:
            return
        self.last_steps_done = steps_done
        if steps_done <= self.warmup.steps:  # the steps so far were synchronous
            self.warmup.after_step(model, steps_done)
        else:
            self.after_local_step(model, steps_done - self.warmup.steps)

    def before_backup(self, model, steps_done):
        """The replicas stay apart (the backup keeps each one's weights), after this step's
        synchronisations (`after_step`: a no-op if it ran); an overlapped exchange in
        flight is waited for, so its result is in the backup."""
        self.after_step(model, steps_done)
        if self.background is not None:
            self.background.wait()

    def after_local_step(self, model, local):
        """The synchronisations due after local step `local`."""
        if self.pacing is None:
            self._due(model, local)
        else:
            self.pacing.around_synchronisations(local, lambda: self._due(model, local))

    def _due(self, model, local):
        due = self.schedule.after_local_step(local)
        where = f"after local step {local}"
        if due.agree:
            self.agreement.agree(f"the synchronisation {where}")
        for fragment in due.finishing:
            self._finish(model, fragment, self.overlap_mix)
        if due.finishing:
            self.agreement.act_on_carried(f"the synchronisation applied {where}")
        for fragment in due.starting:
            self._start(model, fragment, local)

    def average(self, model):
        """Every replica's weights (and the chosen state) synchronised now, after any
        exchange in flight: one model."""
        where = "the synchronisation before the model is read"
        due = self.schedule.before_read()
        if due.agree:
            self.agreement.agree(where)
        for fragment in due.finishing:
            self._finish(model, fragment, 0.0)
        if due.finishing:
            self.agreement.act_on_carried(where)
        differ = sorted(self.schedule.differ)
        step = self._step("sync")
        for fragment in differ:
            last = fragment == differ[-1]
            self._sync(model, fragment, step, state=last, last=last)
        if not differ and self.state_of(model):  # the state alone
            self._sync(model, len(self.synchronisers) - 1, step, state=True, last=False,
                       weights=False)
        self.schedule.averages += 1
        self.schedule.differ = set()

    def _start(self, model, fragment, local):
        """A fragment's synchronisation: at once, or (overlap) its exchange begins in the
        background on what the replicas hold now."""
        step = self._step("send" if self.background else "sync")
        last = fragment == len(self.synchronisers) - 1
        if self.background is None:
            self._sync(model, fragment, step, state=last, last=last)
        else:
            sync = self.synchronisers[fragment]
            weights = self.weights(model)
            sync.compiled("send", weights)()
            exchange = sync.compiled("exchange", weights)
            with self.background.dispatch():  # called here, in program order: the same
                exchange(step)                # collective keys everywhere
        self.schedule.started(fragment, local)

    def _finish(self, model, fragment, mix):
        """Applies a fragment's exchange once it has arrived."""
        self.background.wait()  # raises what failed in the background
        last = fragment == len(self.synchronisers) - 1
        sync = self.synchronisers[fragment]
        # the mix is an argument: one trace serves 0 and overlap_mix
        sync.compiled("apply", self.weights(model), last=last)(tf.constant(mix, tf.float32))
        self.schedule.finished(fragment, mix)

    def _sync(self, model, fragment, step, state, last, weights=True):
        sync = self.synchronisers[fragment]
        function = sync.compiled("sync" if weights else "state", self.weights(model),
                                 self.state_of(model) if state else [], last)
        function(step)

    def _step(self, kind):
        """The exchange's step (the count of synchronisations), after the islands' pace
        weighed what this island's change counts for."""
        if self.pacing is not None:
            self.pacing.before_sending(int(self.agreement.attempts.numpy()))
            if kind == "send":
                self.agreement.stage_timing()
        return tf.constant(self.schedule.averages, tf.int64)

    def weights(self, model):
        weights = [underlying(v) for v in model.trainable_variables]
        count = sum(len(s.ids) for s in self.synchronisers)
        if len(weights) != count:
            raise ValueError(f"the model has {len(weights)} trainable weights but the "
                             f"averager was built for {count}; use one averager per model")
        return weights


def averaged_state(strategy, model, non_trainable, optimizer_state, distributed=True):
    """The state a synchronisation averages besides the trainable weights (`distributed=
    False`: each process a replica, `tfdist.step.variables.per_replica_state`)."""
    state = []
    if non_trainable:
        state += per_replica_state(strategy, model.non_trainable_variables, distributed)
    if optimizer_state and model.optimizer is not None:
        state += optimizer_slots(model.optimizer, distributed)
    return state
