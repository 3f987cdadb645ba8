"""One fragment's synchronisation: its anchors, its slice of the outer optimizer, its
buffers, its compressed exchange and its compiled functions.

torchft's `_StreamingDiLoCoFragment` is the model: a fragment prepares its exchange
(`send`: what each replica contributes), performs it (`exchange`: the mean over replicas
and workers) and applies it (`apply`: the outer step on the anchors, then the weights),
all three at once (`sync`) or — Streaming DiLoCo's overlap (Douillard et al. 2025) —
`exchange` in the background beside the next inner steps. Every collective goes through
a `Communicator` that the fragment's `Replicas` hands it (a test's records instead).
"""

import keras
import tensorflow as tf

from tfdist.compression.communicator import Communicator
from tfdist.local_sgd.outer import outer_optimizer
from tfdist.local_sgd.rounds import averaged_state
from tfdist.step import wire
from tfdist.step.tracing import plain_function
from tfdist.step.variables import underlying


class Replicas:
    """How a synchroniser reaches the replicas: a compiled `strategy.run` (its collectives'
    bytes counted on the pipeline's wire meter) and, in replica context, a `Communicator`.
    A one-process test passes an object with the same two methods."""

    def __init__(self, strategy, meter=None):
        self.strategy, self.meter = strategy, meter

    @property
    def many(self):
        return self.strategy.num_replicas_in_sync > 1

    def compile(self, body, counted=True):
        """`body(*args)` on every replica, as one traced function."""
        if counted:
            return plain_function(
                lambda *args: wire.run_counted(self.strategy, self.meter, body, args))
        return plain_function(lambda *args: self.strategy.run(body, args=args))

    def communicator(self, context=None):
        """(replica context) The collectives among the replicas in sync, or `context`'s."""
        return Communicator(context)

    def apart_state(self, model, non_trainable, optimizer_state):
        """The state a synchronisation averages besides the trainable weights."""
        return averaged_state(self.strategy, model, non_trainable, optimizer_state)


class Anchors:
    """DiLoCo's anchors — the weights as last synchronised, float32 — and the outer
    optimizer that moves them (None: the plain sum of the mean change, a compressed
    exchange's)."""

    def __init__(self, variables, outer=None):
        self.variables = [keras.Variable(tf.zeros(v.shape), dtype="float32", trainable=False,
                                         aggregation="none", name="tfdist_anchor")
                          for v in variables]
        self.tensors = [underlying(a) for a in self.variables]
        self.optimizer = None
        if outer is not None:
            self.optimizer = outer_optimizer(outer)
            self.optimizer.build(self.variables)

    def __iter__(self):  # the anchors, as the variables replicas hold (a backup's, a test's)
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)

    def copy_from(self, weights):
        """(replica context) Anchors := the replica's weights."""
        for anchor, weight in zip(self.tensors, weights):
            anchor.assign(tf.cast(weight.read_value(), tf.float32))

    def step(self, ids, means, last):
        """(replica context) The anchors `ids` moved by the mean change: the outer
        optimizer's step on the pseudo-gradient (anchor - mean weight), or the plain sum;
        `last`: the period's last fragment counts the outer step."""
        if self.optimizer is None:
            for i, mean in zip(ids, means):
                self.tensors[i].assign_add(mean)
        else:
            rate = self.optimizer.learning_rate
            for i, mean in zip(ids, means):
                self.optimizer.update_step(-mean, self.variables[i], rate)
            if last:
                self.optimizer.iterations.assign_add(1)
        return [self.tensors[i].read_value() for i in ids]


class FragmentSync:
    """The synchronisation of one fragment (the variables `ids`) over replicas and
    workers.

    Args:
        ids: the fragment's indices into the model's trainable weights.
        replicas: `Replicas`.
        anchors: `Anchors`, or None (plain averaging of the weights).
        exchange: the fragment's `GradientCompression` hook, or None (a mean all-reduce).
        islands: `IslandReduce` of islands of equal size (exchanged hierarchically,
            `CrossIslands`), or None.
        agreement: the islands' agreement (`tfdist.local_sgd.agreement`): its staging rides
            an overlapped exchange.
        pacing: heterogeneous islands' `Pacing` (its weight scales what a replica
            contributes), or None.
        overlapped: keep `sent` and `received` buffers for an exchange in the background.

    Each replica counts the rows it trained since the fragment's last synchronisation
    (`rows`, `count_rows`); a synchronisation weighs what each replica contributes by its
    rows times the replicas over all rows, so that a global batch the replicas do not
    divide (16 over 3: 6/5/5) is averaged as on one device — where islands exchange
    hierarchically or `pacing` weighs them, by island instead.
    """

    def __init__(self, ids, replicas, anchors=None, exchange=None, islands=None,
                 agreement=None, pacing=None, overlapped=False, shapes=()):
        self.ids, self.replicas, self.anchors = list(ids), replicas, anchors
        self.exchange_hook, self.islands, self.agreement = exchange, islands, agreement
        self.pacing = pacing
        self.functions = {}
        self.sent = self.received = []
        local = dict(trainable=False, aggregation=tf.VariableAggregation.NONE)
        self.rows = tf.Variable(0.0, name="tfdist_rows_since_sync", **local)
        self.counts_rows = False  # a traced local step counts them (Keras' or the Trainer's)
        if overlapped:
            self.sent = [tf.Variable(tf.zeros(s), name="tfdist_sent", **local) for s in shapes]
            self.received = [tf.Variable(tf.zeros(s), name="tfdist_received", **local)
                             for s in shapes]

    def replica_state(self):
        return [*self.sent, *self.received]

    def count_rows(self, rows):
        """(replica context) A local step trained `rows` (a float32 scalar) here."""
        self.counts_rows = True
        self.rows.assign_add(rows)

    def compiled(self, kind, weights, state=(), last=False):
        """The traced function of `kind` (sync, send, exchange, apply) for the model's
        `weights` (all of them; the fragment reads its `ids`) and the `state` averaged with
        it; traced once per model, kind and arguments."""
        watching = self.agreement.watching()  # an exchange carries the preemption flag then
        key = (tuple(id(v) for v in [*weights, *state]), kind, last, watching,
               self.counts_rows)
        if key not in self.functions:
            if not self.replicas.many:
                self.functions[key] = lambda *arguments: None
            else:
                work = _Work(self, weights, list(state), last)
                counted = kind in ("sync", "exchange", "state")  # the model average's bytes: sent
                self.functions[key] = self.replicas.compile(getattr(work, kind), counted)
        return self.functions[key]


class _Work:
    """The replica-context work of one fragment's synchronisation of one model."""

    def __init__(self, fragment, weights, state, last):
        self.fragment, self.state, self.last = fragment, state, last
        self.weights = [weights[i] for i in fragment.ids]

    def sync(self, step):
        """send, exchange and apply at once (no overlap)."""
        self._apply(self._reduce(self._outgoing(), step))

    def state(self, step):
        """The other state alone (per-replica Keras state, optimizer slots) averaged."""
        self._reduce([], step)

    def send(self):
        for buffer, value in zip(self.fragment.sent, self._outgoing()):
            buffer.assign(value)
        self.fragment.agreement.stage()

    def exchange(self, step):
        fragment = self.fragment
        means = self._reduce([b.read_value() for b in fragment.sent], step)
        for buffer, mean in zip(fragment.received, means):
            buffer.assign(mean)
        fragment.agreement.carry(fragment.replicas.communicator())

    def apply(self, mix):
        """weights := `mix` (a scalar tensor) x the local weights + (1 - `mix`) x the
        synchronised ones."""
        self._apply([b.read_value() for b in self.fragment.received], mix)

    def _outgoing(self):
        """What the replica contributes: its weights (plain averaging), or its change since
        the anchors; weighted by its island's samples (heterogeneous islands)."""
        anchors = self.fragment.anchors
        if anchors is None:
            values = [w.read_value() for w in self.weights]
        else:
            values = [tf.cast(w.read_value(), tf.float32) - anchors.tensors[i]
                      for i, w in zip(self.fragment.ids, self.weights)]
        pacing = self.fragment.pacing
        if pacing is not None:
            return pacing.weigh(values)
        weight = self._row_weight()
        return values if weight is None else [v * tf.cast(weight, v.dtype) for v in values]

    def _row_weight(self):
        """This replica's rows since the last synchronisation times the replicas over all
        replicas' (1.0 where none were counted), the count started again; None where no
        step counts rows (your own loop: no collective added) and between islands
        exchanging hierarchically (weighed by island)."""
        fragment = self.fragment
        if fragment.islands is not None or not fragment.counts_rows:
            return None
        rows = fragment.rows.read_value()
        comm = fragment.replicas.communicator()
        total = comm.all_reduce([rows])[0]
        fragment.rows.assign(tf.zeros_like(rows))
        return tf.where(total > 0, rows * comm.num_replicas / tf.maximum(total, 1.0), 1.0)

    def _reduce(self, values, step):
        """The mean over replicas and workers of `values`, and of the state (plain)."""
        fragment = self.fragment
        comm = fragment.replicas.communicator()
        plain = values if fragment.exchange_hook is None and fragment.islands is None else []
        means = comm.mean(plain + [v.read_value() for v in self.state]) if (
            plain or self.state) else []
        for variable, mean in zip(self.state, means[len(plain):]):
            variable.assign(mean)
        if plain or not values:
            return means[:len(plain)]
        if fragment.islands is not None:
            summed = self._across_islands(values, step)
        else:
            anchors = [fragment.anchors.tensors[i] for i in fragment.ids]
            summed = fragment.exchange_hook.exchange(values, anchors, step)
        return [s / comm.num_replicas for s in summed]

    def _across_islands(self, values, step):
        """The sum over every replica of `values`, hierarchically: each replica exchanges
        its island's share between islands, the island assembles them."""
        islands, hook = self.fragment.islands, self.fragment.exchange_hook
        shard = islands.shard(values)
        if hook is None:
            summed = self.fragment.replicas.communicator(islands.across).all_reduce([shard])
        else:
            summed = hook.exchange_dense([shard], step, context=islands.across)
        return islands.assemble(summed[0], values)

    def _apply(self, means, mix=None):
        anchors = self.fragment.anchors
        targets = means if anchors is None else anchors.step(self.fragment.ids, means,
                                                             self.last)
        for weight, target in zip(self.weights, targets):
            target = tf.cast(target, weight.dtype)
            if mix is not None:
                share = tf.cast(mix, weight.dtype)
                target = tf.where(share > 0, share * weight.read_value() + (1 - share) * target,
                                  target)
            weight.assign(target)
