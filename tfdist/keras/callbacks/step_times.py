"""`StepTimes`: each worker's step time split into computing, exchange and waiting, and the
straggler named (`tfdist.step.step_clock` measures; this reports)."""

import functools
import statistics

import keras

from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.keras.callbacks.worker_scratch import strategy_of
from tfdist.report import logger, say
from tfdist.seam.optimizer import pipeline_of
from tfdist.seam.owned import named_optimizers
from tfdist.step.step_clock import PARTS, num_workers, worker_hosts, worker_index
from tfdist.step_times_line import StepTimesLine, format_line
from tfdist.strategies.task import is_chief


class StepTimes(keras.callbacks.Callback):
    """Where each worker's step time goes, measured in every step at the cost of two
    timestamps and 2 float32 per worker riding the step's verdict all-reduce
    (`tfdist.step.step_clock`; benchmarks/overhead.py measures it).

    Each epoch's logs get this worker's seconds per step computing, in the exchange and
    waiting for the slowest worker (``step_compute_s``, ``step_exchange_s``,
    ``step_wait_s``), every worker's (``worker_2/step_wait_s``, ...), the slowest worker's
    index (``straggler``) and the share of the other workers' step time spent waiting for
    it (``straggler_wait_share``). Every `every_steps` steps and at the end of training
    the chief logs one line naming the slowest worker (the ``tfdist`` logger,
    `tfdist.report`; the form is `tfdist.step_times_line`'s, and ``tfdist launch``
    carries the last line's figures in its summary); a worker slowest by more than
    `threshold` (a fraction of the others' median computing time) in `persistence`
    reports in a row is warned about, with its host. Active under a multi-worker
    mirrored strategy of several workers; on one machine, under parameter servers,
    islands or Horovod it adds nothing.

    Args:
        every_steps: steps between the chief's lines (None: at the end only).
        threshold: how much longer than the others' median a worker must compute to be
            warned about (0.2: 20%).
        persistence: in how many reports in a row.
    """

    def __init__(self, every_steps=100, threshold=0.2, persistence=3):
        super().__init__()
        given = check_arguments("tfdist.callbacks.StepTimes", {
            "every_steps": functools.partial(checks.integer, minimum=1),
            "threshold": functools.partial(checks.number, minimum=0.0),
            "persistence": functools.partial(checks.integer, minimum=1)},
            threshold=threshold, persistence=persistence,
            **({} if every_steps is None else {"every_steps": every_steps}))
        self.every_steps = given.get("every_steps")
        self.threshold, self.persistence = given["threshold"], given["persistence"]
        self._clock, self._names, self._hosts = None, [], []
        self._epoch = self._report = None
        self._steps, self._slowest = 0, []

    def on_train_begin(self, logs=None):
        clocks = [pipeline_of(o).clock for _, o in named_optimizers(self.model)]
        self._clock = next((c for c in clocks if c.active), None)
        strategy = strategy_of(self.model)
        if self._clock is None and num_workers(strategy) > 1:
            logger.warning(
                "tfdist.callbacks.StepTimes times the steps of optimizers whose exchange tfdist "
                "runs, and this model's is Keras' own: wrap it in "
                "tfdist.keras.DistributedOptimizer(optimizer) (or give a config's compression "
                "section); no step times are reported")
        if self._clock is not None:
            self._hosts = worker_hosts(strategy)
            self._names = worker_names(strategy)
            self._chief = is_chief(strategy)
            self._report = self._clock.totals()
        self._steps, self._slowest = 0, []

    def on_epoch_begin(self, epoch, logs=None):
        if self._clock is not None:
            self._clock.restart()
            self._epoch = self._clock.totals()

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._clock is not None and self.every_steps and self._steps % self.every_steps == 0:
            self._say()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self._clock is None:
            return
        figures = per_step(self._epoch, self._clock.totals())
        if figures is not None:
            logs.update(step_time_logs(figures, worker_index_of(self.model)))

    def on_train_end(self, logs=None):
        if self._clock is not None:
            self._say(final=True)

    def _say(self, final=False):
        """The chief's line on the steps since the last one (at the end: the whole run)."""
        now = self._clock.totals()
        figures = per_step(self._report, now)
        self._report = now
        if figures is None:
            return
        slow, lead, share = straggler(figures)
        self._slowest = (self._slowest + [slow])[-self.persistence:] if lead > self.threshold \
            else []
        if not self._chief:
            return
        compute = figures["compute"]
        say(format_line(StepTimesLine(
            steps=figures["steps"], slowest=self._names[slow], compute=compute[slow],
            lead=lead, median=_others(compute, slow), share=share, whole_run=final,
            workers=tuple(zip(self._names, compute, figures["exchange"], figures["wait"])))))
        if len(self._slowest) == self.persistence and len(set(self._slowest)) == 1:
            logger.warning(
                f"tfdist: {self._names[slow]} (host {self._hosts[slow]}) has been the slowest "
                f"worker in {self.persistence} reports in a row, computing {lead:+.0%} on "
                f"the others' median (threshold {self.threshold:.0%}): the others spent "
                f"{share:.0%} of their step time waiting for it. Look at that host's load "
                "and input pipeline (a trace: tfdist.callbacks.TensorBoard(profile_batch=...)).")
            self._slowest = []


class EpochStepTimes(StepTimes):
    """`StepTimes`' figures in each epoch's logs, without the chief's lines (what
    `tfdist.callbacks.TensorBoard` adds to its event files)."""

    def __init__(self):
        super().__init__(every_steps=None)

    def _say(self, final=False):
        pass


def per_step(start, end):
    """{"steps": n, part: [seconds per step, per worker]} between two `StepClock.totals`
    (None if no step was accounted between them)."""
    steps = end["steps"] - start["steps"]
    if steps <= 0:
        return None
    return {"steps": steps, **{part: [(e - s) / steps for s, e in zip(start[part], end[part])]
                               for part in PARTS}}


def straggler(figures):
    """(index, lead, wait share): the worker computing longest per step; how much longer
    than the others' median (a fraction); the share of the others' step time they spent
    waiting."""
    compute = figures["compute"]
    slow = max(range(len(compute)), key=compute.__getitem__)
    median = _others(compute, slow)
    others = [i for i in range(len(compute)) if i != slow]
    step = sum(figures[part][i] for part in PARTS for i in others)
    wait = sum(figures["wait"][i] for i in others)
    return slow, (compute[slow] - median) / median if median > 0 else 0.0, \
        wait / step if step > 0 else 0.0


def step_time_logs(figures, me):
    """Keras logs of `per_step` figures: this worker's (`me`), each worker's, the
    straggler's index and the others' wait share."""
    logs = {f"step_{part}_s": figures[part][me] for part in PARTS}
    for part in PARTS:
        logs.update({f"worker_{i}/step_{part}_s": v for i, v in enumerate(figures[part])})
    slow, _, share = straggler(figures)
    logs.update(straggler=float(slow), straggler_wait_share=share)
    return logs


def _others(values, slow):
    return statistics.median([v for i, v in enumerate(values) if i != slow])


def worker_names(strategy):
    """"chief:0", "worker:1", ... in the order of the strategy's workers."""
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    return ([f"chief:{i}" for i in range(len(spec.get("chief", [])))]
            + [f"worker:{i}" for i in range(len(spec.get("worker", [])))])


def worker_index_of(model):
    return worker_index(strategy_of(model))
