"""Horovod's gradient averaging (`horovod.tensorflow.gradient_aggregation` and
`DistributedGradientTape`): each gradient reduced over the workers' group, compressed on
the wire (`Compression`), for `DistributedOptimizer` and your own `tf.GradientTape` loop.

Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in TensorFlow"
(2018): the gradient of each worker's batch, averaged by an allreduce, is the gradient
of the workers' batches together.
"""

import tensorflow as tf

from tfdist.horovod import basics
from tfdist.horovod.ops import grouped_allreduce, reduce_op


class _NoneCompressor:
    """Horovod's `Compression.none`: the tensor as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16Compressor:
    """Horovod's `Compression.fp16`: floating tensors cross as float16."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """Horovod's gradient compression choices."""

    none = _NoneCompressor
    fp16 = _FP16Compressor


def check_options(compression, num_groups=0, groups=None, process_set=None,
                  gradient_predivide_factor=1.0):
    """Refuses, in one line, the options of Horovod's gradient averaging not built here
    (`compression` None: `DistributedOptimizer`'s, which takes tfdist's too, checks it)."""
    if compression is not None and compression not in (Compression.none, Compression.fp16):
        raise ValueError("compression must be hvd.Compression.none or hvd.Compression.fp16 "
                         "(tfdist's own compressors: hvd.DistributedOptimizer). "
                         f"Received: compression={compression!r:.80}")
    if num_groups or groups is not None or process_set is not None \
            or gradient_predivide_factor != 1.0:
        raise ValueError(
            "tfdist.horovod does not take num_groups, groups, process_set or "
            "gradient_predivide_factor: every gradient is averaged over every worker. "
            f"Received: num_groups={num_groups!r}, groups={groups!r:.80}, "
            f"process_set={process_set!r:.80}, "
            f"gradient_predivide_factor={gradient_predivide_factor!r}")


def reduce_gradients(grads, op="Average", compression=Compression.none, sparse_as_dense=False):
    """Each gradient reduced over the workers with `op`; None stays None, an
    `IndexedSlices` is gathered (or, `sparse_as_dense`, made dense first). In a job of
    one, the gradients as they are (Horovod's `_allreduce_cond`: no compression either).
    The workers agree on the whole list once, as it crosses (`grouped_allreduce`)."""
    op = reduce_op(op=op)
    if basics.group() is None:
        return list(grads)
    wire, contexts = [], []
    for grad in grads:
        if grad is not None and sparse_as_dense:
            grad = tf.convert_to_tensor(grad)
        if grad is None or isinstance(grad, tf.IndexedSlices):
            wire.append(grad)
            contexts.append(None)
            continue
        compressed, ctx = compression.compress(tf.convert_to_tensor(grad))
        wire.append(compressed)
        contexts.append(ctx)
    present = [g for g in wire if g is not None]
    reduced = iter(grouped_allreduce(present, op=op))
    return [None if g is None else compression.decompress(next(reduced), ctx)
            for g, ctx in zip(wire, contexts)]


class DistributedGradientTape:
    """A `tf.GradientTape` whose `gradient` is averaged over the workers, as Horovod's
    (`tape = hvd.DistributedGradientTape(tape)` after the `with` block). Everything else
    is the tape's own."""

    def __init__(self, gradtape, device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False, op="Average",
                 gradient_predivide_factor=1.0, num_groups=0, groups=None, process_set=None,
                 scale_local_gradients=True):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError("DistributedGradientTape wraps a tf.GradientTape. Received: "
                            f"{type(gradtape).__name__}")
        check_options(compression, num_groups, groups, process_set, gradient_predivide_factor)
        self._tape, self._op = gradtape, reduce_op(op=op)
        self._compression, self._sparse_as_dense = compression, sparse_as_dense

    def gradient(self, target, sources, output_gradients=None, **options):
        grads = self._tape.gradient(target, sources, output_gradients, **options)
        flat = reduce_gradients(tf.nest.flatten(grads, expand_composites=False), self._op,
                                self._compression, self._sparse_as_dense)
        return tf.nest.pack_sequence_as(grads, flat)

    def __getattr__(self, name):
        return getattr(self._tape, name)
