"""Gradient compression: compressors (pure), error feedback, delayed start, the exchange.

    hook = tfdist.compression.build("topk", ratio=0.01, error_feedback=True)
    tfdist.Trainer(model, optimizer, loss, hooks=[hook])
    model.compile(tfdist.keras.DistributedOptimizer(optimizer, compression="fp16"), ...)
"""

from tfdist.compression.compressors import (QSGD, Cast, Compressor, Int4, Int8, PowerSGD,
                                            RandomK, Sign, TopK)
from tfdist.compression.auto import AutoCompression
from tfdist.compression.communicator import Communicator
from tfdist.compression.exchange import GradientCompression
from tfdist.compression.factory import build, compressor_by_name
from tfdist.compression.wrappers import DelayedStart, ErrorFeedback, MinSize

__all__ = ["AutoCompression", "Cast", "Communicator", "Compressor", "DelayedStart", "ErrorFeedback",
           "GradientCompression", "Int4", "Int8", "MinSize", "PowerSGD", "QSGD", "RandomK", "Sign",
           "TopK", "build", "compressor_by_name"]
