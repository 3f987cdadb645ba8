"""Local SGD: periodic model averaging with a synchronous warm-up (`ModelAverager`)."""

from tfdist.local_sgd.averager import ModelAverager

__all__ = ["ModelAverager"]
