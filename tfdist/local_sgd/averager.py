"""Local SGD and DiLoCo: replicas train on their own and synchronise every `period` steps.

Stich 2019, "Local SGD Converges Fast and Communicates Little"; post-local SGD: Lin et
al. 2020, "Don't Use Large Mini-Batches, Use Local SGD" — `warmup_steps` of ordinary
synchronous training first. PyTorch's `PeriodicModelAverager` is the model.

Between synchronisations there is no gradient exchange at all: each replica applies its
own gradient (the exchange hook returns it, scaled back from Keras' 1/replicas loss
share), so replicas — and workers — really hold different weights. Every `period` steps,
and before anything reads the model (validation, checkpoints, the end of an epoch or of
training), they synchronise:

- plain local SGD: the weights become their mean over all replicas and workers — one
  all-reduce of the model instead of `period` all-reduces of the gradients;
- DiLoCo (Douillard et al. 2023, arXiv 2311.08105; `outer`): the mean change since the
  last synchronisation is a pseudo-gradient that an outer optimizer (Nesterov momentum)
  applies to the last synchronised weights, the *anchors*;
- Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512): `fragments` synchronise at
  staggered steps, and with `overlap_steps` τ a fragment's exchange runs in a background
  thread beside the next τ steps, its result merged then (`overlap_mix`).

The exchange may be compressed: the replicas then send their compressed *change* since
the anchors (which compresses like a gradient; the weights themselves would not) and all
add the same decoded mean to the same anchors, so they end identical.

Islands of workers (`islands`) decide their local steps among themselves: the step's
finiteness verdict rides the island's own gradient sum, so no collective crosses between
islands between two synchronisations. A loss-scale skip is then one island's, so the
schedule counts the steps each island *attempted* (the same count everywhere), and the
islands agree at each synchronisation on what they could not agree on every step: a
preemption signal (saved at that step on every worker) and a refused step without loss
scaling (every worker fails there, none is left waiting in a collective).
"""

import types

import keras
import tensorflow as tf

from tfdist.capabilities import names_with
from tfdist.checkpoint import CheckpointError
from tfdist.compression.auto import QUALITY, AutoCompression
from tfdist.compression.factory import build
from tfdist.config.load import local_sgd_from_dict
from tfdist.config.yaml_source import Source
from tfdist.core import gradients, transaction, wire
from tfdist.core.hooks import TrainingHook, all_reduce_sum
from tfdist.core.overlap import Background
from tfdist.core.preemption import preemption
from tfdist.core.tracing import do_not_convert, plain_function
from tfdist.core.variables import optimizer_slots, per_replica_state, underlying
from tfdist.errors import UnsupportedError
from tfdist.local_sgd import fragments as fragmenting
from tfdist.local_sgd import go_local
from tfdist.local_sgd.islands import IslandReduce
from tfdist.local_sgd.pace import IslandPace
from tfdist.local_sgd.outer import is_plain_average, outer_optimizer
from tfdist.strategies.kind import capabilities_of
from tfdist.strategies.task import is_chief


class ModelAverager(TrainingHook):
    """Local SGD and DiLoCo, as a `TrainingHook`: the same object in `model.fit`,
    `tfdist.Trainer` and your own loop (`tfdist.function`).

    Args:
        period: local steps between two synchronisations (1: as synchronous as plain SGD).
        warmup_steps: synchronous steps (gradients all-reduced) before local steps start.
        average_non_trainable: also average per-replica Keras state (BatchNormalization
            statistics) at each synchronisation, not only at the end of each epoch.
        average_optimizer_state: also average the optimizer's slots (momenta).
        compression: compress the exchange — a compressor name, a `compression:`
            section or a `GradientCompression` hook.
        outer: DiLoCo's outer optimizer (`tfdist.local_sgd.outer`): None — plain
            averaging —, a name ("nesterov": the paper's, learning rate 0.7, momentum 0.9),
            a mapping {name, **options of that Keras optimizer} or a Keras optimizer.
        fragments: synchronise the model in this many parts at staggered steps, each
            once per period (Streaming DiLoCo).
        overlap_steps: a fragment's exchange runs beside this many inner steps and is
            applied after them (0: at once).
        overlap_mix: after an overlapped exchange a fragment's weights become
            `overlap_mix` × its local weights + (1 - `overlap_mix`) × the synchronised
            ones (Streaming DiLoCo's α; 0 drops the τ local steps).
        warmup_compression: the warm-up's gradient exchange (a compressor name, a
            `compression:` section or a hook; None: uncompressed), e.g. top-k with error
            feedback: the synchronous steps are where local SGD and DiLoCo send most.
        islands: groups of workers that all-reduce their gradients every step and
            synchronise with the other groups as above (`tfdist.local_sgd.islands`): a
            count of equal groups, "host", or lists of worker indices; None: every
            replica on its own.
        island_steps: heterogeneous islands — the local steps each island trains per
            period (one count per island, each at most `period`): a slower island trains
            on that many of the period's step calls, spread evenly, and on the others
            trains nothing (fit and the Trainer read no batch then; your own loop's is
            dropped), so it reaches each synchronisation when the faster ones do; the outer
            mean weighs each island by the samples it trained on in the last period
            (HeLoCo-style). "auto": measured — each island times its step calls, the
            islands agree on the times at their synchronisations, and from the next period
            the fastest trains every call and each other one as many as fit in the fastest
            one's period (`tfdist.local_sgd.pace`). Islands of workers only.
    """

    replaces_exchange = True
    replicas_apart = True

    def __init__(self, period, warmup_steps=0, average_non_trainable=False,
                 average_optimizer_state=False, compression=None, outer=None, fragments=1,
                 overlap_steps=0, overlap_mix=0.5, islands=None, warmup_compression=None,
                 island_steps=None):
        checked = _checked_arguments(
            period=period, warmup_steps=warmup_steps, fragments=fragments,
            overlap_steps=overlap_steps, overlap_mix=overlap_mix, outer=outer,
            average_non_trainable=average_non_trainable, compression=compression,
            average_optimizer_state=average_optimizer_state, islands=islands,
            warmup_compression=warmup_compression, island_steps=island_steps)
        self.period = checked.period
        #: `warmup_steps: auto`: synchronous until `go_local` decides (`_judge_going_local`)
        self.auto_warmup = checked.warmup_steps == "auto"
        self.warmup_steps = NOT_YET if self.auto_warmup else checked.warmup_steps
        self.going_local = []  # auto: one dict per judgement (`_judge_going_local`)
        self.average_non_trainable = checked.average_non_trainable
        self.average_optimizer_state = checked.average_optimizer_state
        self.compression = _compression_hook(compression)
        self.warmup_exchange = _compression_hook(  # warmup_steps: auto implies auto's
            checked.warmup_compression if warmup_compression is None else warmup_compression)
        if (self.warmup_exchange is not None and self.warmup_exchange.phased
                and not isinstance(self.warmup_exchange, AutoCompression)):
            raise ValueError("the warm-up's exchange has no phases of its own (no ratio "
                             "warm-up); warmup_steps is its schedule. Received: "
                             f"warmup_compression={warmup_compression!r}")
        if self.auto_warmup and not isinstance(self.warmup_exchange, AutoCompression):
            raise ValueError("warmup_steps='auto' decides from compression: auto's "
                             "measurements, so the warm-up exchanges as auto chooses. "
                             f"Received: warmup_compression={warmup_compression!r}")
        self.outer = None if is_plain_average(outer) else outer
        if self.outer is not None:
            outer_optimizer(self.outer)  # an unknown name or option fails here, not in build
        self.fragments, self.overlap_steps = checked.fragments, checked.overlap_steps
        self.overlap_mix = checked.overlap_mix
        self.islands, self.island_reduce = checked.islands, None
        self.island_steps = checked.island_steps
        self.pace = None  # heterogeneous islands' counts of trained calls (IslandPace)
        self.phased = self.warmup_steps > 0  # (NOT_YET with auto)
        self._differ = set()  # the fragments whose replicas may hold different weights
        self.averages = 0    # synchronisations done (the step counter of a compressed one)
        self.strategy, self.anchors, self.outer_optimizer, self._functions = None, None, None, {}
        self._last_steps_done = None
        self._in_flight = {}  # fragment -> the local step to apply its exchange at
        self._background = None
        self.island_verdict = False  # islands of workers decide their local steps alone
        self.across = None  # the replicas at one place in every island (`CrossIslands`)
        self._agree_functions = {}

    @classmethod
    def from_config(cls, config, **overrides):
        """From a `LocalSGDConfig` (the config's `local_sgd:` section)."""
        return cls(**{**vars(config), **overrides})

    def __repr__(self):
        warmup = "auto" if self.auto_warmup else self.warmup_steps
        return (f"ModelAverager(period={self.period}, warmup_steps={warmup!r}, "
                f"islands={self.islands!r}, island_steps={self.island_steps!r}, "
                f"compression={self.compression.compressor.name if self.compression else None}"
                f", outer={self.outer!r}, fragments={self.fragments}, "
                f"overlap_steps={self.overlap_steps})")

    # --- the training step ------------------------------------------------------------

    def build(self, strategy, variables):
        if strategy.num_replicas_in_sync > 1 and not capabilities_of(strategy).local_sgd:
            raise UnsupportedError(
                "local SGD needs replicas that hold their own copy of the weights "
                f"([{', '.join(names_with('local_sgd'))}]); under "
                f"{type(strategy).__name__} variables are stored once. Received: "
                f"strategy={type(strategy).__name__}")
        self.strategy, self.anchored = strategy, False
        if self.islands is not None and strategy.num_replicas_in_sync > 1:
            self.island_reduce = IslandReduce(strategy, self.islands)
            # a worker's replicas share one step count and loss scale: islands of
            # replicas on one machine keep the global verdict
            self.island_verdict = self.island_reduce.multi_worker
        if self.island_steps is not None:
            self._weigh_islands(strategy)
        #: Islands of equal size exchange between them hierarchically (`CrossIslands`).
        self.across = self.island_reduce.across if self.island_verdict else None
        if self.island_verdict:
            local = dict(trainable=False, aggregation=tf.VariableAggregation.NONE)
            self._refused = tf.Variable(0.0, name="tfdist_island_refused", **local)
            # this island's measured times (IslandPace.timing), to agree on
            timed = 2 * len(self.island_reduce.groups) if self.island_steps == "auto" else 0
            self._timing = tf.Variable(tf.zeros([timed]), name="tfdist_island_timing", **local)
            # (refused, preempted, times) for an overlapped exchange to carry, and what it
            # carried
            self._staged = tf.Variable(tf.zeros([2 + timed]), name="tfdist_island_staged",
                                       **local)
            self._carried = tf.Variable(tf.zeros([2 + timed]), name="tfdist_island_carried",
                                        **local)
            self._attempts = tf.Variable(0, dtype=tf.int64, name="tfdist_local_attempts",
                                         **local)
        sizes = [int(v.shape.num_elements()) for v in variables]
        self.model_bytes, self.model_sizes = 4 * sum(sizes), sizes
        self.groups = fragmenting.split(sizes, self.fragments)
        self.weights = [underlying(v) for v in variables]
        local = dict(trainable=False, aggregation=tf.VariableAggregation.NONE)
        if self.compression is not None or self.outer is not None:
            self.anchor_variables = [keras.Variable(tf.zeros(v.shape), dtype="float32",
                                                    trainable=False, aggregation="none",
                                                    name="tfdist_anchor") for v in variables]
            self.anchors = [underlying(a) for a in self.anchor_variables]
        if self.outer is not None:
            self.outer_optimizer = outer_optimizer(self.outer)
            self.outer_optimizer.build(self.anchor_variables)
        if isinstance(self.warmup_exchange, AutoCompression):  # never between islands
            self.warmup_exchange.build(strategy, variables)
        elif self.warmup_exchange is not None and self.warmup_steps > 0:
            self.warmup_exchange.build(strategy, variables, shapes=self._across_shapes(sizes))
        if self.compression is not None:
            self.exchanges = [self.compression if i == 0 else build(self.compression.get_config())
                              for i in range(len(self.groups))]
            for hook, group in zip(self.exchanges, self.groups):
                hook.build(strategy, [self.anchors[i] for i in group], shapes=self._across_shapes(
                    [sizes[i] for i in group]))
        if self.overlap_steps:  # what a fragment sent and received, between two steps
            self._background = Background()
            self.sent = [tf.Variable(tf.zeros(v.shape), name="tfdist_sent", **local)
                         for v in variables]
            self.received = [tf.Variable(tf.zeros(v.shape), name="tfdist_received", **local)
                             for v in variables]

    def _across_shapes(self, sizes):
        """The shapes a fragment of weights of `sizes` values is exchanged in: one shard
        per replica between islands (`IslandReduce.shard`), else the weights' own."""
        if self.across is None:
            return None
        return [(self.island_reduce.shard_size([(n,) for n in sizes]),)]

    def _weigh_islands(self, strategy):
        """The islands' pace (`IslandPace`: the calls each island trains per period), and
        the factor this island's replicas' changes take so that the outer mean weighs every
        island by its samples."""
        islands = self.island_reduce.groups if self.island_reduce is not None else None
        if not self.island_verdict:
            raise UnsupportedError(
                "island_steps needs islands of workers (a multi-worker job): a machine's "
                "replicas share one loop and train at one pace. Received: "
                f"island_steps={self.island_steps!r} on {type(strategy).__name__}")
        if self.island_steps != "auto" and len(islands) != len(self.island_steps):
            raise UnsupportedError(
                f"island_steps: one count per island; the job's islands are {islands}, "
                f"island_steps lists {len(self.island_steps)}: {list(self.island_steps)}")
        self.pace = IslandPace(self.island_steps, self.period, self.island_reduce.sizes(),
                               self.island_reduce.own)
        self._outgoing_scale = tf.Variable(1.0, trainable=False, name="tfdist_island_weight",
                                           aggregation=tf.VariableAggregation.NONE)

    def couples_workers(self):
        return not (self.island_verdict and self.current_phase is False)

    def trains_next(self):
        """Whether this worker trains on its next step call: a local step of an island
        that trains some of each period's calls (evenly spread, `IslandPace`) trains
        nothing on the others (`skipped`)."""
        if self.pace is None or self.current_phase is not False:
            return True
        return self.pace.trains_next(int(self._attempts.numpy()))

    def skipped(self):
        """A step call that trained nothing still counts in the schedule."""
        self._attempts.assign_add(1)
        self.pace.skipping()

    def saveables(self):
        """The outer optimizer (its momentum and step): `BackupAndRestore` resumes it. The
        anchors are the weights right after a synchronisation, which a backup follows."""
        return [self.outer_optimizer] if self.outer_optimizer is not None else []

    def replica_state(self):
        """Each replica's own weights, the anchors, an overlapped exchange's buffers and
        the compressed exchanges' state (e.g. error-feedback residuals): a backup between
        two synchronisations resumes every replica where it was."""
        exchanges = list(self.exchanges) if self.compression is not None else []
        if self.warmup_exchange is not None:
            exchanges.append(self.warmup_exchange)
        buffers = (self.sent + self.received) if self.overlap_steps else []
        return [*self.weights, *(self.anchors or []), *buffers,
                *(v for hook in exchanges for v in hook.replica_state())]

    def before_backup(self, model, steps_done):
        """The replicas stay apart (the backup keeps each one's weights), after this step's
        synchronisations (`after_step`, if a callback listed before LocalSGD saves); an
        overlapped exchange in flight is waited for, so its result is in the backup."""
        self.after_step(model, steps_done)  # once per step count: a no-op if it ran
        if self._background is not None:
            self._background.wait()

    def checkpoint_state(self):
        """Where the synchronisation schedule stands (the same on every worker)."""
        state = {"averages": self.averages, "anchored": bool(self.anchored),
                 "differ": sorted(self._differ),
                 "in_flight": sorted([f, at] for f, at in self._in_flight.items())}
        if self.island_verdict:
            state["attempts"] = int(self._attempts.numpy())
        if self.pace is not None:
            state["pace"] = self.pace.state()
        if self.auto_warmup:  # when local steps began (None: not yet)
            state["warmup_steps"] = None if self.warmup_steps == NOT_YET else self.warmup_steps
        if isinstance(self.warmup_exchange, AutoCompression):  # auto's kept choice
            state["auto"] = self.warmup_exchange.checkpoint_state()
        return state

    def restore_checkpoint_state(self, state):
        """Takes back `checkpoint_state()`; anything else is a one-line CheckpointError."""
        fragments = range(len(self.groups))

        def fragment(value):
            return type(value) is int and value in fragments

        keys = {"averages", "anchored", "differ", "in_flight"} | (
            {"attempts"} if self.island_verdict else set()) | (
            {"pace"} if self.pace is not None else set()) | (
            {"warmup_steps"} if self.auto_warmup else set()) | (
            {"auto"} if isinstance(self.warmup_exchange, AutoCompression) else set())
        valid = (isinstance(state, dict) and set(state) == keys
                 and all(type(state.get(k, 0)) is int and 0 <= state.get(k, 0) < 2**31
                         for k in ("averages", "attempts"))
                 and type(state["anchored"]) is bool
                 and isinstance(state["differ"], list) and all(map(fragment, state["differ"]))
                 and isinstance(state["in_flight"], list) and all(
                     isinstance(p, list) and len(p) == 2 and fragment(p[0])
                     and type(p[1]) is int and 0 <= p[1] < 2**62 for p in state["in_flight"])
                 and (self.pace is None or self.pace.valid(state["pace"]))
                 and (not self.auto_warmup or state["warmup_steps"] is None or (
                     type(state["warmup_steps"]) is int and 0 <= state["warmup_steps"] < 2**62)))
        if not valid:
            raise CheckpointError(f"the backup's local SGD schedule cannot be used with "
                                  f"{len(self.groups)} fragment(s): {str(state)[:200]}")
        self.averages, self.anchored = state["averages"], state["anchored"]
        self._differ = set(state["differ"])
        self._in_flight = {f: at for f, at in state["in_flight"]}
        if self.island_verdict:
            self._attempts.assign(state["attempts"])
        if self.pace is not None:
            self.pace.restore(state["pace"])
        if self.auto_warmup:
            self.warmup_steps = (NOT_YET if state["warmup_steps"] is None
                                 else state["warmup_steps"])
        if "auto" in keys and state["auto"] is not None:
            self.warmup_exchange.restore_checkpoint_state(state["auto"])

    def prepare(self, step):
        """During the warm-up, auto's exchange prepares (its first step: the link timed);
        `warmup_steps: auto` judges there, before step 0, whether to go local at once."""
        if step < self.warmup_steps and isinstance(self.warmup_exchange, AutoCompression):
            self.warmup_exchange.prepare(step)
            if self.auto_warmup and step == 0:
                self._judge_local_from_first_step()

    def phase(self, step):
        """Synchronous during the warm-up (True; with auto's exchange, the name of the
        method it exchanges with), local (False) after it."""
        if step >= self.warmup_steps:
            return False
        if isinstance(self.warmup_exchange, AutoCompression):
            return self.warmup_exchange.phase(step)
        return True

    def enter_phase(self, phase):
        super().enter_phase(phase)
        if isinstance(phase, str):  # auto's choice for the synchronous steps
            self.warmup_exchange.enter_phase(phase)
        if not phase and self.anchors is not None and not self.anchored:
            self._anchor()  # the replicas are in sync here: the last step was synchronous

    def _anchor(self):
        """Anchors := the (identical) weights of every replica, where local steps start."""
        def copy():
            for anchor, weight in zip(self.anchors, self.weights):
                anchor.assign(tf.cast(weight.read_value(), tf.float32))

        plain_function(lambda: self.strategy.run(copy))()
        self.anchored = True

    @do_not_convert
    def exchange(self, grads, variables, step):
        synchronous = (self.warmup_steps > 0 if self.current_phase is None
                       else self.current_phase is not False)
        if synchronous:  # the warm-up
            if self.across is not None:
                return self._warmup_across_islands(grads, step)
            if self.warmup_exchange is not None:
                return self.warmup_exchange.exchange(grads, variables, step)
            return all_reduce_sum(grads)
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        if self.island_reduce is None:  # this replica's own mean (an embedding's rows kept)
            return [gradients.scaled(g, replicas) for g in grads]
        grads = [tf.convert_to_tensor(g) for g in grads]  # an island sums dense tensors
        decision = transaction.current()
        riders = []
        if self.island_verdict and decision is not None and not decision.settled:
            riders = [decision.local]  # the island decides its step alone
        summed = self.island_reduce.sum(grads + riders)
        if riders:
            decision.settle_within(summed[-1], self._defer_refusal)
        scale = replicas / self.island_reduce.replica_island_size()  # the island's mean
        return [g * tf.cast(scale, g.dtype) for g in summed[:len(grads)]]

    def _warmup_across_islands(self, grads, step):
        """A synchronous step between islands of equal size, hierarchically: the gradients
        (and the step's verdict) summed inside each island, each replica's share of its
        island's sum exchanged between islands (`warmup_compression`, if any), the shares
        put back together inside the island."""
        grads = [tf.convert_to_tensor(g) for g in grads]
        decision = transaction.current()
        riders = decision.riders() if decision is not None and not decision.settled else []
        summed = self.island_reduce.sum(grads + riders)
        if riders:  # one replica of each island adds its island's count: every replica's
            decision.settle(wire.all_reduce(self.across, tf.distribute.ReduceOp.SUM,
                                            summed[len(grads):]))
        shard = self.island_reduce.shard(summed[:len(grads)], times=1)
        if self.warmup_exchange is None:
            total = wire.all_reduce(self.across, tf.distribute.ReduceOp.SUM, [shard])
        else:
            total = self.warmup_exchange.exchange_dense([shard], step, context=self.across)
        return self.island_reduce.assemble(total[0], grads)

    def _defer_refusal(self, committed):
        """(replica context) Counts a refused local step, for the next synchronisation."""
        share = 1.0 / self.island_reduce.replica_island_size()  # the island's, once
        return self._refused.assign_add((1.0 - tf.cast(committed, tf.float32)) * share)

    def on_step_end(self, step):
        if self.island_verdict and self.current_phase is False:  # a local step, tried
            self._attempts.assign_add(1)
        return None

    def bytes_per_step(self, step=None):
        """Like `GradientCompression.bytes_per_step`: after the warm-up, one synchronisation
        of the trainable weights (compressed or not) every `period` steps."""
        dense = {"payload": self.model_bytes, "dense": self.model_bytes, "gathered": 0}
        if self.across is not None:  # between islands, a share of the model per replica
            dense["payload"] = 4 * sum(self._across_shapes([self.model_sizes[i] for i in g])[0][0]
                                       for g in self.groups)
        if step is not None and step < self.warmup_steps:
            return dense if self.warmup_exchange is None else self.warmup_exchange.bytes_per_step()
        sent = dense if self.compression is None else {
            k: sum(h.bytes_per_step()[k] for h in self.exchanges) for k in ("payload", "gathered")}
        return {"payload": sent["payload"] / self.period, "dense": self.model_bytes,
                "gathered": sent["gathered"] / self.period}

    # --- between steps ----------------------------------------------------------------

    def after_step(self, model, steps_done):
        """Synchronises the fragments that are due `period` local steps after the warm-up,
        and applies the overlapped exchanges that have run beside `overlap_steps` steps.
        (Called again with the same count — micro-batches of an accumulated step — it
        waits.)"""
        if self.island_verdict and steps_done >= self.warmup_steps:
            steps_done = self.warmup_steps + int(self._attempts.numpy())  # skips count too
        if steps_done == self._last_steps_done:
            return
        self._last_steps_done = steps_done
        if steps_done <= self.warmup_steps:  # the steps so far were synchronous
            if isinstance(self.warmup_exchange, AutoCompression):  # auto measures, chooses
                self.warmup_exchange.after_step(model, steps_done)
            if self.auto_warmup:
                self._judge_going_local(steps_done)
            return
        local = steps_done - self.warmup_steps
        if self.pace is None:
            self._synchronise_due(model, local)
            return
        self.pace.call_ended(local)
        self._synchronise_due(model, local)
        if local % self.period == 0 and self.pace.begin_period(local // self.period):
            self._say_pace(local)
        self.pace.resume()

    def _judge_going_local(self, steps_done):
        """`warmup_steps: auto`: once auto has measured the choice it keeps, whether local
        steps would reach accuracy sooner (`go_local`); if so they begin with the next step.
        Every worker judges the same numbers (auto's are averaged over the workers)."""
        auto = self.warmup_exchange
        decisions = [d for d in auto.decisions if "compute_seconds" in d]  # not restored
        if (self.warmup_steps != NOT_YET or not auto.kept or not decisions
                or sum(not j["first_step"] for j in self.going_local) == len(decisions)):
            return
        decision = decisions[-1]
        sync = go_local.sync_seconds(self, auto.link, auto.workers)
        local = go_local.local_step_seconds(decision["compute_seconds"], sync, self.period,
                                            self.fragments, self.overlap_steps)
        trace = decision.get("trace_seconds") or 0.0
        switch = go_local.switch_seconds(trace)
        remaining = (None if self.planned_steps is None
                     else max(self.planned_steps - steps_done, 0))
        steps = QUALITY["steps"][auto.choice]
        to_target = go_local.seconds_to_target(local, decision["measured"], steps, remaining,
                                               switch)
        going = go_local.goes_local(*to_target, auto.min_gain)
        self.going_local.append({"step": steps_done, "first_step": False, "local_seconds": local,
                                 "sync_seconds": sync, "synchronous": auto.choice,
                                 "synchronous_seconds": decision["measured"],
                                 "switch_seconds": switch, "remaining_steps": remaining,
                                 "to_target": to_target, "local": going})
        if going:
            self.warmup_steps = steps_done
        if is_chief(self.strategy):
            verdict = "local steps begin" if going else "staying synchronous"
            weighed = ("per step of none's (the run's length is not planned: the switch's "
                       f"{switch:.1f} s not weighed)" if remaining is None else
                       f"over the {remaining} steps the run plans, switching {switch:.1f} s "
                       f"({go_local.SWITCH_TRACES} x the first step's trace, {trace:.3f} s)")
            print(f"tfdist local_sgd warmup_steps auto at step {steps_done}: local steps "
                  f"predicted {local:.3f} s x {go_local.LOCAL_STEPS:.2f} steps to accuracy "
                  f"(synchronisation {sync:.3f} s every {self.period}) against "
                  f"{auto.choice} measured {decision['measured']:.3f} s x {steps:.2f}: "
                  f"{to_target[0]:.2f} s against {to_target[1]:.2f} s {weighed}; {verdict}",
                  flush=True)

    def _judge_local_from_first_step(self):
        """`warmup_steps: auto`, before the first step, once auto has timed the link:
        whether plain local steps begin at once (`go_local.starts_local`), so no synchronous
        step is traced to be thrown away. Every worker judges the same numbers."""
        auto = self.warmup_exchange
        if (self.going_local or auto.link is None or self.islands is not None
                or not go_local.measured_from_first_step(self.outer, self.period)):
            return False
        sync = go_local.sync_seconds(self, auto.link, auto.workers)
        faster, ratio = go_local.starts_local(
            auto.exchange_seconds(auto.link), sync, self.period, self.fragments,
            self.overlap_steps, auto.min_gain)
        points = go_local.FROM_FIRST_STEP["points"]
        going = faster and points >= -auto.max_quality_loss
        self.going_local.append({"step": 0, "first_step": True, "sync_seconds": sync,
                                 "ratio": ratio, "local": going})
        if going:
            self.warmup_steps = 0
        if is_chief(self.strategy):
            verdict = ("local steps begin" if going else
                       "staying synchronous while auto measures" if not faster else
                       f"staying synchronous: their measured quality ({points:+.1f} points "
                       f"of mean IoU against none) is outside max_quality_loss "
                       f"{auto.max_quality_loss}")
            computes = go_local.PRIOR_COMPUTE
            print(f"tfdist local_sgd warmup_steps auto at step 0: local steps from the first "
                  f"step predicted at most {ratio:.2f} x the best synchronous method's time to "
                  f"accuracy for a step computing {computes[0]:g} to {computes[-1]:g} s "
                  f"(x {go_local.FROM_FIRST_STEP['steps']:.2f} steps, synchronisation "
                  f"{sync:.3f} s every {self.period}) on link {auto.link}; {verdict}",
                  flush=True)
        return going

    def _say_pace(self, local):
        """One line on the chief's standard output when measured counts change."""
        if is_chief(self.strategy):
            seconds = ", ".join(f"{s:.3f}" for s in self.pace.agreed[0])
            print(f"tfdist local_sgd island_steps from local step {local}: "
                  f"{self.pace.counts(local // self.period)} of {self.period} (seconds per "
                  f"step by island: {seconds})", flush=True)

    def _synchronise_due(self, model, local):
        """The synchronisations due after local step `local`."""
        self._differ = set(range(len(self.groups)))  # a local step changed every fragment
        finishing = [f for f, apply_at in self._in_flight.items() if local == apply_at]
        due = fragmenting.due(local, len(self.groups), self.period)
        if (finishing or due) and not self.overlap_steps:  # overlapped: the exchange carries it
            self._agree(f"the synchronisation after local step {local}")
        for fragment in finishing:
            self._finish(model, fragment)
        if finishing and self.island_verdict:
            self._act_on_carried(f"the synchronisation applied after local step {local}")
        for fragment in due:
            self._start(model, fragment, local)

    @property
    def in_sync(self):
        """Whether every replica holds the same weights."""
        return not self._differ

    def before_read(self, model):
        if not self.in_sync:
            self.average(model)

    def average(self, model):
        """Synchronises every replica's weights (and the chosen state) over replicas and
        workers now, after any exchange in flight: one model. Call it on every worker at
        the same point: it runs collectives."""
        if self._in_flight or self._differ:
            self._agree("the synchronisation before the model is read")
        finishing = list(self._in_flight)
        for fragment in finishing:
            self._finish(model, fragment, mix=0.0)
        if finishing and self.island_verdict:
            self._act_on_carried("the synchronisation before the model is read")
        self._run(model, "sync", sorted(self._differ), state=True, last=bool(self._differ))
        self._differ = set()

    def _agree(self, where):
        """Islands of workers: what each island decided alone since the last
        synchronisation — a preemption signal, refused steps — summed over every worker,
        on every worker at the same synchronisation (one scalar all-reduce). A preemption
        is then `preemption().agreed()` after this step; refused steps fail every worker
        here, none left waiting in a collective."""
        if not self.island_verdict:
            return
        watching = preemption().rider() is not None
        if watching not in self._agree_functions:
            self._agree_functions[watching] = self._agreement(watching)
        self._stage_timing()
        refused, timing = self._agree_functions[watching]()
        self._take_agreed(refused, timing, where)

    def _stage_timing(self):
        if self.pace is not None and self.pace.measured:
            self._timing.assign(self.pace.timing())

    def _take_agreed(self, refused, timing, where):
        """Acts on an agreement, the same on every worker: its refused steps fail here;
        measured times go to the pace."""
        if self.pace is not None:
            self.pace.take_agreed([float(t) for t in timing.numpy()])
        refused = round(float(refused))
        if refused:
            raise self._refusal(refused, where)

    def _refusal(self, refused, where):
        return tf.errors.InvalidArgumentError(
            None, None, f"tfdist: a NaN or Inf gradient on some replica: {refused} local "
            "step(s) of an island since the islands last synchronised were refused on "
            "every replica of that island (weights, optimizer state and step counters are "
            f"as before them). The islands agree on it at {where}: every worker stops here.")

    def stage_agreement(self):
        """(replica context, as an overlapped exchange is sent: in program order) What the
        island decided alone since the last exchange — refused steps, its preemption flag —
        for the exchange to carry."""
        flag = preemption().rider()
        refused = self._refused.read_value()
        self._staged.assign_add(tf.concat([
            tf.stack([refused, tf.zeros([]) if flag is None else flag]), self._timing_share()],
            0))
        self._refused.assign_sub(refused)

    def _timing_share(self):
        """(replica context) This replica's share of its island's measured times: summed
        over every replica, each island's mean."""
        return self._timing.read_value() / self.island_reduce.replica_island_size()

    def carry_agreement(self):
        """(replica context, inside an overlapped exchange) The staged agreement summed over
        every worker beside the exchange, so that no synchronisation waits for an agreement
        of its own; acted on where exchanges are applied (`_act_on_carried`), on every
        worker alike."""
        staged = self._staged.read_value()
        summed = wire.all_reduce(tf.distribute.get_replica_context(), tf.distribute.ReduceOp.SUM,
                                 [staged])[0]
        self._staged.assign_sub(staged)  # what a later send staged meanwhile stays
        self._carried.assign_add(summed)

    def _act_on_carried(self, where):
        """At an applied exchange, on every worker alike: a carried preemption is
        `preemption().agreed()` after this step; carried refused steps fail here."""
        watching = preemption().rider() is not None
        key = ("carried", watching)
        if key not in self._agree_functions:
            strategy = self.strategy

            def replica():
                carried = self._carried.read_value()
                with tf.control_dependencies([carried]):
                    self._carried.assign(tf.zeros_like(carried))
                return carried[0], carried[1], carried[2:]

            @plain_function
            def take():
                refused, flags, timing = strategy.run(replica)
                if watching:
                    preemption().record(strategy, flags)
                first = strategy.experimental_local_results
                return first(refused)[0], first(timing)[0]

            self._agree_functions[key] = take
        self._take_agreed(*self._agree_functions[key](), where)

    def _agreement(self, watching):
        strategy = self.strategy

        def replica():
            flag = preemption().rider() if watching else None
            timing = self._timing_share()
            values = [tf.concat([tf.stack([self._refused.read_value()]), timing], 0)] + (
                [flag] if watching else [])
            summed = wire.all_reduce(tf.distribute.get_replica_context(),
                                     tf.distribute.ReduceOp.SUM, values)
            with tf.control_dependencies(summed):
                self._refused.assign(0.0)
            return summed

        @plain_function
        def agree():
            summed = wire.run_counted(strategy, self.wire_meter, replica)
            if watching:
                preemption().record(strategy, summed[1])
            agreed = strategy.experimental_local_results(summed[0])[0]
            return agreed[0], agreed[1:]

        return agree

    def _start(self, model, fragment, local):
        """A fragment's synchronisation: at once, or (`overlap_steps`) its exchange begins
        in the background on what the replicas hold now."""
        last = fragment == len(self.groups) - 1
        if not self.overlap_steps:
            self._run(model, "sync", [fragment], state=last, last=last)
            self._differ.discard(fragment)
            return
        self._run(model, "send", [fragment])
        exchange = self._compiled(model, "exchange", [fragment])
        with self._background.dispatch():  # called here, in program order: the same
            exchange(tf.constant(self.averages, tf.int64))  # collective keys everywhere
        self.averages += 1
        self._in_flight[fragment] = local + self.overlap_steps

    def _finish(self, model, fragment, mix=None):
        """Applies a fragment's exchange once it has arrived."""
        self._background.wait()  # raises what failed in the background
        del self._in_flight[fragment]
        last = fragment == len(self.groups) - 1
        mix = self.overlap_mix if mix is None else mix
        self._run(model, "apply", [fragment], last=last, mix=mix)
        if mix == 0:
            self._differ.discard(fragment)

    def _run(self, model, kind, fragments, state=False, last=False, mix=0.0):
        function = self._compiled(model, kind, fragments, state, last)
        if self.pace is not None and kind in ("sync", "send"):  # what the change weighs
            local = int(self._attempts.numpy())
            self._outgoing_scale.assign(self.pace.scale(local - self.period, local))
            if kind == "send":
                self._stage_timing()
        if kind == "sync":
            function(tf.constant(self.averages, tf.int64))
            self.averages += 1
        elif kind == "apply":  # the mix is an argument: one trace serves 0 and overlap_mix
            function(tf.constant(mix, tf.float32))
        else:
            function()

    def variables_of(self, model):
        """(trainable weights, other state to average), as tf.Variables."""
        weights = [underlying(v) for v in model.trainable_variables]
        state = []
        if self.average_non_trainable:
            state += per_replica_state(self.strategy, model.non_trainable_variables)
        if self.average_optimizer_state and model.optimizer is not None:
            state += optimizer_slots(model.optimizer)
        return weights, state

    def _compiled(self, model, kind, fragments, state=False, last=False):
        """The compiled function of one `kind` of work (sync, send, exchange, apply) on
        some fragments, traced once per model and arguments."""
        weights, extra = self.variables_of(model)
        watching = preemption().rider() is not None  # an exchange carries the flag then
        key = (tuple(id(v) for v in weights + extra), kind, tuple(fragments), state, last,
               watching)
        if key not in self._functions:
            if self.anchors is not None and len(weights) != len(self.anchors):
                raise ValueError(f"the model has {len(weights)} trainable weights but the "
                                 f"averager was built for {len(self.anchors)}; use one "
                                 "averager per model")
            ids = [i for f in fragments for i in self.groups[f]]
            plan = _Plan(self, weights, extra if state else [], ids, fragments, last)
            self._functions[key] = plan.function(kind)
        return self._functions[key]


class _Plan:
    """The replica-context work of synchronising some fragments of one model."""

    def __init__(self, averager, weights, state, ids, fragments, last):
        self.averager, self.weights, self.state = averager, weights, state
        self.ids, self.fragments, self.last = ids, fragments, last

    def function(self, kind):
        strategy = self.averager.strategy
        if strategy.num_replicas_in_sync < 2:
            return lambda *arguments: None
        if kind in ("sync", "exchange"):
            body = self.sync if kind == "sync" else self.exchange
            meter = self.averager.wire_meter  # the model average's bytes count as sent
            return plain_function(lambda step: wire.run_counted(strategy, meter, body, (step,)))
        if kind == "send":
            return plain_function(lambda: strategy.run(self.send))
        return plain_function(lambda mix: strategy.run(lambda: self.apply(mix=mix)))

    def sync(self, step):
        """send, exchange and apply at once (no overlap)."""
        self.apply(self.reduce(self.outgoing(), step))

    def send(self):
        for i, value in zip(self.ids, self.outgoing()):
            self.averager.sent[i].assign(value)
        if self.averager.island_verdict:
            self.averager.stage_agreement()

    def exchange(self, step):
        means = self.reduce([self.averager.sent[i].read_value() for i in self.ids], step)
        for i, mean in zip(self.ids, means):
            self.averager.received[i].assign(mean)
        if self.averager.island_verdict:
            self.averager.carry_agreement()

    def outgoing(self):
        """What the replica contributes: its weights (plain averaging), or its change
        since the anchors."""
        a = self.averager
        if a.anchors is None:
            values = [self.weights[i].read_value() for i in self.ids]
        else:
            values = [tf.cast(self.weights[i].read_value(), tf.float32) - a.anchors[i]
                      for i in self.ids]
        if a.pace is None:
            return values
        scale = a._outgoing_scale.read_value()  # samples-weighted (IslandPace.scale)
        return [v * tf.cast(scale, v.dtype) for v in values]

    def reduce(self, values, step):
        """The mean over replicas and workers of `values`, and of the state (plain)."""
        a, context = self.averager, tf.distribute.get_replica_context()
        plain = values if a.compression is None and a.across is None else []
        means = wire.all_reduce(context, tf.distribute.ReduceOp.MEAN, plain + [
            v.read_value() for v in self.state]) if plain or self.state else []
        for variable, mean in zip(self.state, means[len(plain):]):
            variable.assign(mean)
        if a.compression is None and a.across is None:
            return means[:len(plain)]
        summed, start = [], 0
        for fragment in self.fragments:
            count = len(a.groups[fragment])
            part, start = values[start:start + count], start + count
            if a.across is not None:
                summed += self._across_islands(fragment, part, step)
            else:
                summed += a.exchanges[fragment].exchange(
                    part, [a.anchors[i] for i in a.groups[fragment]], step)
        return [s / context.num_replicas_in_sync for s in summed]

    def _across_islands(self, fragment, values, step):
        """The sum over every replica of one fragment's `values`, hierarchically: each
        replica exchanges its island's share between islands, the island assembles them."""
        a = self.averager
        shard = a.island_reduce.shard(values)
        if a.compression is None:
            summed = wire.all_reduce(a.across, tf.distribute.ReduceOp.SUM, [shard])
        else:
            summed = a.exchanges[fragment].exchange_dense([shard], step, context=a.across)
        return a.island_reduce.assemble(summed[0], values)

    def apply(self, means=None, mix=None):
        """Anchors (if any) := the anchors moved by the mean change (outer optimizer or
        plain sum); weights := the anchors — or the mean —, or `mix` (a scalar tensor) x
        the local weights + (1 - `mix`) x those."""
        a = self.averager
        if means is None:
            means = [a.received[i].read_value() for i in self.ids]
        if a.anchors is None:
            targets = means
        elif a.outer_optimizer is None:
            for i, mean in zip(self.ids, means):
                a.anchors[i].assign_add(mean)
            targets = [a.anchors[i].read_value() for i in self.ids]
        else:
            outer = a.outer_optimizer
            rate = outer.learning_rate
            for i, mean in zip(self.ids, means):  # the pseudo-gradient: anchor - mean weight
                outer.update_step(-mean, a.anchor_variables[i], rate)
            if self.last:
                outer.iterations.assign_add(1)
            targets = [a.anchors[i].read_value() for i in self.ids]
        for i, target in zip(self.ids, targets):
            weight = self.weights[i]
            target = tf.cast(target, weight.dtype)
            if mix is not None:
                local = weight.read_value()
                share = tf.cast(mix, weight.dtype)
                target = tf.where(share > 0, share * local + (1 - share) * target, target)
            weight.assign(target)


#: `warmup_steps` while `warmup_steps: auto` has not decided (a count no run reaches).
NOT_YET = 1 << 62


def _checked_arguments(**arguments):
    """ModelAverager's arguments as a `LocalSGDConfig`, checked by the config loader's
    own checks of the `local_sgd:` section (refused exactly when a config file's would be);
    an outer optimizer or compression given as an object is checked where it is used."""
    objects = ("outer", "compression", "warmup_compression")
    section = {k: v for k, v in arguments.items() if k not in objects
               and not (k == "islands" and v is None)}
    for key in objects:
        value = arguments[key]
        if isinstance(value, (dict, types.MappingProxyType)):
            section[key] = dict(value)
        elif isinstance(value, str):
            section[key] = value
    return local_sgd_from_dict(section, source=Source.of_call("ModelAverager"))


def _compression_hook(compression):
    if compression is None:
        return None
    hook = build(compression)
    if not hook.compressor.compresses:
        return None
    if getattr(hook, "start_step", 0) > 0:
        raise ValueError("a compressed model average has no delayed start; warm up with "
                         f"warmup_steps instead. Received: start_step={hook.start_step}")
    return hook


def DiLoCo(period, outer="nesterov", **options):  # noqa: N802 (a configuration, like a class)
    """DiLoCo (Douillard et al. 2023): `ModelAverager` with the paper's outer Nesterov
    momentum by default; `fragments`, `overlap_steps` and `compression` make it Streaming
    DiLoCo (Douillard et al. 2025)."""
    return ModelAverager(period, outer=outer, **options)
