"""Gradient buckets: the all-reduce of a step split so it overlaps the backward pass.

As PyTorch DDP's buckets (Li et al. 2020, "PyTorch Distributed: Experiences on
Accelerating Data Parallel Training") and Horovod's tensor fusion: tensors are grouped in
reverse order — the last layer's gradients are computed first — into buckets of at most
`bucket_bytes`, and each bucket is one all-reduce (TF fuses a list into one collective)
that depends only on its own gradients, so the runtime can start it while earlier
layers' gradients are still being computed. The step's finiteness verdict
(`tfdist.step.transaction`) rides on the last bucket, whose gradients come last anyway.
"""

import tensorflow as tf

from tfdist.config.checks import check_arguments
from tfdist.config.sections.compression import EXCHANGE_OPTIONS
from tfdist.step import transaction, wire
from tfdist.step.wire import nbytes

#: Bucket size of the all-reduce exchanges when none is given (0: one fused buffer).
#: Measured on the UNet (2.1 MB of gradients), 2 workers: at 100 Mbit/s buckets of 128 KiB
#: to 1 MiB are 5% faster than one buffer (benchmarks/results/buckets.md), but on a free
#: link each extra all-reduce costs ~1.6 ms, and 1 MiB buckets made the step 4 points
#: slower (pass-through overhead +9.2% against +5.1% with one buffer, 80 and 40 block
#: pairs). So the default is PyTorch DDP's 25 MiB: a bucket pays only where its transfer
#: dwarfs that fixed cost; `compression: auto` sizes buckets from the measured link.
DEFAULT_BUCKET_BYTES = 25 << 20


def bucket_bytes_for(bandwidth_bits, latency, messages, ratio=20):
    """Buckets whose transfer takes `ratio` times the fixed cost of one more all-reduce
    (`messages` sequential messages of `latency` seconds) on a link of `bandwidth_bits`."""
    return int(ratio * latency * messages * bandwidth_bits / 8)


def checked_bucket_bytes(bucket_bytes, call):
    """`bucket_bytes` of a Python call: None, or checked as the config's compression
    ``bucket_bytes`` is (an integer >= 0; 0: one bucket)."""
    if bucket_bytes is None:
        return None
    return check_arguments(call, EXCHANGE_OPTIONS, bucket_bytes=bucket_bytes)["bucket_bytes"]


def buckets(sizes, bucket_bytes):
    """Groups of tensor indices, last tensor first, each of at most `bucket_bytes` bytes
    (a larger tensor alone); `sizes` in bytes. One group when `bucket_bytes` is falsy."""
    order = list(reversed(range(len(sizes))))
    if not bucket_bytes:
        return [order] if order else []
    groups, current, filled = [], [], 0
    for i in order:
        if current and filled + sizes[i] > bucket_bytes:
            groups.append(current)
            current, filled = [], 0
        current.append(i)
        filled += sizes[i]
    return groups + [current] if current else groups


def all_reduce_in_buckets(context, tensors, bucket_bytes=None):
    """The SUM over replicas of `tensors` (in replica context): one all-reduce per bucket,
    launched last tensor first, the last one carrying the step's verdict."""
    groups = buckets([nbytes(t) for t in tensors], bucket_bytes)
    summed = [None] * len(tensors)
    for k, group in enumerate(groups):
        part = [tensors[i] for i in group]
        if k == len(groups) - 1:
            part = transaction.all_reduce_sum(context, part)
        else:
            part = wire.all_reduce(context, tf.distribute.ReduceOp.SUM, part)
        for i, t in zip(group, part):
            summed[i] = t
    return summed
