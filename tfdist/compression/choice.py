"""Which exchange `compression: auto` chooses, from measurements: each method's measured
quality and cost (benchmarks/results), the time to accuracy a step's compute and the link
predict for it, the choice before any step is timed (a minimax prior), and the stages a
choice goes through as steps are timed (`Chooser`). Pure Python."""

import math

from tfdist.compression import cost_model

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
#: How each method is built (`tfdist.compression.build` options): as `QUALITY` measured it
#: (benchmarks/measure/methods.py), the error-fed ones on every tensor (`min_size` 0). With the
#: default `min_size` the small tensors take one more all-reduce a step, beside the
#: compressed exchange: 3 ms a step more for top-k + EF on the UNet at 20 Mbit/s.
METHODS = {
    "none": {"name": "none"},
    "fp16": {"name": "fp16"},
    "int8": {"name": "int8"},
    "powersgd+EF": {"name": "powersgd", "rank": 4, "error_feedback": True, "min_size": 0},
    "topk+EF": {"name": "topk", "ratio": 0.01, "error_feedback": True, "min_size": 0},
    "sign+EF": {"name": "sign", "error_feedback": True, "min_size": 0},
}
#: Compress + decompress time as a share of a step (benchmarks/results/compression_cost.json,
#: the UNet's gradients on this project's 2-core machine).
COST_SHARE = {"none": 0.0, "fp16": 0.015, "int8": 0.017, "powersgd+EF": 0.029,
              "topk+EF": 0.059, "sign+EF": 0.033}
#: Step compute times (seconds) the prior is chosen for: 10 ms (a step worth distributing)
#: to 1 s, 4 a decade.
PRIOR_COMPUTE = tuple(0.01 * 10 ** (k / 4) for k in range(9))


def eligible(max_quality_loss=1.0):
    """The methods whose measured quality is within `max_quality_loss` points of none (and
    that reached the target with every seed)."""
    return [m for m, points in QUALITY["points"].items()
            if points >= -max_quality_loss and QUALITY["steps"][m] is not None]


def choose(to_target, min_gain=0.05, keep="none"):
    """The fastest method of `to_target` ({method: seconds}; ties go to the first), if it
    beats `keep`'s by more than `min_gain` (the cost model's own error); else `keep`."""
    best = min(to_target, key=lambda m: (to_target[m], list(to_target).index(m)))
    kept = to_target.get(keep)
    return best if kept is None or to_target[best] < (1 - min_gain) * kept else keep


def predict(compute, exchange):
    """({method: seconds per step}, {method: seconds to accuracy against none}) for a step
    computing for `compute` seconds, with `exchange` ({method: seconds on the link})."""
    step = {m: compute * (1 + COST_SHARE.get(m, 0.0)) + x for m, x in exchange.items()}
    return step, {m: seconds * QUALITY["steps"][m] for m, seconds in step.items()}


def prior(exchange, computes=PRIOR_COMPUTE):
    """The method to start with before any step is timed: the one whose time to accuracy
    is at most the smallest factor over the best's, whatever the step's compute time among
    `computes` (minimax ratio; ties go to the first of `exchange`)."""
    worst = dict.fromkeys(exchange, 0.0)
    for compute in computes:
        _, to_target = predict(compute, exchange)
        best = min(to_target.values())
        for method, seconds in to_target.items():
            worst[method] = max(worst[method], seconds / best)
    return min(exchange, key=lambda m: (worst[m], list(exchange).index(m)))


SHORTEST_WINDOW = 6  # steps: the first 3 (a new trace) are not timed
#: What a saved decision can mean: a step count and a bucket (1 TiB) no run reaches.
_MAX_STEP, _MAX_BUCKET_BYTES = 2**62, 2**40


class Chooser:
    """auto's choice through its stages, told each measurement (pure: no clock, no
    TensorFlow): the prior timed over a window of steps, then kept or another method tried
    over as many; the trial kept, or the prior back; a kept choice checked for drift every
    `check_every` steps.

    Attributes:
        choice: the method in use ("probe" before `start`).
        stage: "prior", "trial" or "kept".
        window: the steps the method in use is timed over.
        link: the `cost_model.Link` decided on.
        decisions: one dict per decision (`AutoCompression`'s docstring).
    """

    def __init__(self, methods, *, probe_steps, probe_seconds, check_every, drift,
                 min_gain):
        self.methods, self.probe_steps, self.probe_seconds = methods, probe_steps, probe_seconds
        self.check_every, self.drift, self.min_gain = check_every, drift, min_gain
        self.choice, self.stage, self.window = "probe", "prior", probe_steps
        self.link, self.decisions = None, []

    @property
    def kept(self):
        """Whether the method in use was measured and kept (not a prior or a trial being
        timed)."""
        return self.stage == "kept"

    def start(self, link, exchange):
        """Before the first step: the prior for `link` ({method: its exchange's seconds})."""
        self.link, self.choice = link, prior(exchange)
        self.stage, self.window = "prior", self.probe_steps
        return self.choice

    def size_window(self, ran, step_seconds):
        """After `SHORTEST_WINDOW` steps of a method being timed: its window shortened to
        last about `probe_seconds`, from `step_seconds()` (asked only then)."""
        if self.stage != "kept" and ran == SHORTEST_WINDOW < self.probe_steps:
            self.window = min(self.probe_steps, max(
                SHORTEST_WINDOW, math.ceil(self.probe_seconds / step_seconds())))

    def due(self, ran):
        """What `ran` steps since the last decision call for: "decide", "confirm",
        "check" or None."""
        if self.stage != "kept":
            return None if ran < self.window else "decide" if self.stage == "prior" else "confirm"
        return "check" if ran >= self.check_every and ran % self.check_every == 0 else None

    def decide(self, steps_done, measured, exchange, **noted):
        """From `measured` seconds per step of the method in use and `exchange` on the
        link: the compute time, each method's prediction and the choice (a trial, if not
        the method in use); returns the decision (`noted` kept in it)."""
        current = self.choice
        compute = max(measured - exchange[current], 0.0) / (1 + COST_SHARE.get(current, 0.0))
        predicted, to_target = predict(compute, exchange)
        to_target[current] = measured * QUALITY["steps"][current]  # measured, not predicted
        self.choice = choose(to_target, self.min_gain, keep=current)
        kept = self.choice == current
        self.decisions.append({"step": steps_done, "link": self.link, "prior": current,
                               "prior_seconds": measured, "compute_seconds": compute,
                               "predicted": predicted, "to_target": to_target,
                               "choice": self.choice, "measured": measured if kept else None,
                               **noted})
        self.stage, self.window = ("kept" if kept else "trial"), self.probe_steps
        return self.decisions[-1]

    def confirm(self, steps_done, measured):
        """Keeps the trial if its `measured` step, times its steps to accuracy, beats what
        the method before it measured; else that method comes back. Returns the line."""
        decision, trial = self.decisions[-1], self.choice
        self.stage, self.window = "kept", self.probe_steps
        before = decision["prior"]
        said, steps = f"at step {steps_done}: {trial} measured {measured:.3f} s/step", QUALITY["steps"]
        if measured * steps[trial] < decision["prior_seconds"] * steps[before]:
            decision["measured"] = measured
            return f"{said} against {decision['prior_seconds']:.3f} with {before}; keeping it"
        decision.update(measured=decision["prior_seconds"], rejected=trial,
                        rejected_seconds=measured)
        self.choice = before
        return (f"{said} (x {QUALITY['steps'][trial]:.2f} steps to accuracy), not under "
                f"{decision['prior_seconds']:.3f} with {before} (x "
                f"{QUALITY['steps'][before]:.2f}); back to {before}")

    def drifted(self, measured):
        """Whether `measured` seconds per step are off what was measured by over `drift`."""
        expected = self.decisions[-1]["measured"]
        return abs(measured - expected) > self.drift * expected

    def saved(self, bucket_bytes):
        """A kept choice as a backup keeps it (None while its prior or a trial is timed:
        that is measured again)."""
        if self.stage != "kept" or not self.decisions:
            return None
        decision = self.decisions[-1]
        return {"choice": self.choice, "step": decision["step"],
                "measured": decision["measured"], "link": _saved_link(decision["link"]),
                "bucket_bytes": bucket_bytes}

    def restore(self, state):
        """Takes up `saved`'s `state`, kept; False (nothing changed) if it is not one."""
        if not _valid_state(state, self.methods):
            return False
        self.choice, self.stage, self.link = state["choice"], "kept", _loaded_link(state["link"])
        self.decisions.append({"step": state["step"], "link": self.link,
                               "choice": self.choice, "measured": state["measured"],
                               "bucket_bytes": state["bucket_bytes"], "restored": True})
        return True


def decision_line(decision):
    """What a decision says: its measurement, the predictions and the verdict."""
    current, to_target, predicted = decision["prior"], decision["to_target"], decision["predicted"]
    shown = ", ".join(f"{m} {predicted[m]:.3f} x {QUALITY['steps'][m]:.2f}"
                      for m in sorted(to_target, key=to_target.get))
    verdict = (f"keeping {current}" if decision["choice"] == current else
               f"trying {decision['choice']} (all-reduce buckets of "
               f"{decision['bucket_bytes'] >> 10} KiB)")
    return (f"at step {decision['step']}: {current} measured {decision['prior_seconds']:.3f} "
            f"s/step, compute {decision['compute_seconds']:.3f} s/step on link "
            f"{decision['link']}; predicted s/step x steps to accuracy against none: {shown}; "
            f"{verdict}")


def _valid_state(state, methods):
    """Whether `state` is what `Chooser.saved` writes, for these methods: finite, positive
    measurements, a step and a bucket size a run can mean."""
    def number(value, low=0.0):
        return isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value >= low

    return (isinstance(state, dict) and state.get("choice") in methods
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
