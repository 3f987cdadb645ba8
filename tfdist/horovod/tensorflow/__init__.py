"""`horovod.tensorflow`'s API (`tfdist.horovod`): the ranks of this process so far."""

from tfdist.horovod.basics import (cross_rank, cross_size, init, is_initialized, local_rank,
                                   local_size, rank, shutdown, size)

__all__ = ["cross_rank", "cross_size", "init", "is_initialized", "local_rank", "local_size",
           "rank", "shutdown", "size"]
