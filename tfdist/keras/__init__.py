"""Thin Keras 3 adapters over tfdist's core: the optimizer seam and callbacks."""

from tfdist.keras.optimizer import with_gradient_pipeline

__all__ = ["with_gradient_pipeline"]
