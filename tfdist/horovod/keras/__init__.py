"""`horovod.keras` (Horovod's API for standalone Keras): on Keras 3 the same as
`horovod.tensorflow.keras` (`tfdist.horovod.tensorflow.keras`)."""

from tfdist.horovod.tensorflow.keras import *  # noqa: F401,F403
from tfdist.horovod.tensorflow.keras import __all__  # noqa: F401
