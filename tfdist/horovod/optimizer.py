"""Horovod's `DistributedOptimizer` and gradient compression (`horovod.tensorflow.keras`):
a Keras optimizer whose gradients are averaged over the workers before each update.

Built on tfdist's optimizer seam (`tfdist.core.optimizer`): the optimizer becomes a routed
copy whose exchange is `HorovodExchange` — each gradient allreduced over the workers'
group (`tfdist.horovod.collectives`), cast to float16 on the wire with
`Compression.fp16` — and the step stays one transaction: each worker's finiteness flag
rides the same collectives, so a NaN gradient on one worker refuses the step on all.
"""

import tensorflow as tf

from tfdist.core import transaction
from tfdist.core.hooks import GradientPipeline, TrainingHook
from tfdist.core.optimizer import with_gradient_pipeline
from tfdist.horovod import basics
from tfdist.horovod.ops import allreduce, reduce_op


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


class HorovodExchange(TrainingHook):
    """Each gradient reduced over the workers with `op` (Horovod's Average by default),
    compressed on the wire by `compression`; the step's verdict summed beside them."""

    replaces_exchange = True

    def __init__(self, op="Average", compression=Compression.none):
        self.op, self.compression = reduce_op(op=op), compression

    def exchange(self, grads, variables, step):
        decision = transaction.current()
        if decision is not None and not decision.settled:
            riders = decision.riders()
            decision.settle([allreduce(r, op="Sum") for r in riders])
        exchanged = []
        for grad in grads:
            if isinstance(grad, tf.IndexedSlices):
                exchanged.append(allreduce(grad, op=self.op))
                continue
            compressed, ctx = self.compression.compress(tf.convert_to_tensor(grad))
            exchanged.append(self.compression.decompress(allreduce(compressed, op=self.op), ctx))
        return exchanged


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",  # noqa: N802
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op="Average", gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """`optimizer` with its gradients averaged over the workers before each update, as
    Horovod's (call `hvd.init()` first). `sparse_as_dense` turns an embedding's gradient
    into a dense one first; gradient accumulation (`backward_passes_per_step` > 1),
    grouping and process sets are not there yet and are refused in one line."""
    basics.size()  # Horovod's error before init
    if backward_passes_per_step != 1 or num_groups or groups is not None \
            or process_set is not None or gradient_predivide_factor != 1.0:
        raise ValueError(
            "tfdist.horovod.DistributedOptimizer does not yet take backward_passes_per_step "
            "other than 1, num_groups, groups, process_set or gradient_predivide_factor; "
            "Keras' own gradient_accumulation_steps accumulates. Received: "
            f"backward_passes_per_step={backward_passes_per_step!r}")
    exchange = HorovodExchange(op, compression)
    if sparse_as_dense:
        exchange = _SparseAsDense(op, compression)
    return with_gradient_pipeline(optimizer, GradientPipeline([exchange]))


class _SparseAsDense(HorovodExchange):
    def exchange(self, grads, variables, step):
        return super().exchange([tf.convert_to_tensor(g) for g in grads], variables, step)
