"""`horovod.tensorflow.keras`'s API (`tfdist.horovod`): what `horovod.tensorflow` has, so
far the ranks of this process."""

from tfdist.horovod.tensorflow import *  # noqa: F401,F403 (Horovod's names, as Horovod's)
from tfdist.horovod.tensorflow import __all__  # noqa: F401
