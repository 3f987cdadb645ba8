"""`horovod.tensorflow`'s API (`tfdist.horovod`): the ranks of this process, the tensor
collectives, `DistributedGradientTape` and `DistributedOptimizer`; `hvd.elastic` and
process sets other than `hvd.global_process_set` refuse in one line
(`tfdist.horovod.elastic`, `tfdist.horovod.process_sets`)."""

from tfdist.horovod import elastic  # noqa: F401 (hvd.elastic.run refuses, saying what to use)
from tfdist.horovod.basics import (cross_rank, cross_size, init, is_initialized, local_rank,
                                   local_size, rank, shutdown, size)
from tfdist.horovod.collectives import MismatchError
from tfdist.horovod.gradients import Compression, DistributedGradientTape
from tfdist.horovod.ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce,
                                broadcast, broadcast_variables, grouped_allreduce)
from tfdist.horovod.optimizer import DistributedOptimizer
from tfdist.horovod.process_sets import (ProcessSet, add_process_set, global_process_set,
                                         remove_process_set)

__all__ = ["Adasum", "Average", "Compression", "DistributedGradientTape",
           "DistributedOptimizer", "Max", "MismatchError", "Min", "ProcessSet", "Product",
           "Sum", "add_process_set", "allgather", "allreduce", "broadcast",
           "broadcast_variables", "cross_rank", "cross_size", "elastic", "global_process_set",
           "grouped_allreduce", "init", "is_initialized", "local_rank", "local_size", "rank",
           "remove_process_set", "shutdown", "size"]
