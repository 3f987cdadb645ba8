"""What a backup keeps of local SGD (the `Stateful` protocol of `tfdist.step.saved_state`):
each replica's weights and what its synchronisations hold, with how each goes onto another
number of replicas, the outer optimizer, and where the schedule stands."""

from tfdist.checkpoint import CheckpointError


class LocalSGDState:
    """The saved state of `averager` (a `ModelAverager`, read after its `build`)."""

    def __init__(self, averager):
        self.averager = averager

    def saveables(self):
        """The outer optimizer (its momentum and step): `BackupAndRestore` resumes it."""
        outer = self.averager.outer_optimizer
        return [outer] if outer is not None else []

    def _exchanges(self):
        a = self.averager
        return [h for h in [*a.exchanges, a.warmup.exchange] if h is not None]

    def replica_state(self):
        """Each replica's own weights, the anchors, an overlapped exchange's buffers and
        the compressed exchanges' state: a backup between two synchronisations resumes
        every replica where it was."""
        a, syncs = self.averager, self.averager.rounds.synchronisers
        return [*a.weights, *(a.anchors.tensors if a.anchors else []),
                *(v for s in syncs for v in s.sent), *(v for s in syncs for v in s.received),
                *(v for hook in self._exchanges() for v in hook.replica_state()),
                *(s.rows for s in syncs)]

    def replica_state_rules(self):
        """How `replica_state()` goes onto another number of replicas (`tfdist.step.resize`):
        the weights, what an exchange sent and the rows trained since the last
        synchronisation, by their mean (a synchronisation's); the anchors, and what an
        exchange received, kept (everyone's: DiLoCo's outer state); the compressed
        exchanges' state by its own rules — afresh between islands, where it is held by
        shard (`IslandReduce.shard`)."""
        a, syncs = self.averager, self.averager.rounds.synchronisers
        return (["mean"] * len(a.weights) + ["shared"] * len(a.anchors or [])
                + ["mean"] * sum(len(s.sent) for s in syncs)
                + ["shared"] * sum(len(s.received) for s in syncs)
                + [rule if a.across is None else "afresh" for hook in self._exchanges()
                   for rule in hook.replica_state_rules()]
                + ["mean"] * len(syncs))

    def checkpoint_state(self):
        """Where the synchronisation schedule stands (the same on every worker)."""
        a = self.averager
        return {**a.schedule.state(), **a.agreement.state(), **a.warmup.state()}

    def restore_checkpoint_state(self, state):
        """Takes back `checkpoint_state()`; anything else is a one-line CheckpointError."""
        a = self.averager
        parts = (a.schedule, a.agreement, a.warmup)
        if not (isinstance(state, dict) and set(state) == set(self.checkpoint_state())
                and all(part.valid(state) for part in parts)):
            raise CheckpointError(f"the backup's local SGD schedule cannot be used with "
                                  f"{a.schedule.count} fragment(s): {str(state)[:200]}")
        for part in parts:
            part.restore(state)

    def restore_resized_checkpoint_state(self, state, old, new):
        """A backup of `old` replicas into this run's `new`: the schedule (where the
        synchronisations and the warm-up stand) is kept; heterogeneous islands' counts
        start again from `island_steps` (measured again under "auto": the islands
        changed), as does the warm-up exchange's `compression: auto` choice."""
        a = self.averager
        pace = a.agreement.pacing
        if isinstance(state, dict):  # this run's own, for what was measured on the old one
            state = {**state, **({"pace": pace.pace.state()} if pace is not None else {}),
                     **({"auto": None} if a.warmup.chooses else {})}
        self.restore_checkpoint_state(state)
        again = ([f"island_steps starts again from "
                  f"{'a new measurement' if pace.pace.measured else 'its counts'}"]
                 if pace is not None else []) + (
            ["the warm-up's compression: auto measures again"] if a.warmup.chooses else [])
        if again:
            print(f"tfdist: local SGD was on {old} replicas and this run has {new}: "
                  + "; ".join(again), flush=True)
