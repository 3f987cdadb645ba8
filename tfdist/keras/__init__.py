"""Thin Keras 3 adapters over tfdist's core: the optimizer seam and callbacks."""

from tfdist.keras.optimizer import phased_step, with_gradient_pipeline

__all__ = ["DistributedOptimizer", "phased_step", "with_gradient_pipeline"]


def __getattr__(name):
    # Imported on first use: the compression core itself builds on this package's seam.
    if name == "DistributedOptimizer":
        from tfdist.keras.distributed_optimizer import DistributedOptimizer

        return DistributedOptimizer
    raise AttributeError(f"module 'tfdist.keras' has no attribute {name!r}")
