"""`horovod.tensorflow`'s API (`tfdist.horovod`): the ranks of this process and the tensor
collectives so far."""

from tfdist.horovod.basics import (cross_rank, cross_size, init, is_initialized, local_rank,
                                   local_size, rank, shutdown, size)
from tfdist.horovod.ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce,
                                broadcast, broadcast_variables)

__all__ = ["Adasum", "Average", "Max", "Min", "Product", "Sum", "allgather", "allreduce",
           "broadcast", "broadcast_variables", "cross_rank", "cross_size", "init",
           "is_initialized", "local_rank", "local_size", "rank", "shutdown", "size"]
