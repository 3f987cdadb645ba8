"""How long an exchange takes on a link: the cost model `compression: auto` chooses with,
and the benchmark report checks against a capped link (benchmarks/measure/analytic.py).

A ring all-reduce of S bytes sends 2 (N - 1) / N x S per worker in 2 (N - 1) sequential
messages; an all-gather of a P-byte payload sends (N - 1) x P in N - 1 messages (Patarasuk
and Yuan 2009, "Bandwidth optimal all-reduce algorithms"). Each message pays the link's
latency; each byte its bandwidth. No TensorFlow here.
"""

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Link:
    """A network link: bits per second and seconds of latency per message."""

    bandwidth_bits: float
    latency: float = 50e-6

    def __str__(self):
        return f"{self.bandwidth_bits / 1e6:.0f} Mbit/s, {self.latency * 1e3:.2f} ms latency"


def ring(size, workers):
    """Bytes one worker sends in a ring all-reduce of `size` bytes."""
    return 2 * (workers - 1) / workers * size


def gather(payload, workers):
    """Bytes one worker sends in an all-gather of a `payload`-byte contribution."""
    return (workers - 1) * payload


def sent_bytes(sizes, workers):
    """Bytes one worker sends per step for a hook's `bytes_per_step()` (payload, of which
    `gathered` is all-gathered and the rest all-reduced)."""
    return ring(sizes["payload"] - sizes["gathered"], workers) + gather(sizes["gathered"], workers)


def messages(sizes, workers):
    """Sequential messages per step: a ring for the all-reduced part, a gather for the rest."""
    reduced = sizes["payload"] > sizes["gathered"]
    return 2 * (workers - 1) * reduced + (workers - 1) * (sizes["gathered"] > 0)


def exchange_seconds(sent, message_count, link):
    """Seconds to send `sent` bytes in `message_count` sequential messages over `link`."""
    return 8 * sent / link.bandwidth_bits + message_count * link.latency


def fit_link(samples):
    """The `Link` that best explains timed all-reduces: least squares of seconds against
    bytes sent per worker, over `samples` of (bytes sent, messages, seconds).

    Raises:
        ValueError: fewer than two distinct sizes, or times that fall as sizes grow.
    """
    if len({b for b, _, _ in samples}) < 2:
        raise ValueError(f"a link needs timings of two sizes or more. Received: {samples}")
    n = len(samples)
    mean_b = sum(b for b, _, _ in samples) / n
    mean_t = sum(t for _, _, t in samples) / n
    slope = (sum((b - mean_b) * (t - mean_t) for b, _, t in samples)
             / sum((b - mean_b) ** 2 for b, _, _ in samples))
    if not slope > 0 or not math.isfinite(slope):
        raise ValueError(f"all-reduce times do not grow with size. Received: {samples}")
    intercept = mean_t - slope * mean_b
    per_message = max(intercept, 0.0) / max(sum(m for _, m, _ in samples) / n, 1)
    return Link(bandwidth_bits=8 / slope, latency=per_message)
