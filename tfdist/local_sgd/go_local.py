"""`warmup_steps: auto`: local steps begin when they are predicted to reach accuracy sooner
than the synchronous exchange `compression: auto` measured — or never, on a link where
they would not.

The DiLoCo family joins auto's candidates here, where the config allows local steps (a
`local_sgd:` section): after auto has timed the link and measured its own choice's step
(`tfdist.compression.auto`, no uncompressed step spent), a local step is predicted to cost
the step's compute (and the synchronisations' work beside it, `LOCAL_OVERHEAD`) plus the
part of each synchronisation the next steps do not hide, and the local phase to need
`LOCAL_STEPS` times the steps synchronous training needs to the same accuracy (Streaming
DiLoCo, Douillard et al. 2025, after a short warm-up). Going local also costs once: the
local step and each fragment's synchronisation are traced (`SWITCH_TRACES` times the first
step's trace). Over what is left of the run the loop plans (`model.fit`'s epochs x steps,
`tfdist.Trainer.fit`'s), it goes local when that beats auto's measured choice by
`min_gain`; a loop that plans no length (your own) weighs the rates alone.

Where the local steps are plain local SGD (no outer optimizer, a period of at most
`FROM_FIRST_STEP["longest_period"]`), they may also begin *at the first step*: any decision
made after a step is traced costs a trace that is thrown away, ≥ 15% of a short run. Right
after auto has timed the link, before any step, they do when they are predicted to reach
accuracy `min_gain` sooner than every synchronous method auto may choose, whatever the
step's compute time (the range auto's prior weighs, `tfdist.compression.choice.PRIOR_COMPUTE`),
and their measured quality is within auto's `max_quality_loss` (`starts_local`).
"""

from tfdist.compression import cost_model
from tfdist.compression.choice import PRIOR_COMPUTE, predict
from tfdist.local_sgd.islands import exchanged_shapes

#: Steps to validation mean IoU 0.85 of auto's synchronous warm-up (20 steps) then
#: Streaming DiLoCo (period 32, 4 fragments, 2 steps of overlap, Nesterov 0.7/0.9, int4),
#: against fp16's (none's quality, `QUALITY`): 9.5 against 7.0 validations of 40 steps, the
#: mean over seeds 0-2 at 100 and 20 Mbit/s (benchmarks/results/auto_local.json as of commit
#: 84d286f, UNet example on 2 workers). A warm-up of 20 uncompressed steps measured 1.21
#: (2 seeds). The factor belongs to the method: plain local SGD from the first step
#: (period 16, streamed the same way, no outer step) needed 0.95 (benchmarks/results/
#: slow_link_limit.md), which `warmup_steps: auto`, deciding after synchronous steps, does
#: not reach.
LOCAL_STEPS = 1.36
#: A steady local step's wall time (synchronisations included) against the compute time
#: auto estimated from its synchronous steps: on cores the step fills, each fragment's send
#: and apply, and the exchange beside the steps, take their share. The median of 3 seeds at
#: 20 Mbit/s, 0.99 to 1.10 (benchmarks/go_local_costs.py, results/go_local_costs.md).
LOCAL_OVERHEAD = 1.06
#: Seconds going local costs once (the local step traced, and each fragment's send,
#: exchange and apply, and the average before validation) against the first step's trace
#: (its time over a steady step, as auto measured it): the median of the same runs, 1.45 to
#: 1.53 (4.95 to 5.64 s against traces of 3.25 to 3.68 s).
SWITCH_TRACES = 1.5
#: Plain local SGD from the first step (period 16, in 4 fragments of int4 each exchanged
#: beside 2 steps, mixed half and half; no outer optimizer, no warm-up), against fp16 (none's
#: steps, `QUALITY`): 0.95x the steps to validation mean IoU 0.85 (267 against 280), final
#: mean IoU 0.907 against none's 0.905 (`QUALITY`'s conditions: +0.2 points; fp16 ended 2.0
#: points higher the same day), final loss 0.0471, 1.17x none's 0.0404; 3 seeds at 1 Gbit/s,
#: 100 and 20 Mbit/s, alike on each (benchmarks/results/slow_link_limit.md). Taken for plain
#: averaging up to that period (a shorter one is nearer synchronous training). Streaming
#: DiLoCo 32 (outer Nesterov 0.7/0.9) from the first step needed 1.52x (427 against 280,
#: final mean IoU 0.903; benchmarks/results/diloco_first_step.md), more than after auto's
#: warm-up (`LOCAL_STEPS`) and more than any synchronous method auto chooses, so it could
#: never win whatever a step computes: an outer optimizer, or a period not measured, does
#: not begin there.
FROM_FIRST_STEP = {"steps": 0.95, "points": 0.2, "longest_period": 16}


def local_step_seconds(compute, sync_seconds, period, fragments=1, overlap_steps=0):
    """Wall seconds per local step: `compute` (times `LOCAL_OVERHEAD`), plus each of the
    `fragments` exchanges of a period (`sync_seconds` in all) less what `overlap_steps`
    steps of compute hide of it."""
    exposed = max(sync_seconds / fragments - overlap_steps * compute, 0.0) * fragments
    return compute * LOCAL_OVERHEAD + exposed / period


def bytes_per_step(averager, step=None):
    """Like `GradientCompression.bytes_per_step`, of a built `ModelAverager`: during the
    warm-up its exchange's; after it one synchronisation of the trainable weights
    (compressed or not; between islands a share per replica) every `period` steps."""
    model = averager.model_bytes
    dense = {"payload": model, "dense": model, "gathered": 0}
    if averager.across is not None:
        dense["payload"] = 4 * sum(exchanged_shapes(averager.across, [
            averager.model_sizes[i] for i in g])[0][0] for g in averager.groups)
    if step is not None and step < averager.warmup_steps:
        exchange = averager.warmup_exchange
        return dense if exchange is None else exchange.bytes_per_step()
    sent = dense if averager.compression is None else {
        k: sum(h.bytes_per_step()[k] for h in averager.exchanges) for k in ("payload", "gathered")}
    return {"payload": sent["payload"] / averager.period, "dense": model,
            "gathered": sent["gathered"] / averager.period}


def sync_seconds(averager, link, workers):
    """Seconds of one whole synchronisation of `averager`'s model on `link` (every
    fragment, compressed as configured), by the cost model."""
    per_step = bytes_per_step(averager)  # after the warm-up: a period's exchanges / period
    whole = {k: per_step[k] * averager.period for k in ("payload", "gathered")}
    messages = cost_model.messages(whole, workers) * averager.fragments
    return cost_model.exchange_seconds(cost_model.sent_bytes(whole, workers), messages, link)


def switch_seconds(first_trace):
    """Seconds going local costs once, from the first step's trace (`first_trace`)."""
    return SWITCH_TRACES * first_trace


def seconds_to_target(local_step, synchronous_step, steps_factor, remaining=None, switch=0.0):
    """(local, synchronous) seconds to accuracy: of `remaining` planned steps at
    `synchronous_step` seconds (what the synchronous method needs, `steps_factor` times
    none's), against `switch` seconds once and as many of none's steps times `LOCAL_STEPS`
    at `local_step` seconds; per step of none's (`switch` not weighed) if `remaining` is
    None."""
    if remaining is None:
        return local_step * LOCAL_STEPS, synchronous_step * steps_factor
    none_steps = remaining / steps_factor
    return switch + none_steps * LOCAL_STEPS * local_step, remaining * synchronous_step


def goes_local(local, synchronous, min_gain=0.05):
    """Whether `local` seconds to accuracy are more than `min_gain` under `synchronous`."""
    return local < (1 - min_gain) * synchronous


def measured_from_first_step(outer, period):
    """Whether local steps of this shape (`outer`: None for plain averaging) have a
    measured cost from the first step (`FROM_FIRST_STEP`)."""
    return outer is None and period <= FROM_FIRST_STEP["longest_period"]


def starts_local(exchange, sync_seconds, period, fragments=1, overlap_steps=0,
                 min_gain=0.05, computes=PRIOR_COMPUTE):
    """(whether plain local steps from the first step are predicted to reach accuracy more
    than `min_gain` sooner than the best of the synchronous methods `exchange` ({method:
    seconds of its exchange per step}) at every compute time of `computes`, the largest
    ratio of their time to accuracy to that best one's). No step has been timed: the
    verdict must hold whatever a step computes."""
    worst = 0.0
    for compute in computes:
        _, synchronous = predict(compute, exchange)
        local = local_step_seconds(compute, sync_seconds, period, fragments, overlap_steps)
        worst = max(worst, local * FROM_FIRST_STEP["steps"] / min(synchronous.values()))
    return worst < 1 - min_gain, worst
