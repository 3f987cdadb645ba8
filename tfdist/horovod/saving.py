"""Horovod's `load_model` (`horovod.tensorflow.keras.load_model`): a saved Keras model
whose optimizer, whatever it was saved with, averages its gradients over the workers.

A model saved with `hvd.DistributedOptimizer` keeps its exchange without it
(`HorovodExchange.get_config`): `keras.models.load_model` gives it back. `load_model` also
puts a plain optimizer (a model saved without Horovod) behind the exchange, as Horovod's
does, with the `compression` given.
"""

import keras
import tensorflow as tf

from tfdist.horovod.averaging import WorkersAverager
from tfdist.horovod.gradients import Compression, check_options
from tfdist.horovod.optimizer import HorovodExchange
from tfdist.keras.saving import checked_filepath
from tfdist.seam.optimizer import pipeline_of, with_hook

__all__ = ["load_model"]


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None):
    """The Keras model saved at `filepath`, its optimizer averaging gradients over the
    workers with `compression` (call `hvd.init()` before training it).

    Args:
        filepath: a `.keras` or `.h5` file, as `keras.models.load_model` takes.
        custom_optimizers: optimizer classes of your own that the file names.
        custom_objects: as `keras.models.load_model`'s.
        compression: `hvd.Compression.none` or `hvd.Compression.fp16`; None: as saved
            (none for a model saved without `hvd.DistributedOptimizer`). A model saved with
            it keeps its other options (op, `backward_passes_per_step`, a tfdist
            compressor, which a Horovod compression given is refused beside).

    A model saved with tfdist's own compression loads outside its strategy's scope as
    its plain optimizer (`tfdist.keras.saving` warns), which then goes behind the exchange.

    Raises:
        ValueError: `filepath` is not a path or holds a NUL (one line); a compression
            Horovod does not have; Keras' errors for a file it cannot load.
    """
    check_options(compression)
    checked_filepath(filepath)
    objects = {**{cls.__name__: cls for cls in custom_optimizers or ()}, **(custom_objects or {})}
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        routed = _behind_exchange(optimizer, compression)
        if routed is not optimizer:  # compiled again: a model saves its compile arguments
            config = keras.saving.deserialize_keras_object(model.get_compile_config(),
                                                           custom_objects=objects)
            model.compile(**{**config, "optimizer": routed})
    return model


def _behind_exchange(optimizer, compression):
    """`optimizer` (built or not) exchanging through a `HorovodExchange` with
    `compression`: its own, if it has one, else a new one (`with_hook`)."""
    pipeline = pipeline_of(optimizer)
    owner = pipeline.exchange_owner if pipeline is not None else None
    if isinstance(owner, WorkersAverager):
        if compression is not None:
            raise ValueError(
                "this model was saved with local SGD through hvd.DistributedOptimizer; "
                "load it with compression=None to keep it. Received: "
                f"compression={compression!r:.80}")
        return optimizer
    if not isinstance(owner, HorovodExchange):
        return with_hook(optimizer, HorovodExchange(compression=compression or Compression.none),
                         tf.distribute.get_strategy())
    if compression is not None and owner.compressor is not None:
        raise ValueError(
            f"this model was saved with tfdist's {owner.compressor.compressor.name!r} "
            "compression through hvd.DistributedOptimizer; load it with compression=None "
            f"to keep it. Received: compression={compression!r:.80}")
    owner.compression = compression or owner.compression
    return optimizer
