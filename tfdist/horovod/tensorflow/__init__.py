"""`horovod.tensorflow`'s API (`tfdist.horovod`): the ranks of this process, the tensor
collectives, `DistributedGradientTape` and `DistributedOptimizer`; `hvd.elastic` refuses
in one line (`tfdist.horovod.elastic`)."""

from tfdist.horovod import elastic  # noqa: F401 (hvd.elastic.run refuses, saying what to use)
from tfdist.horovod.basics import (cross_rank, cross_size, init, is_initialized, local_rank,
                                   local_size, rank, shutdown, size)
from tfdist.horovod.gradients import Compression, DistributedGradientTape
from tfdist.horovod.ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce,
                                broadcast, broadcast_variables)
from tfdist.horovod.optimizer import DistributedOptimizer

__all__ = ["Adasum", "Average", "Compression", "DistributedGradientTape",
           "DistributedOptimizer", "Max", "Min", "Product", "Sum", "allgather", "allreduce",
           "broadcast", "broadcast_variables", "cross_rank", "cross_size", "elastic", "init",
           "is_initialized", "local_rank", "local_size", "rank", "shutdown", "size"]
