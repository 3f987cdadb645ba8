"""The islands' agreement: what islands of workers decide alone between two
synchronisations, agreed on at the next one.

Islands of workers decide their local steps among themselves: the step's finiteness
verdict rides the island's own gradient sum, so no collective crosses between islands
between two synchronisations. The islands then agree at each synchronisation on what they
could not agree on every step (one scalar all-reduce, or riding an overlapped exchange):
a preemption signal (saved at that step on every worker), refused steps without loss
scaling (every worker fails there, none left waiting in a collective), and heterogeneous
islands' measured times (`Pacing`). Without islands of workers, `NoIslands` does nothing.
"""

import tensorflow as tf

from tfdist.local_sgd.pace import IslandPace
from tfdist.report import say
from tfdist.step import wire
from tfdist.step.preemption import preemption
from tfdist.step.tracing import plain_function
from tfdist.strategies.task import is_chief

_LOCAL = dict(trainable=False, aggregation=tf.VariableAggregation.NONE)


class NoIslands:
    """The agreement of a job without islands of workers: every step's verdict is global,
    so there is nothing to agree on; the schedule counts the steps done."""

    pacing = None
    decides_alone = False

    def watching(self):
        return False

    def steps(self, steps_done, warmup_steps):
        """The schedule's count of steps after `steps_done` optimizer steps."""
        return steps_done

    def count_attempt(self):
        pass

    def agree(self, where):
        pass

    def act_on_carried(self, where):
        pass

    def stage(self):
        pass

    def carry(self, comm):
        pass

    def state(self):
        return {}

    def valid(self, state):
        return True

    def restore(self, state):
        pass


class IslandAgreement(NoIslands):
    """Islands of workers (`IslandReduce` over several workers): they decide their local
    steps alone and agree at each synchronisation.

    Args:
        strategy: the job's strategy.
        islands: `IslandReduce`.
        pacing: `Pacing` of heterogeneous islands, or None.
    """

    decides_alone = True

    def __init__(self, strategy, islands, pacing=None, meter=None):
        self.strategy, self.islands, self.pacing, self.meter = strategy, islands, pacing, meter
        timed = 2 * len(islands.groups) if pacing is not None and pacing.pace.measured else 0
        self.refused = tf.Variable(0.0, name="tfdist_island_refused", **_LOCAL)
        # this island's measured times (IslandPace.timing), to agree on
        self.timing = tf.Variable(tf.zeros([timed]), name="tfdist_island_timing", **_LOCAL)
        # (refused, preempted, times) for an overlapped exchange to carry, and what it carried
        self.staged = tf.Variable(tf.zeros([2 + timed]), name="tfdist_island_staged", **_LOCAL)
        self.carried = tf.Variable(tf.zeros([2 + timed]), name="tfdist_island_carried",
                                   **_LOCAL)
        self.attempts = tf.Variable(0, dtype=tf.int64, name="tfdist_local_attempts", **_LOCAL)
        self._functions = {}

    def watching(self):
        return preemption().rider() is not None

    def steps(self, steps_done, warmup_steps):
        """After the warm-up the steps each island *attempted*: a loss-scale skip is one
        island's, so a skipped step counts too (the same count everywhere)."""
        if steps_done < warmup_steps:
            return steps_done
        return warmup_steps + int(self.attempts.numpy())

    def count_attempt(self):
        self.attempts.assign_add(1)

    def defer_refusal(self, committed):
        """(replica context) Counts a refused local step, for the next synchronisation."""
        share = 1.0 / self.islands.replica_island_size()  # the island's, once
        return self.refused.assign_add((1.0 - tf.cast(committed, tf.float32)) * share)

    def agree(self, where):
        """Every worker, at the same synchronisation: what each island decided alone summed
        over every worker (one all-reduce). A preemption is then `preemption().agreed()`
        after this step; refused steps fail every worker here."""
        watching = self.watching()
        if watching not in self._functions:
            self._functions[watching] = self._agreement(watching)
        self.stage_timing()
        self._take(*self._functions[watching](), where)

    def _agreement(self, watching):
        strategy = self.strategy

        def replica():
            flag = preemption().rider() if watching else None
            values = [tf.concat([tf.stack([self.refused.read_value()]), _share(self.timing, self.islands)],
                                0)] + ([flag] if watching else [])
            summed = wire.all_reduce(tf.distribute.get_replica_context(),
                                     tf.distribute.ReduceOp.SUM, values)
            with tf.control_dependencies(summed):
                self.refused.assign(0.0)
            return summed

        @plain_function
        def agree():
            summed = wire.run_counted(strategy, self.meter, replica)
            if watching:
                preemption().record(strategy, summed[1])
            agreed = strategy.experimental_local_results(summed[0])[0]
            return agreed[0], agreed[1:]

        return agree

    def stage_timing(self):
        if self.pacing is not None and self.pacing.pace.measured:
            self.timing.assign(self.pacing.pace.timing())

    def _take(self, refused, timing, where):
        """Acts on an agreement, the same on every worker: its refused steps fail here;
        measured times go to the pace."""
        if self.pacing is not None:
            self.pacing.pace.take_agreed([float(t) for t in timing.numpy()])
        refused = round(float(refused))
        if refused:
            raise tf.errors.InvalidArgumentError(
                None, None, f"tfdist: a NaN or Inf gradient on some replica: {refused} local "
                "step(s) of an island since the islands last synchronised were refused on "
                "every replica of that island (weights, optimizer state and step counters are "
                f"as before them). The islands agree on it at {where}: every worker stops "
                "here.")

    def stage(self):
        """(replica context, as an overlapped exchange is sent: in program order) What the
        island decided alone since the last exchange, for the exchange to carry."""
        flag = preemption().rider()
        refused = self.refused.read_value()
        self.staged.assign_add(tf.concat([
            tf.stack([refused, tf.zeros([]) if flag is None else flag]), _share(self.timing, self.islands)],
            0))
        self.refused.assign_sub(refused)

    def carry(self, comm):
        """(replica context, inside an overlapped exchange) The staged agreement summed over
        every worker beside the exchange; acted on where exchanges are applied
        (`act_on_carried`), on every worker alike."""
        staged = self.staged.read_value()
        summed = comm.all_reduce([staged])[0]
        self.staged.assign_sub(staged)  # what a later send staged meanwhile stays
        self.carried.assign_add(summed)

    def act_on_carried(self, where):
        """At an applied exchange, on every worker alike: a carried preemption is
        `preemption().agreed()` after this step; carried refused steps fail here."""
        watching = self.watching()
        key = ("carried", watching)
        if key not in self._functions:
            strategy = self.strategy

            def replica():
                carried = self.carried.read_value()
                with tf.control_dependencies([carried]):
                    self.carried.assign(tf.zeros_like(carried))
                return carried[0], carried[1], carried[2:]

            @plain_function
            def take():
                refused, flags, timing = strategy.run(replica)
                if watching:
                    preemption().record(strategy, flags)
                first = strategy.experimental_local_results
                return first(refused)[0], first(timing)[0]

            self._functions[key] = take
        self._take(*self._functions[key](), where)

    def state(self):
        state = {"attempts": int(self.attempts.numpy())}
        if self.pacing is not None:
            state["pace"] = self.pacing.pace.state()
        return state

    def valid(self, state):
        return (type(state.get("attempts")) is int and 0 <= state["attempts"] < 2**31
                and (self.pacing is None or self.pacing.pace.valid(state.get("pace"))))

    def restore(self, state):
        self.attempts.assign(state["attempts"])
        if self.pacing is not None:
            self.pacing.pace.restore(state["pace"])


def _share(timing, islands):
    """(replica context) This replica's share of its island's measured times: summed over
    every replica, each island's mean."""
    return timing.read_value() / islands.replica_island_size()


class Pacing:
    """Heterogeneous islands (`island_steps`): the counts of trained calls (`IslandPace`)
    and the weight this island's replicas' changes take, so that the outer mean weighs
    every island by its samples (HeLoCo-style)."""

    def __init__(self, strategy, island_steps, period, islands):
        self.strategy, self.period = strategy, period
        self.pace = IslandPace(island_steps, period, islands.sizes(), islands.own)
        self.scale = tf.Variable(1.0, trainable=False, name="tfdist_island_weight",
                                 aggregation=tf.VariableAggregation.NONE)

    def before_sending(self, attempts):
        """(Python) The weight of the change over the last period's calls."""
        self.scale.assign(self.pace.scale(attempts - self.period, attempts))

    def weigh(self, values):
        """(replica context) `values` times this island's weight."""
        scale = self.scale.read_value()
        return [v * tf.cast(scale, v.dtype) for v in values]

    def around_synchronisations(self, local, synchronise):
        """After local call `local`: the call timed, `synchronise()` run, and at a period's
        start the next counts decided (one line on the chief's output when they change)."""
        self.pace.call_ended(local)
        synchronise()
        if local % self.period == 0 and self.pace.begin_period(local // self.period):
            if is_chief(self.strategy):
                seconds = ", ".join(f"{s:.3f}" for s in self.pace.agreed[0])
                say(f"tfdist local_sgd island_steps from local step {local}: "
                    f"{self.pace.counts(local // self.period)} of {self.period} (seconds "
                    f"per step by island: {seconds})")
        self.pace.resume()


class IslandCalls:
    """What the loop asks islands of workers between steps (`tfdist.step.abilities`):
    whether a step couples every worker, and — heterogeneous islands — whether this
    worker trains on its next step call."""

    def __init__(self, hook, agreement, pace=None):
        self.hook, self.agreement, self.pace = hook, agreement, pace

    def couples_workers(self):
        return self.hook.current_phase is not False

    def trains_next(self):
        """A local step of an island that trains some of each period's calls (evenly
        spread, `IslandPace`) trains nothing on the others (`skipped`)."""
        if self.pace is None or self.hook.current_phase is not False:
            return True
        return self.pace.trains_next(int(self.agreement.attempts.numpy()))

    def skipped(self):
        """A step call that trained nothing still counts in the schedule."""
        self.agreement.count_attempt()
        self.pace.skipping()
