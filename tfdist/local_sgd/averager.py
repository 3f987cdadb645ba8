"""Local SGD and DiLoCo: replicas train on their own and synchronise every `period` steps.

Stich 2019, "Local SGD Converges Fast and Communicates Little"; PyTorch's
`PeriodicModelAverager` is the model. Between synchronisations there is no gradient
exchange at all: each replica applies its own gradient, so replicas — and workers — really
hold different weights. Every `period` steps, and before anything reads the model, they
synchronise: plain local SGD averages the weights; DiLoCo (Douillard et al. 2023, arXiv
2311.08105; `outer`) applies the mean change since the last synchronisation as a
pseudo-gradient to the *anchors* with an outer optimizer; Streaming DiLoCo (Douillard et
al. 2025, arXiv 2501.18512) synchronises `fragments` at staggered steps, each exchange
overlapped with `overlap_steps` inner steps. A compressed exchange sends each replica's
change since the anchors (which compresses like a gradient).

`ModelAverager` is a short hook composed of parts, each in its own module: the warm-up
(`warmup`), the schedule (`schedule`), one synchroniser per fragment (`synchroniser`),
the synchronisations between steps (`rounds`), the step's own exchange (`step`) and the
islands' agreement (`agreement`); docs/concepts/architecture.md draws them.
"""

from tfdist.capabilities import names_with
from tfdist.compression.auto import AutoCompression
from tfdist.compression.factory import build
from tfdist.errors import UnsupportedError
from tfdist.local_sgd import fragments as fragmenting
from tfdist.local_sgd import go_local
from tfdist.local_sgd import step as step_exchange
from tfdist.local_sgd.agreement import IslandAgreement, IslandCalls, NoIslands, Pacing
from tfdist.local_sgd.arguments import checked_arguments, compression_hook
from tfdist.local_sgd.islands import IslandReduce, exchanged_shapes
from tfdist.local_sgd.outer import is_plain_average, outer_optimizer
from tfdist.local_sgd.rounds import Rounds
from tfdist.local_sgd.saved import LocalSGDState
from tfdist.local_sgd.schedule import Schedule
from tfdist.local_sgd.synchroniser import Anchors, FragmentSync, Replicas
from tfdist.local_sgd.warmup import NOT_YET, Warmup
from tfdist.step.hooks import TrainingHook, all_reduce_sum
from tfdist.step.tracing import do_not_convert
from tfdist.step.variables import underlying
from tfdist.strategies import batch_rows
from tfdist.strategies.kind import capabilities_of

__all__ = ["DiLoCo", "ModelAverager", "NOT_YET"]


class ModelAverager(TrainingHook):
    """Local SGD and DiLoCo, as a `TrainingHook`: the same object in `model.fit`,
    `tfdist.Trainer` and your own loop (`tfdist.function`).

    Args:
        period: local steps between two synchronisations (1: as synchronous as plain SGD).
        warmup_steps: synchronous steps (gradients all-reduced) before local steps start,
            or "auto" (`tfdist.local_sgd.warmup`).
        average_non_trainable: also average per-replica Keras state (BatchNormalization
            statistics) at each synchronisation, not only at the end of each epoch.
        average_optimizer_state: also average the optimizer's slots (momenta).
        compression: compress the exchange — a compressor name, a `compression:`
            section or a `GradientCompression` hook.
        outer: DiLoCo's outer optimizer (`tfdist.local_sgd.outer`): None — plain
            averaging —, a name ("nesterov": the paper's), a mapping or a Keras optimizer.
        fragments: synchronise the model in this many parts at staggered steps.
        overlap_steps: a fragment's exchange runs beside this many inner steps.
        overlap_mix: after an overlapped exchange the weights become `overlap_mix` x the
            local ones + (1 - `overlap_mix`) x the synchronised ones (Streaming DiLoCo's α).
        warmup_compression: the warm-up's gradient exchange (a compressor name, a
            `compression:` section or a hook; None: uncompressed).
        islands: groups of workers that all-reduce their gradients every step and
            synchronise with the other groups as above (`tfdist.local_sgd.islands`): a
            count of equal groups, "host", or lists of worker indices.
        island_steps: heterogeneous islands — the local steps each island trains per
            period (one count per island), or "auto": measured (`tfdist.local_sgd.pace`).
    """

    replaces_exchange = True
    replicas_apart = True
    #: What it sends per step, like `GradientCompression.bytes_per_step` (the cost model's).
    bytes_per_step = go_local.bytes_per_step

    def __init__(self, period, warmup_steps=0, average_non_trainable=False,
                 average_optimizer_state=False, compression=None, outer=None, fragments=1,
                 overlap_steps=0, overlap_mix=0.5, islands=None, warmup_compression=None,
                 island_steps=None):
        self.arguments = dict(  # as given (`tfdist.horovod` builds its own from them)
            period=period, warmup_steps=warmup_steps, fragments=fragments,
            overlap_steps=overlap_steps, overlap_mix=overlap_mix, outer=outer,
            average_non_trainable=average_non_trainable, compression=compression,
            average_optimizer_state=average_optimizer_state, islands=islands,
            warmup_compression=warmup_compression, island_steps=island_steps)
        checked = checked_arguments(**self.arguments)
        self.period, self.fragments = checked.period, checked.fragments
        self.overlap_steps, self.overlap_mix = checked.overlap_steps, checked.overlap_mix
        self.average_non_trainable = checked.average_non_trainable
        self.average_optimizer_state = checked.average_optimizer_state
        self.islands, self.island_steps = checked.islands, checked.island_steps
        self.compression = compression_hook(compression)
        self.outer = None if is_plain_average(outer) else outer
        if self.outer is not None:
            outer_optimizer(self.outer)  # an optimizer object it cannot take fails here
        self.warmup = Warmup(checked.warmup_steps, compression_hook(  # auto implies auto's
            checked.warmup_compression if warmup_compression is None else warmup_compression),
            self)
        self.phased = self.warmup.steps > 0  # (NOT_YET with auto)
        self.schedule = Schedule(self.period, self.fragments, self.overlap_steps)
        self.strategy = self.anchors = self.outer_optimizer = self.groups = self.across = None
        self.island_reduce, self.agreement, self.pace = None, NoIslands(), None
        self.stateful = LocalSGDState(self)  # what a backup keeps (`tfdist.step.saved_state`)

    @classmethod
    def from_config(cls, config, **overrides):
        """From a `LocalSGDConfig` (the config's `local_sgd:` section)."""
        return cls(**{**vars(config), **overrides})

    def __repr__(self):
        warmup = "auto" if self.warmup.auto else self.warmup.steps
        return (f"ModelAverager(period={self.period}, warmup_steps={warmup!r}, "
                f"islands={self.islands!r}, island_steps={self.island_steps!r}, "
                f"compression={self.compression.compressor.name if self.compression else None}"
                f", outer={self.outer!r}, fragments={self.fragments}, "
                f"overlap_steps={self.overlap_steps})")

    warmup_steps = property(lambda self: self.warmup.steps)
    going_local = property(lambda self: self.warmup.going_local)
    warmup_exchange = property(lambda self: self.warmup.exchange,
                               lambda self, hook: setattr(self.warmup, "exchange", hook))
    averages = property(lambda self: self.schedule.averages)
    in_sync = property(lambda self: self.schedule.in_sync, doc="Every replica holds one model.")

    def build(self, strategy, variables):
        """Builds the synchronisations of `variables` across `strategy`'s replicas."""
        _check_holds_copies(strategy)
        self.strategy = strategy
        self.replicas = replicas = self.replicas_of(strategy)
        pacing = self._build_islands(strategy)
        sizes = [int(v.shape.num_elements()) for v in variables]
        self.model_bytes, self.model_sizes = 4 * sum(sizes), sizes
        self.groups = fragmenting.split(sizes, self.fragments)
        self.schedule.count, self.weights = len(self.groups), [underlying(v) for v in variables]
        if self.compression is not None or self.outer is not None:
            self.anchors = Anchors(variables, self.outer)
            self.outer_optimizer = self.anchors.optimizer
        _build_warmup(self.warmup, strategy, variables, self.across, sizes)
        self.exchanges = _fragment_exchanges(self, strategy, sizes)
        self.rounds = Rounds(self.warmup, self.schedule, [FragmentSync(
            group, replicas, self.anchors, hook, self.across, self.agreement, pacing,
            bool(self.overlap_steps), [variables[i].shape for i in group])
            for group, hook in zip(self.groups, self.exchanges)], self.agreement, pacing,
            self.overlap_mix, lambda model: replicas.apart_state(
                model, self.average_non_trainable, self.average_optimizer_state))
        self.abilities = (self.rounds,) + ((IslandCalls(self, self.agreement, self.pace),)
                                           if self.agreement.decides_alone else ())

    def _build_islands(self, strategy):
        """The islands' reduce, agreement, pace and exchange between them on `strategy`;
        returns heterogeneous islands' `Pacing` (None without `island_steps`)."""
        if self.islands is not None and strategy.num_replicas_in_sync > 1:
            self.island_reduce = IslandReduce(strategy, self.islands)
        pacing = _pacing(self, strategy) if self.island_steps is not None else None
        if self.island_reduce is not None and self.island_reduce.multi_worker:
            self.agreement = IslandAgreement(strategy, self.island_reduce, pacing, self.wire_meter)
        self.pace = pacing.pace if pacing is not None else None
        # islands of workers exchange between them hierarchically
        self.across = (self.island_reduce if self.agreement.decides_alone
                       and self.island_reduce.across is not None else None)
        return pacing

    def replicas_of(self, strategy):
        """How the synchronisations reach the replicas: `strategy`'s (`Replicas`)."""
        return Replicas(strategy, self.wire_meter)

    def prepare(self, step):
        self.warmup.prepare(step)

    def phase(self, step):
        return self.warmup.phase(step)

    def enter_phase(self, phase):
        super().enter_phase(phase)
        if isinstance(phase, str):  # auto's choice for the synchronous steps
            self.warmup.exchange.enter_phase(phase)
        if not phase and self.anchors is not None and not self.schedule.anchored:
            # the replicas are in sync here: the last step was synchronous
            weights = self.weights
            self.replicas.compile(lambda: self.anchors.copy_from(weights), False)()
            self.schedule.anchored = True

    @property
    def synchronous(self):
        """Whether the step being traced all-reduces gradients (a warm-up step)."""
        return (self.warmup.steps > 0 if self.current_phase is None
                else self.current_phase is not False)

    @do_not_convert
    def exchange(self, grads, variables, step):
        if not self.synchronous:
            rows = batch_rows.rows()
            for sync in self.rounds.synchronisers if rows is not None else ():
                sync.count_rows(rows)
            return step_exchange.local_exchange(grads, self.island_reduce, self.agreement)
        if self.across is not None:
            return step_exchange.warmup_across_islands(grads, step, self.island_reduce,
                                                       self.warmup.exchange)
        if self.warmup.exchange is not None:
            return self.warmup.exchange.exchange(grads, variables, step)
        return all_reduce_sum(grads)

    def on_step_end(self, step):
        if self.current_phase is False:  # a local step, tried
            self.agreement.count_attempt()
        return None

    def after_step(self, model, steps_done):
        """Synchronises the fragments that are due `period` local steps after the warm-up,
        and applies the overlapped exchanges that have run beside `overlap_steps` steps."""
        self.rounds.after_step(model, steps_done)

    def before_read(self, model):
        """Every replica's weights (and the chosen state) synchronised, after any exchange
        in flight: one model (collectives: on every worker at the same point)."""
        if not self.schedule.in_sync:
            self.rounds.average(model)


def _check_holds_copies(strategy):
    """Raises UnsupportedError unless `strategy`'s replicas hold their own weights."""
    if strategy.num_replicas_in_sync > 1 and not capabilities_of(strategy).local_sgd:
        raise UnsupportedError(
            "local SGD needs replicas that hold their own copy of the weights "
            f"([{', '.join(names_with('local_sgd'))}]); under "
            f"{type(strategy).__name__} variables are stored once. Received: "
            f"strategy={type(strategy).__name__}")


def _build_warmup(warmup, strategy, variables, across, sizes):
    """Builds the warm-up's gradient exchange, if any (auto's never between islands)."""
    exchange = warmup.exchange
    if isinstance(exchange, AutoCompression):
        exchange.build(strategy, variables)
    elif exchange is not None and warmup.steps > 0:
        exchange.build(strategy, variables, shapes=exchanged_shapes(across, sizes))


def _fragment_exchanges(averager, strategy, sizes):
    """Each fragment's compressed exchange, built (None each: uncompressed)."""
    if averager.compression is None:
        return [None] * len(averager.groups)
    exchanges = [averager.compression if i == 0 else build(averager.compression.get_config())
                 for i in range(len(averager.groups))]
    for hook, group in zip(exchanges, averager.groups):
        hook.build(strategy, [averager.anchors.tensors[i] for i in group],
                   shapes=exchanged_shapes(averager.across, [sizes[i] for i in group]))
    return exchanges


def _pacing(averager, strategy):
    """Heterogeneous islands' `Pacing`: islands of workers, one count per island."""
    islands = averager.island_reduce.groups if averager.island_reduce is not None else None
    if averager.island_reduce is None or not averager.island_reduce.multi_worker:
        raise UnsupportedError(
            "island_steps needs islands of workers (a multi-worker job): a machine's "
            "replicas share one loop and train at one pace. Received: "
            f"island_steps={averager.island_steps!r} on {type(strategy).__name__}")
    steps, kept = averager.island_steps, averager.island_reduce.kept
    if steps != "auto" and averager.island_reduce.whole != len(steps):
        raise UnsupportedError(
            f"island_steps: one count per island; the job's islands are {islands}, "
            f"island_steps lists {len(steps)}: {list(steps)}")
    if steps != "auto":  # the counts of the islands here (an elastic job's: of those left)
        steps = [steps[k] for k in kept]
    return Pacing(strategy, steps, averager.period, averager.island_reduce)


def DiLoCo(period, outer="nesterov", **options):  # noqa: N802 (a configuration, like a class)
    """DiLoCo (Douillard et al. 2023): `ModelAverager` with the paper's outer Nesterov
    momentum by default; `fragments`, `overlap_steps` and `compression` make it Streaming
    DiLoCo (Douillard et al. 2025)."""
    return ModelAverager(period, outer=outer, **options)
