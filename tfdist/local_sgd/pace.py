"""Heterogeneous islands' pace (HeLoCo-style; Douillard et al.'s DiLoCo with islands of
different speeds): how many of a period's step calls each island trains on, so that a
slower island reaches each synchronisation when the faster ones do, and how much each
island's change weighs in the outer mean (its samples). Pure Python.

An island trains on `count` of a period's `period` calls, evenly spread: call c (0-based,
in its period) trains if (c + 1) * count // period > c * count // period. Counts are
configured (`island_steps: [32, 16]`) or measured (`island_steps: auto`): each island
times its trained and its skipped step calls, the islands agree on those times at their
synchronisations (every worker reads the same sums at the same step), and at each
period's start every worker derives the same counts from the last agreed times — the
fastest island trains every call, each other one as many as fit in the fastest one's
period.
"""

import statistics
import time


def trains(call, count, period):
    """Whether call `call` (0-based, within its period) of an island training `count` of
    `period` calls trains."""
    return (call + 1) * count // period > call * count // period


def trained_between(count, period, start, end):
    """How many of the calls start..end-1 (within one period) train."""
    return end * count // period - start * count // period


def counts_within(period, seconds, skip_seconds):
    """Each island's count of trained calls per period from its measured seconds per
    trained call and per skipped call: the fastest trains all `period`, every other one
    as many as fit in the fastest one's period (at least 1)."""
    budget = period * min(seconds)
    counts = []
    for trained, skipped in zip(seconds, skip_seconds):
        if trained <= min(seconds) or trained <= skipped:
            counts.append(period)
            continue
        fits = (budget - period * skipped) / (trained - skipped)
        counts.append(max(1, min(period, int(fits))))
    return counts


class IslandPace:
    """The counts of trained calls by period and island, configured or measured.

    Args:
        island_steps: one count per island, or "auto" (measured; every island trains
            every call until the islands have agreed on their times).
        period: calls per period.
        replicas: replicas of each island (their samples weigh the outer mean).
        own: this worker's island.
    """

    def __init__(self, island_steps, period, replicas, own):
        self.measured = island_steps == "auto"
        self.period, self.replicas, self.own = period, list(replicas), own
        first = [period] * len(replicas) if self.measured else list(island_steps)
        self.schedule = {0: first}  # period index -> counts (the current and the last)
        self.history = [[0, first]]  # [first period, counts] at each change
        self.agreed = None  # (seconds, skip_seconds) per island, as last agreed
        self._trained, self._skipped = [], []
        self._mark, self._skipping = None, False

    def counts(self, index):
        """The counts of period `index` (the configured ones, or the last decided)."""
        known = [k for k in self.schedule if k <= index]
        return self.schedule[max(known)] if known else self.schedule[min(self.schedule)]

    def trains_next(self, call):
        """Whether this worker's island trains on local call `call` (0-based)."""
        index, within = divmod(call, self.period)
        return trains(within, self.counts(index)[self.own], self.period)

    def trained(self, island, start, end):
        """Calls island `island` trained among local calls start..end-1."""
        total = 0
        for index in range(start // self.period, (max(end, 1) - 1) // self.period + 1):
            base = index * self.period
            low, high = max(start, base) - base, min(end, base + self.period) - base
            if high > low:
                total += trained_between(self.counts(index)[island], self.period, low, high)
        return total

    def scale(self, start, end):
        """The factor this island's replicas' contributions take in the outer mean of the
        change over local calls start..end-1: every island weighed by its samples."""
        counts = [self.trained(i, start, end) for i in range(len(self.replicas))]
        total = sum(n * c for n, c in zip(self.replicas, counts))
        return sum(self.replicas) * counts[self.own] / total if total else 1.0

    # --- measured counts -------------------------------------------------------------

    def skipping(self):
        """The call that is ending trained nothing."""
        self._skipping = True

    def call_ended(self, local):
        """(after local call `local`, counted from 1, before any synchronisation) Times the
        call since `resume()`; the first traces the step: not timed."""
        now = time.perf_counter()
        if self.measured and self._mark is not None and local > 1:
            (self._skipped if self._skipping else self._trained).append(now - self._mark)
            del self._trained[:-self.period], self._skipped[:-self.period]
        self._mark, self._skipping = None, False

    def resume(self):
        """(after the synchronisations that followed a call) The next call starts now."""
        self._mark = time.perf_counter()

    def timing(self):
        """This island's slot of the times to agree on: [seconds per trained call, per
        skipped call] at index 2 * own (0 where nothing is measured yet)."""
        values = [0.0] * (2 * len(self.replicas))
        if self.measured and self._trained:
            values[2 * self.own] = statistics.median(self._trained)
            values[2 * self.own + 1] = statistics.median(self._skipped or [0.0])
        return values

    def take_agreed(self, summed):
        """The times every island agreed on (the islands' `timing()` slots, summed as each
        island's mean): kept once every island has measured its own."""
        seconds, skips = summed[0::2], summed[1::2]
        if self.measured and all(s > 0 for s in seconds):
            self.agreed = (list(seconds), list(skips))

    def begin_period(self, index):
        """(at local call index * period, the same on every worker) The counts of period
        `index` from the last agreed times; the schedule keeps this period and the last.
        Returns whether they changed."""
        before = self.counts(index)
        now = (counts_within(self.period, *self.agreed)
               if self.measured and self.agreed is not None else before)
        self.schedule[index] = now
        for old in [k for k in self.schedule if k < index - 1]:
            del self.schedule[old]
        if now != before:
            self.history.append([index, list(now)])
        return now != before

    # --- a backup -----------------------------------------------------------------------

    def state(self):
        return {"schedule": sorted([k, list(c)] for k, c in self.schedule.items()),
                "agreed": None if self.agreed is None else [list(x) for x in self.agreed]}

    def valid(self, state):
        """Whether `state` is a `state()` of this job's islands and period."""
        islands = len(self.replicas)

        def counts(value):
            return (isinstance(value, list) and len(value) == islands and all(
                type(n) is int and 1 <= n <= self.period for n in value))

        def seconds(value):
            return (isinstance(value, list) and len(value) == islands and all(
                type(s) in (int, float) and 0 <= s < float("inf") for s in value))

        if not (isinstance(state, dict) and set(state) == {"schedule", "agreed"}):
            return False
        schedule, agreed = state["schedule"], state["agreed"]
        return (isinstance(schedule, list) and 0 < len(schedule) <= 2 and all(
                    isinstance(p, list) and len(p) == 2 and type(p[0]) is int and p[0] >= 0
                    and counts(p[1]) for p in schedule)
                and (agreed is None or (isinstance(agreed, list) and len(agreed) == 2
                                        and all(map(seconds, agreed)))))

    def restore(self, state):
        self.schedule = {k: list(c) for k, c in state["schedule"]}
        self.history = [[k, list(c)] for k, c in sorted(self.schedule.items())]
        self.agreed = None if state["agreed"] is None else tuple(
            [float(s) for s in x] for x in state["agreed"])
