"""`compression: auto`: measure the link, then exchange with the method the cost model
predicts fastest to accuracy among those that keep quality — without paying for the
measurement in uncompressed steps.

Compression paid off in few of the setups GRACE (Xu et al. 2021, "GRACE: A Compressed
Communication Framework for Distributed Machine Learning") and Agarwal et al. 2022 ("On
the Utility of Gradient Compression in Distributed Training Systems") measured: the
answer depends on the link, the model and the step time. So `AutoCompression`:

1. before the first step, times all-reduces of a few sizes on the strategy's own
   collectives and fits the link (bandwidth and latency per message,
   `cost_model.fit_link`): no training step is spent on it;
2. starts with the *prior*: the eligible method whose time to accuracy is nearest the best
   for every step compute time from 10 ms to 1 s (`prior`, minimax ratio: an uncompressed
   step on a slow link costs far more than a compressed one on a fast link); eligible are
   the methods whose measured quality at convergence (`QUALITY`, with the conditions it
   was measured under) is within `max_quality_loss` points of `none`;
3. times `probe_steps` ordinary steps of the prior (fewer where they would last over
   `probe_seconds`): wall time per step, as the user sees it. Those steps train as the
   prior does, and their time less the prior's predicted exchange is the compute time;
4. predicts each method's step: compute + its compression cost + its exchange on the link,
   and its time to accuracy: the step times the steps it needed to reach the target
   against `none` (`QUALITY["steps"]`: error feedback pays for its bytes with slower
   early progress, 1.35x for PowerSGD, 1.5x for top-k);
5. keeps the prior unless another method is predicted `min_gain` faster to accuracy (the
   cost model's own error); that one is traced, with all-reduce buckets sized so each
   transfer takes 20 times the fixed cost of one more all-reduce on this link
   (`tfdist.step.buckets.bucket_bytes_for`), and timed over as many steps: unless it
   measures faster to accuracy than the prior did, the prior comes back (a prediction is
   checked, never trusted: the model knows neither the runtime's overlap nor a loaded
   machine). It says why in one line on the chief;
6. every `check_every` steps compares the step time with the one it measured: off by
   more than `drift`, it times the link again and decides again from the steps it just
   ran (no step changes exchange to be measured).

The workers average their measurements with one all-reduce before choosing, so every
worker makes the same choice from the same numbers (a different choice would pair
different collectives).
"""

import functools
import math
import statistics
import time
import types

from tfdist.compression import cost_model
from tfdist.compression.choice import (METHODS, SHORTEST_WINDOW, Chooser, decision_line,
                                       eligible)
from tfdist.compression.compressors import compressor_by_name
from tfdist.compression.exchange import GradientCompression
from tfdist.compression.link_timer import LinkTimer
from tfdist.compression.switching import Switching
from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.errors import UnsupportedError
from tfdist.report import say
from tfdist.step.buckets import bucket_bytes_for
from tfdist.strategies.kind import capabilities_of
from tfdist.strategies.task import is_chief

#: AutoCompression's arguments, checked by the config loader's checks.
ARGUMENTS = {
    "probe_steps": functools.partial(checks.integer, minimum=4),
    "probe_seconds": functools.partial(checks.number, minimum=0),
    "check_every": functools.partial(checks.integer, minimum=1),
    "drift": functools.partial(checks.number, minimum=0, open_minimum=True),
    "max_quality_loss": functools.partial(checks.number, minimum=0),
    "min_gain": functools.partial(checks.number, minimum=0, maximum=1),
    "seed": checks.integer,
}


def _hook(options, seed):
    """The `GradientCompression` of one of `METHODS`."""
    options = dict(options)
    name, error_feedback = options.pop("name"), options.pop("error_feedback", False)
    exchange = {key: options.pop(key) for key in ("min_size",) if key in options}
    compressor = compressor_by_name(name, **options, error_feedback=error_feedback)
    return GradientCompression(compressor, error_feedback=error_feedback, seed=seed, **exchange)


def _chooser_attribute(name, doc):
    """The chooser's `name`, read through the hook."""
    return property(lambda self: getattr(self.chooser, name), doc=doc)


class AutoCompression(Switching):
    """Chooses the gradient exchange from measurements (module docstring): the link timed
    by a `LinkTimer`, the choice made by a `Chooser` (pure), the steps timed here.

    A backup keeps its choice; one restored onto another number of replicas (a resized
    job, `tfdist launch --min-workers`) does not, and it measures again.

    Args:
        probe_steps: steps of the prior timed before choosing, and steps of another choice
            timed before keeping it.
        probe_seconds: fewer steps (6 at least) where `probe_steps` would take longer.
        check_every: steps between two checks of the step time against its measurement.
        drift: relative difference of step time and measurement that triggers a new
            decision (the link timed again).
        min_gain: predicted share of the time to accuracy a method must save to replace
            the method measured.
        max_quality_loss: points of mean IoU a method may lose against `none` (`QUALITY`).
        seed: seed of the candidates' random choices.
    """

    replaces_exchange = True
    #: What strategy checks read of a compression hook (its name, and that it compresses).
    compressor = types.SimpleNamespace(name="auto", compresses=True)
    measures_the_cluster = True
    choice = _chooser_attribute("choice", "The method in use (\"probe\" before the link is "
                                "timed, at the first step).")
    decisions = _chooser_attribute(
        "decisions", "One dict per decision: step, link, the method measured (`prior`) and "
        "its `prior_seconds` per step, compute seconds, predictions, choice, the step time "
        "measured with it (and a choice `rejected` by its measurement).")
    link = _chooser_attribute("link", "The `cost_model.Link` decided on (None before).")
    kept = _chooser_attribute("kept", "Whether the method in use was measured and kept.")

    def __init__(self, *, probe_steps=20, probe_seconds=5.0, check_every=200, drift=0.3,
                 max_quality_loss=1.0, min_gain=0.05, seed=0):
        a = check_arguments("AutoCompression", ARGUMENTS, probe_steps=probe_steps,
                            probe_seconds=probe_seconds, check_every=check_every, drift=drift,
                            max_quality_loss=max_quality_loss, min_gain=min_gain, seed=seed)
        self.probe_steps, self.check_every = a["probe_steps"], a["check_every"]
        self.min_gain, self.max_quality_loss = a["min_gain"], a["max_quality_loss"]
        self.methods = eligible(self.max_quality_loss)
        super().__init__({m: _hook(METHODS[m], a["seed"]) for m in self.methods})
        self.chooser = Chooser(self.methods, probe_steps=self.probe_steps,
                               probe_seconds=a["probe_seconds"], check_every=self.check_every,
                               drift=a["drift"], min_gain=self.min_gain)
        self.timer, self._link_seconds, self.trace_seconds = None, None, None
        self._since, self._times, self._began, self._first_step = None, [], None, None

    def get_config(self):
        return None  # the choice is made again from fresh measurements

    # --- the hook contract (the candidates' own: `Switching`) ---------------------------

    def build(self, strategy, variables):
        if capabilities_of(strategy).push:
            raise UnsupportedError("compression: auto chooses between exchanges of replicas; "
                                   "under parameter servers name a push compression instead. "
                                   f"Received: strategy={type(strategy).__name__}")
        self.chief, self.workers = is_chief(strategy), max(strategy.num_replicas_in_sync, 1)
        self.timer = LinkTimer(strategy, self._say)
        super().build(strategy, variables)

    def prepare(self, step):
        """Every worker's first step: the link timed, the prior taken for it."""
        if self.choice != "probe":
            return
        link, self._link_seconds = self.timer.time()
        self._size_buckets(self.chooser.start(link, self.exchange_seconds(link)))
        self._say(f"at step {step}: link {link} (timed in {self._link_seconds:.1f} s); "
                  f"starting with {self.choice}, timed over its first steps")
        self._began = time.perf_counter()

    def phase(self, step):
        return self.choice

    def checkpoint_state(self):
        """A kept choice (not while its prior or a trial is timed: that is measured again)."""
        return self.chooser.saved(self.hooks[self.choice].bucket_bytes
                                  if self.choice in self.hooks else None)

    def restore_checkpoint_state(self, state):
        """Resumes with the backup's choice; it is measured again only if the step time
        drifts from what it measured (`check_every`, `drift`)."""
        if not self.chooser.restore(state):
            self._say(f"ignores a saved decision it cannot use ({str(state)[:200]}); "
                      "measuring again")
            return
        self.hooks[self.choice].bucket_bytes = state["bucket_bytes"]
        self._say(f"resumed with {self.choice}, chosen at step {state['step']} (measured "
                  f"{state['measured']:.3f} s/step); measuring again if the step time drifts")

    def after_step(self, model, steps_done):
        if self._since is None:  # timing starts at this process's first step (after a
            self._since = steps_done - 1  # restart the step count comes from the backup)
            if self._began is not None:  # the first step: its trace, and one step
                self._first_step = time.perf_counter() - self._began
        self._times = self._times[-self.check_every:] + [time.perf_counter()]
        ran = steps_done - self._since
        self.chooser.size_window(
            ran, lambda: self.timer.mean(self._step_seconds(SHORTEST_WINDOW - 3)))
        due = self.chooser.due(ran)
        if due == "check":
            self._check_drift(steps_done)
        elif due is not None:
            measured = self.timer.mean(self._step_seconds(self.chooser.window - 3))
            (self._decide if due == "decide" else self._confirm)(steps_done, measured)

    # --- measuring and choosing ---------------------------------------------------------

    def _step_seconds(self, last):
        """Median wall seconds per step over the last `last` steps (tracing skipped)."""
        times = self._times[-(last + 1):]
        return statistics.median(b - a for a, b in zip(times, times[1:]))

    def exchange_seconds(self, link):
        """{method: seconds its exchange takes per step on `link`} (the cost model)."""
        return {m: cost_model.exchange_seconds(
            cost_model.sent_bytes(self.hooks[m].bytes_per_step(), self.workers),
            cost_model.messages(self.hooks[m].bytes_per_step(), self.workers), link)
            for m in self.methods}

    def _size_buckets(self, method):
        """Before `method` is traced: its all-reduce buckets sized for the link (`none`
        keeps its own)."""
        if method != "none":
            bucket = bucket_bytes_for(self.link.bandwidth_bits, self.link.latency,
                                      2 * (self.workers - 1))
            self.hooks[method].bucket_bytes = (max(bucket, 64 << 10)
                                               if math.isfinite(bucket) else 0)

    def _decide(self, steps_done, measured):
        """The chooser's decision from `measured` seconds per step of the method in use;
        a trial's buckets sized before it is traced."""
        if self.trace_seconds is None and self._first_step is not None:  # every worker's
            self.trace_seconds = self.timer.mean(max(self._first_step - measured, 0.0))
        decision = self.chooser.decide(steps_done, measured, self.exchange_seconds(self.link),
                                       link_seconds=self._link_seconds,
                                       trace_seconds=self.trace_seconds)
        if decision["choice"] != decision["prior"]:
            self._size_buckets(decision["choice"])
        decision["bucket_bytes"] = self.hooks[decision["choice"]].bucket_bytes
        self._say(decision_line(decision))
        self._times, self._since = self._times[-1:], steps_done

    def _confirm(self, steps_done, measured):
        """The trial kept or not, from its `measured` seconds per step."""
        trial = self.choice
        self._say(self.chooser.confirm(steps_done, measured))
        self._since = steps_done
        if self.choice != trial:  # the method before it comes back (its step is traced)
            self._times = self._times[-1:]

    def _check_drift(self, steps_done):
        """The step time against what was measured: off by more than `drift`, the link is
        timed again and the steps just run decide again."""
        measured = self.timer.mean(self._step_seconds(self.check_every // 2))
        if self.chooser.drifted(measured):
            self._say(f"at step {steps_done}: {measured:.3f} s/step against "
                      f"{self.decisions[-1]['measured']:.3f} measured before; timing the "
                      "link again")
            self.chooser.link, self._link_seconds = self.timer.time()
            self._decide(steps_done, measured)

    def _say(self, message):
        """One line on the chief's standard output (what a user watching the job reads)."""
        if self.chief:
            say(f"tfdist compression auto {message}")
