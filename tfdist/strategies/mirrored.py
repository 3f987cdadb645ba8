"""MirroredStrategy that can be created again in the same process."""

import tensorflow as tf

from tfdist.strategies.collective_keys import next_key_base
from tfdist.strategies.batch_rows import WeighsTrainSteps
from tfdist.strategies.input_pipelines import StallFreeInput
from tfdist.strategies.keras_step_options import SupportedStepOptions
from tfdist.strategies.keras_build_batch import LocalBuildBatch
from tfdist.strategies.raw_errors import RawErrors


class MirroredStrategy(RawErrors, SupportedStepOptions, WeighsTrainSteps, LocalBuildBatch,
                       StallFreeInput, tf.distribute.MirroredStrategy):
    """`tf.distribute.MirroredStrategy` whose collectives never reuse an earlier one's keys.

    Every TF `MirroredStrategy` numbers its collectives from the same start (group key
    ``1 + _collective_key_base``, a class attribute that is 0; instance keys from 100).
    A second strategy on the same devices — the Keras guide builds one per run — reuses
    the first one's collective instances, which the runtime has bound to the first
    model's shapes: its first all-reduce fails with "Shape mismatch in the collective
    instance 100" and aborts the process's collectives. Here each instance takes a
    fresh key range before TF reads it (an instance attribute; TF's class attribute is
    untouched). Its datasets' iterators end without a pause (`StallFreeInput`), and Keras'
    look at the first batch is answered without a collective, whatever the split
    (`LocalBuildBatch`).
    """

    def __init__(self, devices=None, cross_device_ops=None):
        self._collective_key_base = next_key_base("mirrored")
        super().__init__(devices=devices, cross_device_ops=cross_device_ops)


class OneDeviceStrategy(RawErrors, StallFreeInput, tf.distribute.OneDeviceStrategy):
    """`tf.distribute.OneDeviceStrategy` whose datasets' iterators end without a pause
    (`StallFreeInput`)."""
