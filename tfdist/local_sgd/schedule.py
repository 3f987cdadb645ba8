"""When local SGD synchronises: which fragments are due, which exchanges in flight are
applied, and what the replicas may hold apart — pure Python, the same on every worker.

PyTorch's `PeriodicModelAverager` is the model (a schedule of a few lines); Streaming
DiLoCo's staggered fragments (Douillard et al. 2025) come from `fragments.due`.
"""

import dataclasses

from tfdist.local_sgd import fragments as fragmenting


@dataclasses.dataclass(frozen=True)
class Due:
    """What a moment of the schedule asks for, in this order: the islands' agreement
    (`agree`), the exchanges in flight to apply (`finishing`), the synchronisations to
    start (`starting`)."""
    agree: bool
    finishing: tuple
    starting: tuple


class Schedule:
    """The synchronisation schedule of `count` fragments, each once every `period` local
    steps, an exchange applied `overlap_steps` local steps after it starts.

    State (what a backup keeps): `averages` — synchronisations started (the step counter of
    a compressed exchange) —, `anchored` — the anchors hold the weights local steps began
    from —, `differ` — the fragments whose replicas may hold different weights — and
    `in_flight` — fragment: the local step to apply its exchange at.
    """

    def __init__(self, period, count, overlap_steps=0):
        self.period, self.count, self.overlap_steps = period, count, overlap_steps
        self.averages, self.anchored = 0, False
        self.differ, self.in_flight = set(), {}

    @property
    def in_sync(self):
        """Whether every replica holds the same weights."""
        return not self.differ

    def after_local_step(self, local):
        """After local step `local` (counted from the end of the warm-up, from 1): every
        fragment changed; an overlapped exchange waits for no agreement of its own (the
        exchange carries it)."""
        self.differ = set(range(self.count))
        finishing = tuple(f for f, at in self.in_flight.items() if local == at)
        starting = tuple(fragmenting.due(local, self.count, self.period))
        agree = bool(finishing or starting) and not self.overlap_steps
        return Due(agree, finishing, starting)

    def before_read(self):
        """Before the model is read: every exchange in flight applied at once, then every
        fragment that differs synchronised."""
        return Due(bool(self.in_flight or self.differ), tuple(self.in_flight),
                   tuple(sorted(self.differ)))

    def started(self, fragment, local):
        """A fragment's synchronisation began after local step `local`."""
        self.averages += 1
        if self.overlap_steps:
            self.in_flight[fragment] = local + self.overlap_steps
        else:
            self.differ.discard(fragment)

    def finished(self, fragment, mix):
        """A fragment's exchange was applied with `mix` of the local weights kept."""
        del self.in_flight[fragment]
        if mix == 0:
            self.differ.discard(fragment)

    def state(self):
        return {"averages": self.averages, "anchored": bool(self.anchored),
                "differ": sorted(self.differ),
                "in_flight": sorted([f, at] for f, at in self.in_flight.items())}

    def valid(self, state):
        """Whether `state` (a dict holding at least `state()`'s keys) fits this schedule."""
        def fragment(value):
            return type(value) is int and 0 <= value < self.count

        return (type(state.get("averages")) is int and 0 <= state["averages"] < 2**31
                and type(state.get("anchored")) is bool
                and isinstance(state.get("differ"), list) and all(map(fragment, state["differ"]))
                and isinstance(state.get("in_flight"), list) and all(
                    isinstance(p, list) and len(p) == 2 and fragment(p[0])
                    and type(p[1]) is int and 0 <= p[1] < 2**62 for p in state["in_flight"]))

    def restore(self, state):
        self.averages, self.anchored = state["averages"], state["anchored"]
        self.differ = set(state["differ"])
        self.in_flight = {f: at for f, at in state["in_flight"]}
