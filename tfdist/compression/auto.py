"""`compression: auto`: measure the link and the step, then exchange with the method the
cost model predicts fastest among those that keep quality.

Compression paid off in few of the setups GRACE (Xu et al. 2021, "GRACE: A Compressed
Communication Framework for Distributed Machine Learning") and Agarwal et al. 2022 ("On
the Utility of Gradient Compression in Distributed Training Systems") measured: the
answer depends on the link, the model and the step time. So `AutoCompression`:

1. exchanges uncompressed for `probe_steps` steps, or fewer where they would last over
   `probe_seconds` (a slow link's uncompressed steps are what the user wants to avoid),
   and times them (wall time per step, as the user sees it);
2. times all-reduces of a few sizes on the strategy's own collectives and fits the link
   (bandwidth and latency per message, `cost_model.fit_link`);
3. predicts each eligible method's step: compute (the probe's step minus its predicted
   exchange) + the method's compression cost + its exchange on the link; eligible are the
   methods whose measured quality at convergence (`QUALITY`, with the conditions it was
   measured under) is within `max_quality_loss` points of `none`;
4. predicts each one's time to accuracy: its step times the steps it needed to reach the
   target against `none` (`QUALITY["steps"]`: error feedback pays for its bytes with
   slower early progress, 1.35x for PowerSGD, 1.5x for top-k);
5. exchanges with the fastest to accuracy if it saves more than `min_gain` (else stays
   uncompressed: the model's own error), with all-reduce buckets sized so each transfer
   takes 20 times the fixed cost of one more all-reduce on this link
   (`tfdist.core.buckets.bucket_bytes_for`), and says why in one line on the chief;
6. times as many steps of its choice: unless they (times its steps to accuracy) are
   `min_gain` faster than the uncompressed probe's, it goes back to uncompressed (a
   prediction is checked, never trusted: the model knows neither the runtime's overlap
   nor a loaded machine);
7. every `check_every` steps compares the step time with the one it measured: off by
   more than `drift`, it measures again.

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
from tfdist.compression.compressors import compressor_by_name
from tfdist.compression.exchange import GradientCompression
from tfdist.config import checks
from tfdist.config.load import check_arguments
from tfdist.core.buckets import bucket_bytes_for
from tfdist.core.hooks import TrainingHook
from tfdist.errors import UnsupportedError
from tfdist.strategies.kind import capabilities_of
from tfdist.strategies.task import is_chief

#: Quality at convergence: final validation mean IoU minus `none`'s, in points, and final
#: training loss against `none`'s (benchmarks/results/time_to_accuracy.json, 1 Gbit/s).
QUALITY = {
    "conditions": "UNet example (0.54 M parameters, 32x32 synthetic shapes, 4 classes), 2 "
                  "workers, 480 steps of 32 samples, Adam 0.003, compression from step 0, "
                  "mean of seeds 0, 1 and 2 (none: 0.905 mean IoU, 0.0404 loss)",
    "points": {"none": 0.0, "fp16": 3.0, "int8": 2.0, "powersgd+EF": 2.1, "topk+EF": 1.1,
               "sign+EF": -8.9},
    "loss": {"none": 1.0, "fp16": 1.00, "int8": 0.99, "powersgd+EF": 1.20, "topk+EF": 1.44,
             "sign+EF": 2.90},
    # steps to validation mean IoU 0.85 against none's (the mean over seeds of the first
    # validation, every 40 steps, that reached it), at least 1: no method is assumed to
    # converge faster than none; None: not reached with every seed
    "steps": {"none": 1.0, "fp16": 1.0, "int8": 1.0, "powersgd+EF": 1.35, "topk+EF": 1.5,
              "sign+EF": None},
}
#: How each method is built (`tfdist.compression.build` options).
METHODS = {
    "none": {"name": "none"},
    "fp16": {"name": "fp16"},
    "int8": {"name": "int8"},
    "powersgd+EF": {"name": "powersgd", "rank": 4, "error_feedback": True},
    "topk+EF": {"name": "topk", "ratio": 0.01, "error_feedback": True},
    "sign+EF": {"name": "sign", "error_feedback": True},
}
#: Compress + decompress time as a share of a step (benchmarks/results/compression_cost.json,
#: the UNet's gradients on this project's 2-core machine).
COST_SHARE = {"none": 0.0, "fp16": 0.015, "int8": 0.017, "powersgd+EF": 0.029,
              "topk+EF": 0.059, "sign+EF": 0.033}
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
    compressor = compressor_by_name(name, **options, error_feedback=error_feedback)
    return GradientCompression(compressor, error_feedback=error_feedback, seed=seed)


def eligible(max_quality_loss=1.0):
    """The methods whose measured quality is within `max_quality_loss` points of none (and
    that reached the target with every seed)."""
    return [m for m, points in QUALITY["points"].items()
            if points >= -max_quality_loss and QUALITY["steps"][m] is not None]


def choose(predicted, min_gain=0.05):
    """The fastest method of `predicted` ({method: seconds}; ties go to the first), if it
    beats `none` by more than `min_gain` (the cost model's own error); else `none`."""
    best = min(predicted, key=lambda m: (predicted[m], list(predicted).index(m)))
    none = predicted.get("none")
    return best if none is None or predicted[best] < (1 - min_gain) * none else "none"


def _valid_state(state, hooks):
    """Whether `state` is what `AutoCompression.checkpoint_state` writes, for these hooks."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    return (isinstance(state, dict) and state.get("choice") in hooks
            and isinstance(state.get("step"), int) and number(state.get("measured"))
            and isinstance(state.get("link"), list) and len(state["link"]) == 2
            and all(number(v) for v in state["link"])
            and (state.get("bucket_bytes") is None or (isinstance(state["bucket_bytes"], int)
                                                       and state["bucket_bytes"] >= 0)))


def worth_timing(floats, last_floats, last_seconds, timed, budget=0.25):
    """Whether to time an all-reduce of `floats` after `timed` sizes, the last of
    `last_floats` in `last_seconds`: at least two sizes (a line needs two points), then
    only while it is expected to take under `budget` seconds at the last one's rate."""
    if not floats:
        return False
    return timed < 2 or last_seconds * floats / last_floats <= budget


class AutoCompression(TrainingHook):
    """Chooses the gradient exchange from measurements (module docstring).

    Args:
        probe_steps: uncompressed steps timed before choosing (and after a drift), and
            steps of the choice timed before keeping it.
        probe_seconds: fewer steps (6 at least) where `probe_steps` would take longer.
        check_every: steps between two checks of the step time against its prediction.
        drift: relative difference of step time and prediction that triggers a new probe.
        min_gain: predicted share of the step a method must save to replace `none`.
        max_quality_loss: points of mean IoU a method may lose against `none` (`QUALITY`).
        seed: seed of the candidates' random choices.

    Attributes:
        choice: the method in use ("probe" while measuring).
        decisions: one dict per choice: step, link, compute seconds, predictions, choice,
            the step time measured with it (and a choice `rejected` by its measurement).
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
        self.min_gain = a["min_gain"]
        self.methods = eligible(a["max_quality_loss"])
        self.hooks = {m: _hook(METHODS[m], a["seed"]) for m in self.methods}
        self.choice, self.decisions, self.active = "probe", [], None
        self._since, self._on_trial, self._times = None, False, []

    def get_config(self):
        return None  # the choice is made again from fresh measurements

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

    def phase(self, step):
        return "none" if self.choice == "probe" else self.choice  # the probe is uncompressed

    def replica_state(self):
        return [v for method in self.methods for v in self.hooks[method].replica_state()]

    def checkpoint_state(self):
        """A kept choice (not while probing or trying it: that is measured again)."""
        if self.choice == "probe" or self._on_trial or not self.decisions:
            return None
        decision = self.decisions[-1]
        return {"choice": self.choice, "step": decision["step"],
                "measured": decision["measured"],
                "link": [decision["link"].bandwidth_bits, decision["link"].latency],
                "bucket_bytes": self.hooks[self.choice].bucket_bytes}

    def restore_checkpoint_state(self, state):
        """Resumes with the backup's choice; it is measured again only if the step time
        drifts from what it measured (`check_every`, `drift`)."""
        if not _valid_state(state, self.hooks):
            self._say(f"ignores a saved decision it cannot use ({str(state)[:200]}); "
                      "probing again")
            return
        self.choice = state["choice"]
        self.hooks[self.choice].bucket_bytes = state["bucket_bytes"]
        self.decisions.append({"step": state["step"], "link": cost_model.Link(*state["link"]),
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
        if self._since is None:  # the probe starts at this process's first step (after a
            self._since = steps_done - 1  # restart the step count comes from the backup)
        self._times = self._times[-self.check_every:] + [time.perf_counter()]
        ran = steps_done - self._since
        measuring = self.choice == "probe" or self._on_trial
        if measuring and ran == SHORTEST_WINDOW < self.probe_steps:  # every worker at once
            step = self._mean_over_workers(self._step_seconds(SHORTEST_WINDOW - 3))
            self._window = min(self.probe_steps,
                               max(SHORTEST_WINDOW, math.ceil(self.probe_seconds / step)))
        if self.choice == "probe" and ran >= self._window:
            self._decide(steps_done)
        elif self._on_trial and ran >= self._window:
            self._confirm(steps_done)
        elif self.choice != "probe" and ran >= self.check_every and ran % self.check_every == 0:
            self._check_drift(steps_done)

    # --- measuring and choosing ---------------------------------------------------------

    def _step_seconds(self, last):
        """Median wall seconds per step over the last `last` steps (tracing skipped)."""
        times = self._times[-(last + 1):]
        return statistics.median(b - a for a, b in zip(times, times[1:]))

    def _decide(self, steps_done):
        probe = self._mean_over_workers(self._step_seconds(self._window - 3))
        began = time.perf_counter()
        samples = self._time_all_reduces()
        link_seconds = time.perf_counter() - began
        try:
            link = cost_model.fit_link(samples)
        except ValueError as e:  # timings too noisy to fit: stay uncompressed, say so
            self._say(f"at step {steps_done}: {e}; exchanging uncompressed")
            link = cost_model.Link(float("inf"), 0.0)
        exchange = {m: cost_model.exchange_seconds(
            cost_model.sent_bytes(self.hooks[m].bytes_per_step(), self.workers),
            cost_model.messages(self.hooks[m].bytes_per_step(), self.workers), link)
            for m in self.methods}
        compute = max(probe - exchange["none"], 0.0)
        predicted = {m: compute * (1 + COST_SHARE.get(m, 0.0)) + exchange[m] for m in self.methods}
        to_target = {m: seconds * QUALITY["steps"][m] for m, seconds in predicted.items()}
        self.choice = choose(to_target, self.min_gain)
        bucket = bucket_bytes_for(link.bandwidth_bits, link.latency, 2 * (self.workers - 1))
        if self.choice != "none":  # traced anew for its phase; none keeps the probe's step
            self.hooks[self.choice].bucket_bytes = (max(bucket, 64 << 10)
                                                    if math.isfinite(bucket) else 0)
        self.decisions.append({"step": steps_done, "link": link, "compute_seconds": compute,
                               "bucket_bytes": self.hooks[self.choice].bucket_bytes,
                               "probe_seconds": probe, "predicted": predicted,
                               "to_target": to_target,
                               "link_seconds": link_seconds,
                               "choice": self.choice,
                               "measured": probe if self.choice == "none" else None})
        shown = ", ".join(f"{m} {predicted[m]:.3f} x {QUALITY['steps'][m]:.2f}"
                          for m in sorted(to_target, key=to_target.get))
        self._say(f"at step {steps_done}: link {link} (timed in {link_seconds:.1f} s), "
                  f"compute {compute:.3f} s/step; predicted s/step x steps to accuracy "
                  f"against none: {shown}; chose {self.choice} (all-reduce buckets of "
                  f"{self.hooks[self.choice].bucket_bytes >> 10} KiB)")
        self._times, self._since = self._times[-1:], steps_done
        self._on_trial, self._window = self.choice != "none", self.probe_steps

    def _confirm(self, steps_done):
        """Keeps the choice if its measured step, times its steps to accuracy, beats the
        probe's by `min_gain`."""
        decision = self.decisions[-1]
        measured = self._mean_over_workers(self._step_seconds(self._window - 3))
        self._on_trial, self._since, self._window = False, steps_done, self.probe_steps
        to_target = measured * QUALITY["steps"][self.choice]
        if to_target < (1 - self.min_gain) * decision["probe_seconds"]:
            decision["measured"] = measured
            self._say(f"at step {steps_done}: {self.choice} measured {measured:.3f} s/step "
                      f"against {decision['probe_seconds']:.3f} uncompressed; keeping it")
            return
        decision.update(measured=decision["probe_seconds"], rejected=self.choice,
                        rejected_seconds=measured)
        self._say(f"at step {steps_done}: {self.choice} measured {measured:.3f} s/step (x "
                  f"{QUALITY['steps'][self.choice]:.2f} steps to accuracy), not "
                  f"{100 * self.min_gain:.0f}% under {decision['probe_seconds']:.3f} "
                  "uncompressed; exchanging uncompressed")
        self.choice, self._times = "none", self._times[-1:]

    def _check_drift(self, steps_done):
        measured = self._mean_over_workers(self._step_seconds(self.check_every // 2))
        expected = self.decisions[-1]["measured"]
        if abs(measured - expected) > self.drift * expected:
            self._say(f"at step {steps_done}: {measured:.3f} s/step against {expected:.3f} "
                      "measured before; measuring again")
            self.choice, self._since = "probe", steps_done

    def _time_all_reduces(self):
        """[(bytes sent per worker, messages, seconds)] of all-reduces of growing sizes,
        while the next size is expected to take under 0.25 s at the rate of the last one
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
            print(f"tfdist compression auto {message}", flush=True)
