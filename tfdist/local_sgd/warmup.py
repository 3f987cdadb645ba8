"""The warm-up of local SGD: how many synchronous steps run before local steps begin.

Post-local SGD (Lin et al. 2020, "Don't Use Large Mini-Batches, Use Local SGD"): a fixed
`warmup_steps` of ordinary synchronous training first, its gradient exchange optionally
compressed (`warmup_compression`). With `warmup_steps: auto`, the warm-up exchanges as
`compression: auto` chooses and ends when the cost model (`go_local`) predicts that
local steps reach accuracy sooner: before the first step once auto has timed the link,
or once auto has measured the method it keeps. Its judgements are logged
(`tfdist.report`).
"""

from tfdist.compression.auto import AutoCompression
from tfdist.compression.choice import QUALITY
from tfdist.config.yaml_source import Source
from tfdist.local_sgd import go_local
from tfdist.report import say
from tfdist.strategies.task import is_chief

#: `warmup_steps` while `warmup_steps: auto` has not decided (a count no run reaches).
NOT_YET = 1 << 62
#: Where a warm-up's objects come from: `ModelAverager`'s arguments.
_ARGUMENTS = Source.of_call("ModelAverager")


class Warmup:
    """The synchronous steps before local ones.

    Args:
        steps: a count, or "auto".
        exchange: the warm-up's gradient exchange (a `GradientCompression` or
            `AutoCompression` hook), or None (Keras' all-reduce).
        shape: the averager whose local steps would follow (its period, fragments,
            overlap, outer optimizer, islands, bytes per step and planned length).
    """

    def __init__(self, steps, exchange, shape):
        self.auto = steps == "auto"
        self.steps = NOT_YET if self.auto else steps
        self.exchange, self.shape = exchange, shape
        self.going_local = []  # auto: one dict per judgement
        if (exchange is not None and exchange.phased
                and not isinstance(exchange, AutoCompression)):
            raise _ARGUMENTS.error(("warmup_compression",), "the warm-up's exchange has no "
                                   "phases of its own (no ratio warm-up); warmup_steps is "
                                   f"its schedule. Received: warmup_compression={exchange!r}")
        if self.auto and not isinstance(exchange, AutoCompression):
            raise _ARGUMENTS.error(("warmup_steps",), "warmup_steps='auto' decides from "
                                   "compression: auto's measurements, so the warm-up "
                                   "exchanges as auto chooses. Received: "
                                   f"warmup_compression={exchange!r}")

    @property
    def chooses(self):
        """Whether `compression: auto` exchanges the warm-up's gradients."""
        return isinstance(self.exchange, AutoCompression)

    def prepare(self, step):
        """During the warm-up, auto's exchange prepares (its first step: the link timed);
        `warmup_steps: auto` judges there, before step 0, whether to go local at once."""
        if step < self.steps and self.chooses:
            self.exchange.prepare(step)
            if self.auto and step == 0:
                self.judge_from_first_step()

    def phase(self, step):
        """Synchronous during the warm-up (True; with auto's exchange, the name of the
        method it exchanges with), local (False) after it."""
        if step >= self.steps:
            return False
        return self.exchange.phase(step) if self.chooses else True

    def after_step(self, model, steps_done):
        """After a synchronous step: auto measures and chooses; `warmup_steps: auto`
        judges once auto keeps a choice."""
        if self.chooses:
            self.exchange.after_step(model, steps_done)
        if self.auto:
            self.judge(steps_done)

    def judge(self, steps_done):
        """`warmup_steps: auto`: once auto has measured the choice it keeps, whether local
        steps would reach accuracy sooner (`go_local`); if so they begin with the next step.
        Every worker judges the same numbers (auto's are averaged over the workers)."""
        auto, shape = self.exchange, self.shape
        decisions = [d for d in auto.decisions if "compute_seconds" in d]  # not restored
        if (self.steps != NOT_YET or not auto.kept or not decisions
                or sum(not j["first_step"] for j in self.going_local) == len(decisions)):
            return
        decision = decisions[-1]
        sync = go_local.sync_seconds(shape, auto.link, auto.workers)
        local = go_local.local_step_seconds(decision["compute_seconds"], sync, shape.period,
                                            shape.fragments, shape.overlap_steps)
        trace = decision.get("trace_seconds") or 0.0
        switch = go_local.switch_seconds(trace)
        remaining = (None if shape.planned_steps is None
                     else max(shape.planned_steps - steps_done, 0))
        steps = QUALITY["steps"][auto.choice]
        to_target = go_local.seconds_to_target(local, decision["measured"], steps, remaining,
                                               switch)
        going = go_local.goes_local(*to_target, auto.min_gain)
        self.going_local.append({"step": steps_done, "first_step": False, "local_seconds": local,
                                 "sync_seconds": sync, "synchronous": auto.choice,
                                 "synchronous_seconds": decision["measured"],
                                 "switch_seconds": switch, "remaining_steps": remaining,
                                 "to_target": to_target, "local": going})
        if going:
            self.steps = steps_done
        weighed = ("per step of none's (the run's length is not planned: the switch's "
                   f"{switch:.1f} s not weighed)" if remaining is None else
                   f"over the {remaining} steps the run plans, switching {switch:.1f} s "
                   f"({go_local.SWITCH_TRACES} x the first step's trace, {trace:.3f} s)")
        self._say(f"at step {steps_done}: local steps predicted {local:.3f} s x "
                  f"{go_local.LOCAL_STEPS:.2f} steps to accuracy (synchronisation {sync:.3f} s "
                  f"every {shape.period}) against {auto.choice} measured "
                  f"{decision['measured']:.3f} s x {steps:.2f}: {to_target[0]:.2f} s against "
                  f"{to_target[1]:.2f} s {weighed}; "
                  f"{'local steps begin' if going else 'staying synchronous'}")

    def judge_from_first_step(self):
        """`warmup_steps: auto`, before the first step, once auto has timed the link:
        whether plain local steps begin at once (`go_local.starts_local`), so no synchronous
        step is traced to be thrown away. Every worker judges the same numbers."""
        auto, shape = self.exchange, self.shape
        if (self.going_local or auto.link is None or shape.islands is not None
                or not go_local.measured_from_first_step(shape.outer, shape.period)):
            return False
        sync = go_local.sync_seconds(shape, auto.link, auto.workers)
        faster, ratio = go_local.starts_local(
            auto.exchange_seconds(auto.link), sync, shape.period, shape.fragments,
            shape.overlap_steps, auto.min_gain)
        points = go_local.FROM_FIRST_STEP["points"]
        going = faster and points >= -auto.max_quality_loss
        self.going_local.append({"step": 0, "first_step": True, "sync_seconds": sync,
                                 "ratio": ratio, "local": going})
        if going:
            self.steps = 0
        verdict = ("local steps begin" if going else
                   "staying synchronous while auto measures" if not faster else
                   f"staying synchronous: their measured quality ({points:+.1f} points "
                   f"of mean IoU against none) is outside max_quality_loss "
                   f"{auto.max_quality_loss}")
        computes = go_local.PRIOR_COMPUTE
        self._say(f"at step 0: local steps from the first step predicted at most {ratio:.2f} "
                  f"x the best synchronous method's time to accuracy for a step computing "
                  f"{computes[0]:g} to {computes[-1]:g} s (x "
                  f"{go_local.FROM_FIRST_STEP['steps']:.2f} steps, synchronisation {sync:.3f} s "
                  f"every {shape.period}) on link {auto.link}; {verdict}")
        return going

    def _say(self, judgement):
        if is_chief(self.shape.strategy):
            say(f"tfdist local_sgd warmup_steps auto {judgement}")

    # --- a backup -----------------------------------------------------------------------

    def state(self):
        state = {}
        if self.auto:  # when local steps began (None: not yet)
            state["warmup_steps"] = None if self.steps == NOT_YET else self.steps
        if self.chooses:  # auto's kept choice
            state["auto"] = self.exchange.checkpoint_state()
        return state

    def keys(self):
        return ({"warmup_steps"} if self.auto else set()) | ({"auto"} if self.chooses else set())

    def valid(self, state):
        steps = state.get("warmup_steps")
        return not self.auto or steps is None or (type(steps) is int and 0 <= steps < 2**62)

    def restore(self, state):
        if self.auto:
            self.steps = NOT_YET if state["warmup_steps"] is None else state["warmup_steps"]
        if self.chooses and state["auto"] is not None:
            self.exchange.restore_checkpoint_state(state["auto"])
