"""A training step as a transaction: one cross-replica decision gates every state change.

A step changes state in many places — weights, optimizer slots and `iterations`,
error-feedback residuals, PowerSGD's Q, gradient accumulators, step counters — on every
replica of every worker, and the replicas run their parts in no fixed order. If any
replica's gradient is not finite, none of that may change, anywhere. A replica's own check
cannot decide it (its batch may be fine while another's is not), so the decision is made
once, before any state changes: every replica adds "my gradients are not finite" to an
all-reduce (`decide`; the step's first gradient all-reduce carries it, see
`all_reduce_sum`, else one scalar all-reduce of its own), whose sum is the same on every
replica and worker. Every
assignment of the step is conditional on it (`assign`, `Decision.gate`, `Decision.cond`),
so a refused step changes nothing whether or not a replica's ops have run. The step fails
only after that (`fail_if_refused`), once the step's collectives are done, on every worker
alike, so no worker is left waiting in a collective. Where a refused step fails (no loss
scaling, no island), the optimizer's updates need no `tf.cond`: they wait for that check
(`Decision.fail_first`), which a refused step never passes — 51 conds fewer on the UNet.

The running replica's decision is `current()`, set by `with active(decision):` around the
code of the step (thread-local: MirroredStrategy runs each replica in a thread of its own).

Under dynamic loss scaling (`tfdist.seam.loss_scale`) a refused step is not an error but a
skipped step — the scale overflowed on purpose — so the loss scale traces the step
`with skipping():` and decides what to do with `committed` itself.
"""

import contextlib
import threading

import tensorflow as tf

from tfdist.regions import ThreadRegion
from tfdist.step import wire
from tfdist.step.preemption import preemption
from tfdist.strategies.keras_step_options import compiled_by_xla

REFUSED = ("tfdist: a NaN or Inf gradient on some replica (or one whose sum overflows "
           "float32); the step was refused on every "
           "replica and worker (weights, optimizer state, error-feedback residuals and step "
           "counters are as before it). Replicas with a non-finite gradient:")

#: Appended to `REFUSED` where the step computes in float16 with no dynamic loss scaling.
FLOAT16_HINT = (" (the step computes in float16 without dynamic loss scaling: wrap the "
                "optimizer in keras.optimizers.LossScaleOptimizer, as model.compile does "
                "under mixed_float16 unless auto_scale_loss=False)")

_state = threading.local()


class Decision:
    """One step's verdict, as seen by one replica.

    Attributes:
        local: float32 scalar, 1.0 if this replica's gradients are not all finite.
        refusals: float32 scalar, how many replicas had a non-finite gradient (the same on
            every replica and worker); settled on first use (see `settle`).
        committed: bool scalar, True when the step may change state.
        done: tensors the failure of a refused step must wait for (the step's collectives).
    """

    def __init__(self, local, replicated, rider=None):
        self.local = local
        self.rider = rider  # the preemption flag, summed with the verdict (or None)
        self.clock = None  # the step clock's figures, summed with the verdict (or None)
        self.clock_sum = None  # ... summed over every replica (`tfdist.step.step_clock`)
        self._refusals = None if replicated else local
        self.preempted = None if replicated else rider
        self._committed = None
        self.guard = None  # `committed` once a refused step has failed (`fail_first`)
        self.done = []
        self.defer = None  # what records a refusal instead of failing (`settle_within`)

    @property
    def settled(self):
        return self._refusals is not None

    def settle(self, summed=None):
        """Sets `refusals` (and `preempted`) from an all-reduce that carried `riders()`
        (see `all_reduce_sum`), or, called without it, all-reduces them by themselves if
        nothing carried them yet."""
        if summed is None and self._refusals is None:
            context = tf.distribute.get_replica_context()
            summed = wire.all_reduce(context, tf.distribute.ReduceOp.SUM, self.riders())
        if summed is not None:
            self._take(summed)
        return self._refusals

    def settle_across(self, summed):
        """Sets `refusals` (and `preempted`) from `riders()` summed over more than the
        replica context knows of — every worker of a Horovod job, one replica per process
        (`tfdist.horovod`), where `decide` took this replica's own flag as the verdict."""
        self._take(summed)
        self.clock_sum = None  # summed over more than the replica context's workers
        self._committed = None

    def settle_within(self, refusals, defer):
        """Sets `refusals` from a sum over a *part* of the replicas — an island's
        (`tfdist.local_sgd.islands`) — that agree among themselves only: no preemption
        count (the islands agree on it when they synchronise), and a refused step is
        recorded by `defer(committed)` instead of failing, so that every island fails
        together at that synchronisation rather than one island at once."""
        self._refusals, self.preempted, self.defer = refusals, None, defer

    def riders(self):
        """What this replica adds to the step's first all-reduce: its non-finite flag, its
        task's preemption flag where a loop watches for one, the step clock's figures
        where it runs."""
        return [self.local] + [r for r in (self.rider, self.clock) if r is not None]

    def _take(self, summed):
        """Sets `refusals`, `preempted` and `clock_sum` from the summed `riders()`."""
        summed = list(summed)
        self._refusals = summed.pop(0)
        self.preempted = summed.pop(0) if self.rider is not None else None
        self.clock_sum = summed.pop(0) if self.clock is not None else None

    @property
    def refusals(self):
        return self.settle()

    @property
    def committed(self):
        if self._committed is None:
            self._committed = tf.equal(self.refusals, 0.0)
        return self._committed

    def gate(self, new, old):
        """`new` if the step is committed, else `old` (elementwise, NaN-safe)."""
        return tf.where(self.committed, new, old)

    def fail_first(self, hint=""):
        """Where a refused step fails: `fail_if_refused` now (after `done`), and returns
        `guard`, `committed` available only after that check — state changes made to wait
        for it (`tf.control_dependencies`) never run in a refused step, with no `tf.cond`.
        Where a refused step is skipped (`skipping`) or deferred (an island), or the step
        is compiled by XLA (which drops `tf.debugging.Assert`: the step is then skipped
        without the error), None: state changes are conditional instead (`gate`, `cond`)."""
        if (self.guard is None and not skipping_refused() and self.defer is None
                and not compiled_by_xla()):
            with tf.control_dependencies([fail_if_refused(self, hint)]):
                self.guard = tf.identity(self.committed)
        return self.guard

    def cond(self, update):
        """Runs `update()` (state changes, no collectives) only if the step is committed."""
        def run():
            update()
            return tf.constant(True)

        return tf.cond(self.committed, run, lambda: tf.constant(False))


def decide(grads):
    """The step's `Decision` from this replica's gradients (None entries are skipped).

    In replica context with several replicas, the verdict needs the other replicas' flags:
    the step's first all-reduce carries them (`all_reduce_sum`), or one scalar all-reduce
    of its own when the step has none before it needs the verdict. Elsewhere (one replica,
    cross-replica context, no strategy) the local check is the verdict.
    """
    finite = all_finite([_values(g) for g in grads if g is not None])
    context = tf.distribute.get_replica_context()
    replicated = context is not None and context.num_replicas_in_sync > 1
    return Decision(1.0 - tf.cast(finite, tf.float32), replicated, preemption().rider())


def all_finite(tensors):
    """Whether the sum of all elements of `tensors` (in float32 or wider) is finite (a bool
    scalar): False if one is NaN or Inf, and if finite float32 ones sum beyond float32's
    range (3.4e38), which refuses that step too. One reduction per tensor, no `tf.cond`
    (benchmarks/results/pass_through_current.md)."""
    if not tensors:
        return tf.constant(True)
    return tf.math.is_finite(tf.add_n([_float32_sum(t) for t in tensors]))


def _float32_sum(tensor):
    """The sum of `tensor`'s elements, summed in float32 or wider; as float32, or, for a
    wider dtype, 0 if that sum is finite and NaN if not (a float64 sum beyond float32's
    range is finite)."""
    total = tf.reduce_sum(tensor if tensor.dtype.size >= 4 else tf.cast(tensor, tf.float32))
    return total if total.dtype == tf.float32 else tf.cast(total * 0, tf.float32)


def all_reduce_sum(context, tensors):
    """`context.all_reduce(SUM, tensors)`, carrying the current step's verdict too if it is
    not settled yet: one collective for both."""
    decision = current()
    if decision is None or decision.settled or not tensors:
        return wire.all_reduce(context, tf.distribute.ReduceOp.SUM, tensors)
    riders = decision.riders()
    summed = wire.all_reduce(context, tf.distribute.ReduceOp.SUM, [*tensors, *riders])
    decision.settle(summed[len(tensors):])
    return summed[:len(tensors)]


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


def fail_if_refused(decision, hint=""):
    """Raises `InvalidArgumentError` (`REFUSED` + `hint`) when the step runs, if it was
    refused — after the tensors in `decision.done`, i.e. after the step's collectives.
    Inside `skipping()` a refused step is left to the caller (nothing is raised); a
    decision settled within an island records it (`Decision.settle_within`)."""
    if skipping_refused():
        return None
    if decision.defer is not None:
        return decision.defer(decision.committed)
    with tf.control_dependencies([_values(t).op for t in decision.done]):  # no copies
        # string and int32 data only: TF's Assert then needs no cond around it
        count = tf.cast(decision.refusals, tf.int32)
        return tf.debugging.Assert(decision.committed, [REFUSED + hint, count])


_skipping = ThreadRegion()


def skipping():
    """Steps traced inside (on this thread: the replica's) are skipped when refused instead
    of failing (dynamic loss scaling)."""
    return _skipping()


def skipping_refused():
    return _skipping.active()


def _stack():
    if not hasattr(_state, "decisions"):
        _state.decisions = []
    return _state.decisions


def _values(grad):
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad
