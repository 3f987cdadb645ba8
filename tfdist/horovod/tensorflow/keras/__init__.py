"""`horovod.tensorflow.keras`'s API (`tfdist.horovod`): `horovod.tensorflow`'s names, the
`DistributedOptimizer` and the callbacks built so far."""

from tfdist.horovod import callbacks  # noqa: F401 (hvd.callbacks.BroadcastGlobalVariablesCallback)
from tfdist.horovod.callbacks import BroadcastGlobalVariablesCallback, MetricAverageCallback
from tfdist.horovod.optimizer import Compression, DistributedOptimizer
from tfdist.horovod.tensorflow import *  # noqa: F401,F403 (Horovod's names, as Horovod's)
from tfdist.horovod.tensorflow import __all__ as _tensorflow_names

__all__ = [*_tensorflow_names, "BroadcastGlobalVariablesCallback", "Compression",
           "DistributedOptimizer", "MetricAverageCallback", "callbacks"]
