"""Horovod's `DistributedOptimizer` (`horovod.tensorflow.keras`): a Keras optimizer whose
gradients are averaged over the workers before each update.

Built on tfdist's optimizer seam (`tfdist.core.optimizer`): the optimizer becomes a routed
copy whose exchange is `HorovodExchange` — each gradient allreduced over the workers'
group (`tfdist.horovod.gradients`), cast to float16 on the wire with `Compression.fp16` —
and the step stays one transaction: each worker's finiteness flag rides the same
collectives (each process is a replica of its own: `decide` alone would take its own
flag for the verdict), so a NaN gradient on one worker refuses the step on all, and under
mixed_float16 an overflow on one worker skips the step and halves the scale on all.
`backward_passes_per_step=N` is Keras' own gradient accumulation (`gradient_accumulation_
steps`, each micro-step's gradient kept on its worker, one exchange per update).
"""

import keras
import tensorflow as tf

from tfdist.core import transaction
from tfdist.core.hooks import GradientPipeline, TrainingHook
from tfdist.core.optimizer import with_gradient_pipeline
from tfdist.horovod import basics
from tfdist.horovod.gradients import Compression, check_options, reduce_gradients
from tfdist.horovod.ops import allreduce, reduce_op

__all__ = ["Compression", "DistributedOptimizer", "HorovodExchange"]


class HorovodExchange(TrainingHook):
    """Each gradient reduced over the workers with `op` (Horovod's Average by default),
    compressed on the wire by `compression`, times `scale`; the step's verdict summed
    beside them."""

    replaces_exchange = True

    def __init__(self, op="Average", compression=Compression.none, sparse_as_dense=False,
                 scale=1.0):
        self.op, self.compression = reduce_op(op=op), compression
        self.sparse_as_dense, self.scale = sparse_as_dense, scale

    def exchange(self, grads, variables, step):
        decision = transaction.current()
        if decision is not None and basics.group() is not None:  # every worker's verdict
            decision.settle_across([allreduce(r, op="Sum") for r in decision.riders()])
        reduced = reduce_gradients(grads, self.op, self.compression, self.sparse_as_dense)
        if self.scale == 1.0:
            return reduced
        return [g * tf.cast(self.scale, g.dtype) if not isinstance(g, tf.IndexedSlices) else
                tf.IndexedSlices(g.values * tf.cast(self.scale, g.values.dtype), g.indices,
                                 g.dense_shape) for g in reduced]


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",  # noqa: N802
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op="Average", gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """`optimizer` with its gradients averaged over the workers before each update, as
    Horovod's (call `hvd.init()` first).

    `backward_passes_per_step=N` updates every N-th batch with the sum of the N batches'
    averaged gradients (their mean with `average_aggregated_gradients=True`), as
    Horovod's; it needs fit's steps driven by tfdist (`hvd.callbacks.
    BroadcastGlobalVariablesCallback` does it, or `tfdist.callbacks.TrainingHooks()`).
    Unlike Horovod's, `optimizer.iterations` then counts batches, not updates (Keras').
    Grouping, process sets and predivision are refused in one line.
    """
    basics.size()  # Horovod's error before init
    check_options(compression, num_groups, groups, process_set, gradient_predivide_factor)
    passes = backward_passes_per_step
    if type(passes) is not int or passes < 1:
        raise ValueError("backward_passes_per_step must be a whole number of batches, 1 or "
                         f"more. Received: backward_passes_per_step={passes!r}")
    optimizer = keras.optimizers.get(optimizer)
    scale = 1.0
    if passes > 1:
        if optimizer.gradient_accumulation_steps:
            raise ValueError("give backward_passes_per_step or the optimizer's "
                             "gradient_accumulation_steps, not both. Received: "
                             f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps}")
        config = {**optimizer.get_config(), "gradient_accumulation_steps": passes}
        optimizer = type(optimizer).from_config(config)  # Keras averages the passes
        scale = 1.0 if average_aggregated_gradients else float(passes)
    exchange = HorovodExchange(op, compression, sparse_as_dense, scale)
    return with_gradient_pipeline(optimizer, GradientPipeline([exchange]))
