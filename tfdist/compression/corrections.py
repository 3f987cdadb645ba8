"""What makes aggressive compression converge: DGC's corrections and EF21's error feedback,
as wrappers around any compressor's exchange (`wrappers.py` has the classic ones).

- `MomentumCorrection` and `LocalClip` are Deep Gradient Compression's (Lin et al. 2018,
  "Deep Gradient Compression: Reducing the Communication Bandwidth for Distributed
  Training", arXiv 1712.01887): each replica accumulates a local velocity u = m u + g and
  exchanges it through error feedback (which accumulates v += u and keeps what was not
  sent), then zeroes u wherever a value was sent ("momentum factor masking"); each
  replica's gradient is clipped to `clip_norm` / sqrt(N) first.
- `ratio_schedule` is DGC's exponential warm-up of the kept ratio (their 25% → 6.25% →
  1.56% → 0.4% → 0.1%), in a few stages: k is static in a compiled step.
- `EF21` is Richtarik, Sokolov and Fatkhullin 2021 ("EF21: A New, Simpler, Theoretically
  Better, and Practically Faster Error Feedback", arXiv 2106.05203): each replica keeps
  an estimate g_i of its gradient and sends only C(grad_i - g_i); the exchanged gradient
  is the sum of the estimates, which every replica keeps identically. Under a delayed
  start (`EF21DelayedStart`) the uncompressed steps are EF21 with the identity
  compressor, so compression starts from estimates equal to the last gradients.

- `freeze_variance` (an option of `GradientCompression`; the update rule is
  `tfdist.seam.frozen_variance.frozen_variance_adam`) is 1-bit Adam's (Tang et al. 2021, "1-bit
  Adam: Communication Efficient Large-Scale Training with Adam's Convergence Speed", arXiv
  2102.02888): error feedback does not mix with Adam's second moment, which is not linear
  in the gradient — the burst error feedback releases on a coordinate after many small
  steps inflates v there and damps its steps for ~1/(1 - beta_2) steps. After a warm-up
  (`start_step`) v is frozen, and Adam becomes momentum SGD with a fixed per-coordinate
  scale, for which error feedback is sound.

The scaled-sign error feedback of Karimireddy et al. 2019 is `Sign` (||x||_1 / d · sign(x)
per tensor, or per block with `block_size`) inside the classic `ErrorFeedback`.
"""

import math

import tensorflow as tf

from tfdist.compression.wrappers import DelayedStart, ErrorFeedback, MinSize, Wrapper
from tfdist.config.hyperparameters import (LOCAL_CLIP_NORM, MOMENTUM_CORRECTION,
                                           RATIO_WARMUP_START, RATIO_WARMUP_STEPS)
from tfdist.config.yaml_source import Source

STAGES = 4  # ratio warm-up stages after the start ratio (DGC used 4)


class MomentumCorrection(Wrapper):
    """Exchanges the momentum-corrected velocity u = m u + g through `inner` (classic error
    feedback around a compressor), and masks u where values were sent. Use it with an
    optimizer without momentum of its own (DGC applies plain SGD to the exchanged sum)."""

    def __init__(self, inner, momentum):
        super().__init__(inner)
        self.momentum = float(momentum)

    def init_state(self, layout, seed):
        return {"velocity": tf.zeros([layout.size]), **self.inner.init_state(layout, seed)}

    def exchange(self, buffer, layout, state, comm, seeds):
        velocity = self.momentum * state["velocity"] + buffer
        inner = {k: v for k, v in state.items() if k != "velocity"}
        summed, own, inner = self.inner.exchange(velocity, layout, inner, comm, seeds)
        kept = tf.cast(tf.equal(own, 0.0), tf.float32)  # 0 where this replica sent a value
        return summed, own, {"velocity": velocity * kept, **inner}


class LocalClip(Wrapper):
    """Clips this replica's buffer to L2 norm `clip_norm` / sqrt(N) before `inner`."""

    def __init__(self, inner, clip_norm):
        super().__init__(inner)
        self.clip_norm = float(clip_norm)

    def exchange(self, buffer, layout, state, comm, seeds):
        limit = self.clip_norm / math.sqrt(comm.num_replicas)
        return self.inner.exchange(tf.clip_by_norm(buffer, limit), layout, state, comm, seeds)


class EF21(Wrapper):
    """EF21 error feedback: sends C(buffer - estimate); the estimate and the sum of all
    replicas' estimates (the exchanged gradient) move by what was sent."""

    def init_state(self, layout, seed):
        return {"ef21_estimate": tf.zeros([layout.size]), "ef21_sum": tf.zeros([layout.size]),
                **self.inner.init_state(layout, seed)}

    def exchange(self, buffer, layout, state, comm, seeds):
        inner = {k: v for k, v in state.items() if not k.startswith("ef21_")}
        change, own, inner = self.inner.exchange(buffer - state["ef21_estimate"], layout, inner,
                                                 comm, seeds)
        total = state["ef21_sum"] + change
        return total, own, {"ef21_estimate": state["ef21_estimate"] + own, "ef21_sum": total,
                            **inner}


class EF21DelayedStart(DelayedStart):
    """`DelayedStart` around EF21: before `start_step` the plain float32 all-reduce, which is
    EF21 with the identity compressor — each replica's estimate becomes its gradient, the
    kept sum their all-reduced sum — so the first compressed step sends C(grad - last
    grad) instead of starting the estimates from zero."""

    def for_phase(self, phase):
        return self.inner.for_phase(phase) if phase else _EF21Identity(self.inner)


class _EF21Identity(Wrapper):
    """EF21 with the identity compressor: the plain all-reduce, estimates = gradients."""

    def exchange(self, buffer, layout, state, comm, seeds):
        summed = comm.all_reduce([buffer])[0]
        return summed, buffer, {**state, "ef21_estimate": buffer, "ef21_sum": summed}


def ratio_schedule(ratio, start, steps, stages=STAGES):
    """DGC's exponential warm-up: [(first step, ratio)] of each stage, from `start` down to
    `ratio` over `steps` steps (the ratio falls by the same factor at each stage)."""
    if steps <= 0 or start <= ratio:
        return [(0, ratio)]
    return [(steps * s // stages, start * (ratio / start) ** (s / stages))
            for s in range(stages)] + [(steps, ratio)]


def stage_of(schedule, step):
    """Index of the stage of `schedule` that optimizer step `step` is in."""
    return max((i for i, (first, _) in enumerate(schedule) if step >= first), default=0)


def checked_corrections(compressor, error_feedback, corrections):
    """`corrections` ({momentum_correction, local_clip_norm, ratio_warmup_steps,
    ratio_warmup_start}) checked for `compressor` as the config loader checks a file's.

    Raises:
        ConfigError: a correction out of its range, one this compressor does not take, or
            one without what it needs.
    """
    source, checked = Source.of_call("GradientCompression"), {}
    for parameter in (MOMENTUM_CORRECTION, LOCAL_CLIP_NORM, RATIO_WARMUP_STEPS,
                      RATIO_WARMUP_START):
        value = checked[parameter.name] = parameter.check(corrections[parameter.name],
                                                          "GradientCompression")
        if value != parameter.default and compressor.name not in parameter.compressors:
            raise source.error((parameter.name,), f"{parameter.name} applies only to "
                               f"[{', '.join(parameter.compressors)}]. Received: "
                               f"compressor={compressor!r}, {parameter.name}={value!r}")
    if checked["momentum_correction"] and error_feedback is not True:
        raise source.error(("momentum_correction",), "momentum_correction accumulates the "
                           "velocity in error feedback's residual (Lin et al. 2018): it needs "
                           f"error_feedback=True. Received: error_feedback={error_feedback!r}")
    start = checked["ratio_warmup_start"]
    if checked["ratio_warmup_steps"] and start <= compressor.ratio:
        raise source.error(("ratio_warmup_start",), "the ratio warm-up falls from "
                           "ratio_warmup_start to the compressor's ratio "
                           f"({compressor.ratio!r}): the start must be above it. Received: "
                           f"ratio_warmup_start={start!r}")
    return checked


def transform_of(compressor, error_feedback, corrections, start_step, min_size):
    """MinSize(DelayedStart(LocalClip(MomentumCorrection(ErrorFeedback(compressor))))),
    each part only if asked (`corrections` as `checked_corrections` gives them); EF21 in
    place of ErrorFeedback (and its delayed start keeps EF21's estimates current:
    `EF21DelayedStart`)."""
    inner = compressor
    if error_feedback == "ef21":
        inner = EF21(inner)
    elif error_feedback:
        inner = ErrorFeedback(inner)
    if corrections["momentum_correction"]:
        inner = MomentumCorrection(inner, corrections["momentum_correction"])
    if corrections["local_clip_norm"]:
        inner = LocalClip(inner, corrections["local_clip_norm"])
    if start_step > 0:
        inner = (EF21DelayedStart if error_feedback == "ef21" else DelayedStart)(inner,
                                                                               start_step)
    return MinSize(inner, min_size)
