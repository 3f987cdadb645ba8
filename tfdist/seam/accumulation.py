"""Keras' gradient accumulation under replicas that exchange: the choice between
"accumulate" and "exchange and update" is a phase (`AccumulationPhase`), so the step is
traced once for each and no collective sits inside a `tf.cond` in replica context."""

import tensorflow as tf

from tfdist.step import transaction, wire
from tfdist.step.hooks import TrainingHook
from tfdist.strategies.kind import capabilities_of


class AccumulationPhase(TrainingHook):
    """The phase of Keras' gradient accumulation: True while accumulating (no exchange),
    False in the micro-step that exchanges and updates."""

    phased = True

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def phase(self, step):
        micro_steps = int(self.optimizer._iterations.numpy())
        return (micro_steps + 1) % self.optimizer.gradient_accumulation_steps != 0


def accumulating(self):
    hook = next(h for h in self._tfdist_pipeline.hooks if isinstance(h, AccumulationPhase))
    return hook.current_phase


def average_accumulated(self, grads, accumulators):
    """In an accumulating micro-step, adds `grads` to the accumulators (unless refused)
    and returns None; in the exchanging one, returns the mean of the micro-steps."""
    context = tf.distribute.get_replica_context()
    stored_once = capabilities_of().stored_once
    if accumulating(self):  # local only: no exchange
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
