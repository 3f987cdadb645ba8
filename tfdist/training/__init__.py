"""Custom training loops: `Trainer`, its hooks, and per-strategy data feeding."""

from tfdist.training.hooks import GradientPipeline, TrainingHook
from tfdist.training.trainer import Trainer

__all__ = ["GradientPipeline", "Trainer", "TrainingHook"]
