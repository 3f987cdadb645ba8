"""A training step as a transaction: one cross-replica decision gates every state change.

A step changes state in many places — weights, optimizer slots and `iterations`,
error-feedback residuals, PowerSGD's Q, gradient accumulators, step counters — on every
replica of every worker, and the replicas run their parts in no fixed order. If any
replica's gradient is not finite, none of that may change, anywhere. A replica's own check
cannot decide it (its batch may be fine while another's is not), so the decision is made
once, before any state changes: every replica adds "my gradients are not finite" to one
scalar all-reduce (`decide`), whose sum is the same on every replica and worker. Every
assignment of the step is conditional on it (`assign`, `Decision.gate`, `Decision.cond`),
so a refused step changes nothing whether or not a replica's ops have run. The step fails
only after that (`fail_if_refused`), once the step's collectives are done, on every worker
alike, so no worker is left waiting in a collective.

The running replica's decision is `current()`, set by `with active(decision):` around the
code of the step (thread-local: MirroredStrategy runs each replica in a thread of its own).
"""

import contextlib
import threading

import tensorflow as tf

REFUSED = ("tfdist: a NaN or Inf gradient on some replica; the step was refused on every "
           "replica and worker (weights, optimizer state, error-feedback residuals and step "
           "counters are as before it). Replicas with a non-finite gradient:")

_state = threading.local()


class Decision:
    """One step's verdict, as seen by one replica.

    Attributes:
        refusals: float32 scalar, how many replicas had a non-finite gradient (the same on
            every replica and worker).
        committed: bool scalar, True when the step may change state.
        done: tensors the failure of a refused step must wait for (the step's collectives).
    """

    def __init__(self, refusals):
        self.refusals = refusals
        self.committed = tf.equal(refusals, 0.0)
        self.done = []

    def gate(self, new, old):
        """`new` if the step is committed, else `old` (elementwise, NaN-safe)."""
        return tf.where(self.committed, new, old)

    def cond(self, update):
        """Runs `update()` (state changes, no collectives) only if the step is committed."""
        def run():
            update()
            return tf.constant(True)

        return tf.cond(self.committed, run, lambda: tf.constant(False))


def decide(grads):
    """The step's `Decision` from this replica's gradients (None entries are skipped).

    In replica context, one scalar all-reduce over the replicas in sync; elsewhere (one
    replica, cross-replica context, no strategy) the local check is the decision.
    """
    checks = [tf.reduce_all(tf.math.is_finite(_values(g))) for g in grads if g is not None]
    finite = tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
    refusals = 1.0 - tf.cast(finite, tf.float32)
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        refusals = context.all_reduce(tf.distribute.ReduceOp.SUM, refusals)
    return Decision(refusals)


@contextlib.contextmanager
def active(decision):
    """Makes `decision` the `current()` one for the code inside (this thread only)."""
    stack = _stack()
    stack.append(decision)
    try:
        yield decision
    finally:
        stack.pop()


def current():
    """The decision of the step being traced on this replica, or None outside a step."""
    stack = _stack()
    return stack[-1] if stack else None


def assign(variable, value):
    """`variable.assign(value)`, unless the current step is refused (then it keeps its
    value). Outside a step, a plain assignment."""
    decision = current()
    if decision is None:
        return variable.assign(value)
    value = tf.convert_to_tensor(value, variable.dtype)
    return variable.assign(decision.gate(value, variable.read_value()))


def fail_if_refused(decision):
    """Raises `InvalidArgumentError` (`REFUSED`) when the step runs, if it was refused —
    after the tensors in `decision.done`, i.e. after the step's collectives."""
    with tf.control_dependencies([tf.identity(_values(t)) for t in decision.done]):
        return tf.debugging.Assert(decision.committed, [REFUSED, decision.refusals])


def _stack():
    if not hasattr(_state, "decisions"):
        _state.decisions = []
    return _state.decisions


def _values(grad):
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad
