"""Custom training loops: `Trainer`, per-strategy data feeding, and coordinator metrics."""

from tfdist.step.hooks import GradientPipeline, TrainingHook
from tfdist.training.metrics import update_metric
from tfdist.training.trainer import Trainer

__all__ = ["GradientPipeline", "Trainer", "TrainingHook", "update_metric"]
