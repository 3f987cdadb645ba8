"""How fast is the link between the workers? All-reduces of growing sizes timed on the
strategy's own collectives, fitted by the cost model (`cost_model.fit_link`): what
`compression: auto` decides from, measured before the first step (no training step is
spent on it)."""

import time

import tensorflow as tf

from tfdist.compression import cost_model
from tfdist.step.tracing import plain_function

PROBE_FLOATS = (1 << 10, 1 << 14, 1 << 17, 1 << 19, 1 << 21)  # 4 kB .. 8 MB all-reduces


def worth_timing(floats, last_floats, last_seconds, timed, budget=0.05):
    """Whether to time an all-reduce of `floats` after `timed` sizes, the last of
    `last_floats` in `last_seconds`: at least two sizes (a line needs two points), then
    only while it is expected to take under `budget` seconds at the last one's rate."""
    if not floats:
        return False
    return timed < 2 or last_seconds * floats / last_floats <= budget


class LinkTimer:
    """Times the link of `strategy`'s replicas; `say(line)` tells the user what it could
    not fit. Every number it returns is averaged over the workers, so every worker decides
    from the same ones (a different decision would pair different collectives)."""

    def __init__(self, strategy, say):
        self.strategy, self.say = strategy, say
        self.workers = max(strategy.num_replicas_in_sync, 1)
        self._mean = plain_function(lambda value: strategy.reduce(
            "MEAN", strategy.run(lambda: tf.identity(value)), axis=None))

    def time(self):
        """(The fitted `cost_model.Link`, the seconds timing it took); an infinitely fast
        link, said, where the timings are too noisy to fit."""
        began = time.perf_counter()
        samples = self.samples()
        seconds = time.perf_counter() - began
        try:
            return cost_model.fit_link(samples), seconds
        except ValueError as e:  # timings too noisy to fit: no exchange is predicted to pay
            self.say(f"{e}; taking the link as free")
            return cost_model.Link(float("inf"), 0.0), seconds

    def samples(self):
        """[(bytes sent per worker, messages, seconds)] of all-reduces of growing sizes,
        while the next size is expected to take under 0.05 s at the rate of the last one
        (a slow link is measured quickly); each time is the fastest of 3, averaged over the
        workers (so every worker stops at the same size)."""
        samples = []
        for floats, following in zip(PROBE_FLOATS, PROBE_FLOATS[1:] + (None,)):
            fastest = self.mean(min(self._seconds(floats)))
            samples.append((cost_model.ring(4 * floats, self.workers), 2 * (self.workers - 1),
                            fastest))
            if not worth_timing(following, floats, fastest, len(samples)):
                break
        return samples

    def _seconds(self, floats):
        """Three timings of an all-reduce of `floats` (traced and set up first, untimed)."""
        reduce = plain_function(lambda: self.strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.zeros([floats]))))
        reduce()
        seconds = []
        for _ in range(3):
            start = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(),
                                  self.strategy.experimental_local_results(reduce()))
            seconds.append(time.perf_counter() - start)
        return seconds

    def mean(self, value):
        """`value` averaged over the workers: the same number on every worker."""
        if self.strategy.num_replicas_in_sync <= 1:
            return float(value)
        return float(self._mean(tf.constant(value, tf.float64)))
