"""What each method should send, from the model's shapes alone (no measurement).

A ring all-reduce of S bytes sends 2 (N - 1) / N x S per worker; an all-gather of a
P-byte payload sends (N - 1) x P per worker (each worker's payload reaches every other).
Local SGD sends one all-reduce of the weights every `period` steps. Used next to the
measured loopback bytes, and by the projection to other clusters and networks.
"""

import math

from tfdist.compression.cost_model import Link, exchange_seconds, gather, ring

BLOCK = 64  # tfdist's quantiser alignment (int8, qsgd, sign): each tensor padded to it


def bytes_per_worker(method, shapes, workers):
    """Bytes one worker sends per step for `method` (a name of `methods.METHODS`)."""
    sizes = [math.prod(s) for s in shapes]
    total = sum(sizes)
    if method in ("none", "plain tf.distribute"):
        return ring(4 * total, workers)
    if method.startswith("local SGD"):
        return ring(4 * total, workers) / int(method.split()[-1])
    if method in ("fp16", "bf16", "int8", "qsgd"):  # min_size 1024: small tensors float32
        small = sum(n for n in sizes if n < 1024)
        large = [n for n in sizes if n >= 1024]
        if method in ("fp16", "bf16"):
            return ring(4 * small + 2 * sum(large), workers)
        padded = sum(-(-n // BLOCK) * BLOCK for n in large)
        return ring(4 * small, workers) + gather(padded + 4 * len(large), workers)
    name = method.split("+")[0]
    if name == "sign":  # min_size 0: every tensor, 1 bit per value + a scale
        padded = sum(-(-n // BLOCK) * BLOCK for n in sizes)
        scales = padded // 64 if method.endswith("blocks") else len(sizes)  # block_size 64
        return gather(padded // 8 + 4 * scales, workers)
    if name == "topk":
        return gather(8 * math.ceil(0.01 * total), workers)
    if name == "randomk":
        return ring(4 * math.ceil(0.01 * total), workers)
    if name == "powersgd":  # rank 4; vectors go uncompressed
        vectors = sum(n for s, n in zip(shapes, sizes) if len(s) < 2)
        factors = sum(4 * min(4, math.prod(s[:-1]), s[-1]) * (math.prod(s[:-1]) + s[-1])
                      for s in shapes if len(s) >= 2)
        return ring(4 * vectors + factors, workers)
    raise ValueError(f"no analytic model for {method!r}")


def step_seconds(method, shapes, workers, compute, cost, bandwidth_bits, latency=50e-6):
    """Projected seconds per step: compute + compress/decompress cost + the bytes one
    worker sends at `bandwidth_bits` per second (tfdist's cost model, the one
    `compression: auto` uses: a ring or gather needs 2 (N - 1) or N - 1 sequential
    messages, each paying `latency`)."""
    messages = 2 * (workers - 1)
    if method.startswith("local SGD"):
        messages /= int(method.split()[-1])
    return compute + cost + exchange_seconds(bytes_per_worker(method, shapes, workers), messages,
                                             Link(bandwidth_bits, latency))
