"""`horovod.tensorflow.keras`'s API (`tfdist.horovod`): `horovod.tensorflow`'s names and
the Keras callbacks (`hvd.callbacks.…`, and by their own names)."""

from tfdist.horovod import callbacks  # noqa: F401 (hvd.callbacks.BroadcastGlobalVariablesCallback)
from tfdist.horovod.callbacks import (BroadcastGlobalVariablesCallback,
                                      LearningRateScheduleCallback, LearningRateWarmupCallback,
                                      MetricAverageCallback)
from tfdist.horovod.saving import load_model
from tfdist.horovod.tensorflow import *  # noqa: F401,F403 (Horovod's names, as Horovod's)
from tfdist.horovod.tensorflow import __all__ as _tensorflow_names

__all__ = [*_tensorflow_names, "BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback", "MetricAverageCallback", "callbacks", "load_model"]
