"""Which exchange `compression: auto` chooses, from measurements: each method's measured
quality and cost (benchmarks/results), the time to accuracy a step's compute and the link
predict for it, and the choice before any step is timed (a minimax prior). Pure Python."""

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
#: (benchmarks/methods.py), the error-fed ones on every tensor (`min_size` 0). With the
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
