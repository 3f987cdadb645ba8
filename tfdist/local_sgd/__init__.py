"""Local SGD and DiLoCo: periodic model synchronisation with a synchronous warm-up
(`ModelAverager`; `DiLoCo` with an outer optimizer, fragments and overlap)."""

from tfdist.local_sgd.averager import DiLoCo, ModelAverager

__all__ = ["DiLoCo", "ModelAverager"]
