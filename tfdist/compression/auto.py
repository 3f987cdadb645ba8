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

import tensorflow as tf

from tfdist.compression import cost_model
from tfdist.compression.choice import (COST_SHARE, METHODS, PRIOR_COMPUTE,  # noqa: F401
                                       QUALITY, choose, eligible, predict, prior)
from tfdist.compression.compressors import compressor_by_name
from tfdist.compression.exchange import GradientCompression
from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.errors import UnsupportedError
from tfdist.report import say
from tfdist.step.buckets import bucket_bytes_for
from tfdist.step.hooks import TrainingHook
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
SHORTEST_WINDOW = 6  # steps: the first 3 (a new trace) are not timed
PROBE_FLOATS = (1 << 10, 1 << 14, 1 << 17, 1 << 19, 1 << 21)  # 4 kB .. 8 MB all-reduces
def _hook(options, seed):
    """The `GradientCompression` of one of `METHODS`."""
    options = dict(options)
    name, error_feedback = options.pop("name"), options.pop("error_feedback", False)
    exchange = {key: options.pop(key) for key in ("min_size",) if key in options}
    compressor = compressor_by_name(name, **options, error_feedback=error_feedback)
    return GradientCompression(compressor, error_feedback=error_feedback, seed=seed, **exchange)


def _valid_state(state, hooks):
    """Whether `state` is what `AutoCompression.checkpoint_state` writes, for these hooks:
    finite, positive measurements, a step and a bucket size a run can mean."""
    def number(value, low=0.0):
        return isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value >= low

    return (isinstance(state, dict) and state.get("choice") in hooks
            and type(state.get("step")) is int and 0 <= state["step"] < _MAX_STEP
            and number(state.get("measured"))
            and isinstance(state.get("link"), list) and len(state["link"]) == 2
            and (state["link"][0] is None or number(state["link"][0]) and state["link"][0] > 0)
            and number(state["link"][1])
            and (state.get("bucket_bytes") is None or (
                type(state["bucket_bytes"]) is int
                and 0 <= state["bucket_bytes"] <= _MAX_BUCKET_BYTES)))


def _saved_link(link):
    """A link as a backup's JSON holds it: [bits per second, latency], the bandwidth None
    for the free link taken when the timings were too noisy to fit (JSON has no inf)."""
    bandwidth = link.bandwidth_bits if math.isfinite(link.bandwidth_bits) else None
    return [bandwidth, link.latency]


def _loaded_link(saved):
    """The `cost_model.Link` of `_saved_link`'s form."""
    bandwidth, latency = saved
    return cost_model.Link(float("inf") if bandwidth is None else bandwidth, latency)


#: What a saved decision can mean: a step count and a bucket (1 TiB) no run reaches.
_MAX_STEP, _MAX_BUCKET_BYTES = 2**62, 2**40


def worth_timing(floats, last_floats, last_seconds, timed, budget=0.05):
    """Whether to time an all-reduce of `floats` after `timed` sizes, the last of
    `last_floats` in `last_seconds`: at least two sizes (a line needs two points), then
    only while it is expected to take under `budget` seconds at the last one's rate."""
    if not floats:
        return False
    return timed < 2 or last_seconds * floats / last_floats <= budget


class AutoCompression(TrainingHook):
    """Chooses the gradient exchange from measurements (module docstring).

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

    Attributes:
        choice: the method in use ("probe" before the link is timed, at the first step).
        decisions: one dict per decision: step, link, the method measured (`prior`) and
            its `prior_seconds` per step, compute seconds, predictions, choice, the step
            time measured with it (and a choice `rejected` by its measurement).
    """

    replaces_exchange = True
    phased = True
    #: What strategy checks read of a compression hook (its name, and that it compresses).
    compressor = types.SimpleNamespace(name="auto", compresses=True)

    def __init__(self, *, probe_steps=20, probe_seconds=5.0, check_every=200, drift=0.3,
                 max_quality_loss=1.0, min_gain=0.05, seed=0):
        a = check_arguments("AutoCompression", ARGUMENTS, probe_steps=probe_steps,
                            probe_seconds=probe_seconds, check_every=check_every, drift=drift,
                            max_quality_loss=max_quality_loss, min_gain=min_gain, seed=seed)
        self.probe_steps, self.check_every, self.drift = (a["probe_steps"], a["check_every"],
                                                          a["drift"])
        self.probe_seconds, self._window = a["probe_seconds"], a["probe_steps"]
        self.min_gain, self.max_quality_loss = a["min_gain"], a["max_quality_loss"]
        self.methods = eligible(self.max_quality_loss)
        self.hooks = {m: _hook(METHODS[m], a["seed"]) for m in self.methods}
        self.choice, self.decisions, self.active = "probe", [], None
        self.link, self._link_seconds = None, None
        self._since, self._stage, self._times = None, "prior", []
        self._began, self._first_step, self.trace_seconds = None, None, None

    def get_config(self):
        return None  # the choice is made again from fresh measurements

    @property
    def kept(self):
        """Whether the method in use was measured and kept (not a prior or a trial being
        timed)."""
        return self._stage == "kept"

    # --- the hook contract --------------------------------------------------------------

    def build(self, strategy, variables):
        if capabilities_of(strategy).push:
            raise UnsupportedError("compression: auto chooses between exchanges of replicas; "
                                   "under parameter servers name a push compression instead. "
                                   f"Received: strategy={type(strategy).__name__}")
        self.strategy, self.chief = strategy, is_chief(strategy)
        self.workers = max(strategy.num_replicas_in_sync, 1)
        self._mean = tf.function(lambda value: strategy.reduce(
            "MEAN", strategy.run(lambda: tf.identity(value)), axis=None))
        for hook in self.hooks.values():
            hook.build(strategy, variables)

    def prepare(self, step):
        if self.choice == "probe":  # every worker's first step: time the link, take the prior
            self._start(step)

    def phase(self, step):
        return self.choice

    def replica_state(self):
        return [v for method in self.methods for v in self.hooks[method].replica_state()]

    def replica_state_rules(self):
        return [r for method in self.methods for r in self.hooks[method].replica_state_rules()]

    measures_the_cluster = True

    def checkpoint_state(self):
        """A kept choice (not while its prior or a trial is timed: that is measured again)."""
        if self._stage != "kept" or not self.decisions:
            return None
        decision = self.decisions[-1]
        return {"choice": self.choice, "step": decision["step"],
                "measured": decision["measured"],
                "link": _saved_link(decision["link"]),
                "bucket_bytes": self.hooks[self.choice].bucket_bytes}

    def restore_checkpoint_state(self, state):
        """Resumes with the backup's choice; it is measured again only if the step time
        drifts from what it measured (`check_every`, `drift`)."""
        if not _valid_state(state, self.hooks):
            self._say(f"ignores a saved decision it cannot use ({str(state)[:200]}); "
                      "measuring again")
            return
        self.choice, self._stage = state["choice"], "kept"
        self.link = _loaded_link(state["link"])
        self.hooks[self.choice].bucket_bytes = state["bucket_bytes"]
        self.decisions.append({"step": state["step"], "link": self.link,
                               "choice": self.choice, "measured": state["measured"],
                               "bucket_bytes": state["bucket_bytes"], "restored": True})
        self._say(f"resumed with {self.choice}, chosen at step {state['step']} (measured "
                  f"{state['measured']:.3f} s/step); measuring again if the step time drifts")

    def enter_phase(self, phase):
        super().enter_phase(phase)
        self.active = self.hooks[phase]
        self.active.enter_phase(self.active.phase(0))

    def exchange(self, grads, variables, step):
        return self.active.exchange(grads, variables, step)

    def on_step_end(self, step):
        return self.active.on_step_end(step)

    def bytes_per_step(self, step=None):
        return (self.active or self.hooks["none"]).bytes_per_step()

    def after_step(self, model, steps_done):
        if self._since is None:  # timing starts at this process's first step (after a
            self._since = steps_done - 1  # restart the step count comes from the backup)
            if self._began is not None:  # the first step: its trace, and one step
                self._first_step = time.perf_counter() - self._began
        self._times = self._times[-self.check_every:] + [time.perf_counter()]
        ran = steps_done - self._since
        if self._stage != "kept" and ran == SHORTEST_WINDOW < self.probe_steps:
            step = self._mean_over_workers(self._step_seconds(SHORTEST_WINDOW - 3))
            self._window = min(self.probe_steps,  # the same length on every worker
                               max(SHORTEST_WINDOW, math.ceil(self.probe_seconds / step)))
        if self._stage == "prior" and ran >= self._window:
            measured = self._mean_over_workers(self._step_seconds(self._window - 3))
            self._decide(steps_done, measured)
        elif self._stage == "trial" and ran >= self._window:
            self._confirm(steps_done)
        elif self._stage == "kept" and ran >= self.check_every and ran % self.check_every == 0:
            self._check_drift(steps_done)

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

    def _time_link(self):
        """The link fitted to timed all-reduces (an infinitely fast one, said, if the
        timings are too noisy to fit), and the seconds timing it took."""
        began = time.perf_counter()
        samples = self._time_all_reduces()
        seconds = time.perf_counter() - began
        try:
            return cost_model.fit_link(samples), seconds
        except ValueError as e:  # timings too noisy to fit: no exchange is predicted to pay
            self._say(f"{e}; taking the link as free")
            return cost_model.Link(float("inf"), 0.0), seconds

    def _size_buckets(self, method):
        """Before `method` is traced: its all-reduce buckets sized for the link (`none`
        keeps its own)."""
        if method != "none":
            bucket = bucket_bytes_for(self.link.bandwidth_bits, self.link.latency,
                                      2 * (self.workers - 1))
            self.hooks[method].bucket_bytes = (max(bucket, 64 << 10)
                                               if math.isfinite(bucket) else 0)

    def _start(self, step):
        """Before the first step: the link timed, the prior chosen for it."""
        self.link, self._link_seconds = self._time_link()
        self.choice = prior(self.exchange_seconds(self.link))
        self._size_buckets(self.choice)
        self._stage, self._window = "prior", self.probe_steps
        self._say(f"at step {step}: link {self.link} (timed in {self._link_seconds:.1f} s); "
                  f"starting with {self.choice}, timed over its first steps")
        self._began = time.perf_counter()

    def _decide(self, steps_done, measured):
        """From `measured` seconds per step of the method in use: the compute time, every
        method's prediction, and the choice (a trial, if not the method in use)."""
        current = self.choice
        if self.trace_seconds is None and self._first_step is not None:  # every worker's
            self.trace_seconds = self._mean_over_workers(max(self._first_step - measured, 0.0))
        exchange = self.exchange_seconds(self.link)
        compute = max(measured - exchange[current], 0.0) / (1 + COST_SHARE.get(current, 0.0))
        predicted, to_target = predict(compute, exchange)
        to_target[current] = measured * QUALITY["steps"][current]  # measured, not predicted
        self.choice = choose(to_target, self.min_gain, keep=current)
        if self.choice != current:
            self._size_buckets(self.choice)
        self.decisions.append({"step": steps_done, "link": self.link, "prior": current,
                               "prior_seconds": measured, "compute_seconds": compute,
                               "bucket_bytes": self.hooks[self.choice].bucket_bytes,
                               "predicted": predicted, "to_target": to_target,
                               "link_seconds": self._link_seconds, "choice": self.choice,
                               "trace_seconds": self.trace_seconds,
                               "measured": measured if self.choice == current else None})
        shown = ", ".join(f"{m} {predicted[m]:.3f} x {QUALITY['steps'][m]:.2f}"
                          for m in sorted(to_target, key=to_target.get))
        verdict = (f"keeping {current}" if self.choice == current else
                   f"trying {self.choice} (all-reduce buckets of "
                   f"{self.hooks[self.choice].bucket_bytes >> 10} KiB)")
        self._say(f"at step {steps_done}: {current} measured {measured:.3f} s/step, compute "
                  f"{compute:.3f} s/step on link {self.link}; predicted s/step x steps to "
                  f"accuracy against none: {shown}; {verdict}")
        self._times, self._since, self._window = self._times[-1:], steps_done, self.probe_steps
        self._stage = "kept" if self.choice == current else "trial"

    def _confirm(self, steps_done):
        """Keeps the trial if its measured step, times its steps to accuracy, beats what
        the method before it measured; else that method comes back (its step is traced)."""
        decision = self.decisions[-1]
        measured = self._mean_over_workers(self._step_seconds(self._window - 3))
        self._stage, self._since, self._window = "kept", steps_done, self.probe_steps
        to_target = measured * QUALITY["steps"][self.choice]
        before = decision["prior"]
        if to_target < decision["prior_seconds"] * QUALITY["steps"][before]:
            decision["measured"] = measured
            self._say(f"at step {steps_done}: {self.choice} measured {measured:.3f} s/step "
                      f"against {decision['prior_seconds']:.3f} with {before}; keeping it")
            return
        decision.update(measured=decision["prior_seconds"], rejected=self.choice,
                        rejected_seconds=measured)
        self._say(f"at step {steps_done}: {self.choice} measured {measured:.3f} s/step (x "
                  f"{QUALITY['steps'][self.choice]:.2f} steps to accuracy), not under "
                  f"{decision['prior_seconds']:.3f} with {before} (x "
                  f"{QUALITY['steps'][before]:.2f}); back to {before}")
        self.choice, self._times = before, self._times[-1:]

    def _check_drift(self, steps_done):
        """The step time against what was measured: off by more than `drift`, the link is
        timed again and the steps just run decide again."""
        measured = self._mean_over_workers(self._step_seconds(self.check_every // 2))
        expected = self.decisions[-1]["measured"]
        if abs(measured - expected) > self.drift * expected:
            self._say(f"at step {steps_done}: {measured:.3f} s/step against {expected:.3f} "
                      "measured before; timing the link again")
            self.link, self._link_seconds = self._time_link()
            self._decide(steps_done, measured)

    def _time_all_reduces(self):
        """[(bytes sent per worker, messages, seconds)] of all-reduces of growing sizes,
        while the next size is expected to take under 0.05 s at the rate of the last one
        (a slow link is measured quickly); each time is the fastest of 3, averaged over the
        workers (so every worker stops at the same size)."""
        samples = []
        for floats, following in zip(PROBE_FLOATS, PROBE_FLOATS[1:] + (None,)):
            reduce = tf.function(lambda n=floats: self.strategy.run(
                lambda: tf.distribute.get_replica_context().all_reduce(
                    "SUM", tf.zeros([n]))))
            reduce()  # traced and the collective set up: not timed
            seconds = []
            for _ in range(3):
                start = time.perf_counter()
                tf.nest.map_structure(lambda t: t.numpy(), self.strategy.experimental_local_results(
                    reduce()))
                seconds.append(time.perf_counter() - start)
            fastest = self._mean_over_workers(min(seconds))  # every worker stops together
            samples.append((cost_model.ring(4 * floats, self.workers), 2 * (self.workers - 1),
                            fastest))
            if not worth_timing(following, floats, fastest, len(samples)):
                break
        return samples

    def _mean_over_workers(self, value):
        """`value` averaged over the workers: the same number on every worker."""
        if self.strategy.num_replicas_in_sync <= 1:
            return float(value)
        return float(self._mean(tf.constant(value, tf.float64)))

    def _say(self, message):
        """One line on the chief's standard output (what a user watching the job reads)."""
        if self.chief:
            say(f"tfdist compression auto {message}")
