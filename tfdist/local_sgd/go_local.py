"""`warmup_steps: auto`: local steps begin when they are predicted to reach accuracy sooner
than the synchronous exchange `compression: auto` measured — or never, on a link where
they would not.

The DiLoCo family joins auto's candidates here, where the config allows local steps (a
`local_sgd:` section): after auto has timed the link and measured its own choice's step
(`tfdist.compression.auto`, no uncompressed step spent), a local step is predicted to cost
the step's compute plus the part of each synchronisation the next steps do not hide, and
the local phase to need `LOCAL_STEPS` times the steps synchronous training needs to the
same accuracy (the warm-up's short: Streaming DiLoCo after 20 synchronous steps, Douillard
et al. 2025). It goes local when that beats auto's measured choice by `min_gain`.
"""

from tfdist.compression import cost_model

#: Steps to validation mean IoU 0.85 of Streaming DiLoCo (period 32, 4 fragments, 2 steps
#: of overlap, Nesterov 0.7/0.9, int4) after a 20-step synchronous warm-up, against
#: synchronous training's: 320 and 360 against 280 and 280, seeds 0 and 1
#: (benchmarks/results/time_to_accuracy.json, UNet example on 2 workers).
LOCAL_STEPS = 1.21


def local_step_seconds(compute, sync_seconds, period, fragments=1, overlap_steps=0):
    """Wall seconds per local step: `compute`, plus each of the `fragments` exchanges of a
    period (`sync_seconds` in all) less what `overlap_steps` steps of compute hide of it."""
    exposed = max(sync_seconds / fragments - overlap_steps * compute, 0.0) * fragments
    return compute + exposed / period


def sync_seconds(averager, link, workers):
    """Seconds of one whole synchronisation of `averager`'s model on `link` (every
    fragment, compressed as configured), by the cost model."""
    per_step = averager.bytes_per_step()  # after the warm-up: a period's exchanges / period
    whole = {k: per_step[k] * averager.period for k in ("payload", "gathered")}
    messages = cost_model.messages(whole, workers) * averager.fragments
    return cost_model.exchange_seconds(cost_model.sent_bytes(whole, workers), messages, link)


def goes_local(local_step, synchronous_to_target, min_gain=0.05):
    """Whether local steps of `local_step` seconds reach the target more than `min_gain`
    sooner than `synchronous_to_target` (seconds per step times steps to accuracy against
    none, of the synchronous exchange measured)."""
    return local_step * LOCAL_STEPS < (1 - min_gain) * synchronous_to_target
