"""Custom training loops: `Trainer`, its hooks, and per-strategy data feeding."""

from tfdist.training.hooks import GradientPipeline, TrainingHook

__all__ = ["GradientPipeline", "Trainer", "TrainingHook", "update_metric"]


def __getattr__(name):
    # Loaded on first use: the Trainer builds on tfdist.keras, which builds on the hooks.
    if name == "Trainer":
        from tfdist.training.trainer import Trainer

        return Trainer
    if name == "update_metric":
        from tfdist.training.metrics import update_metric

        return update_metric
    raise AttributeError(f"module 'tfdist.training' has no attribute {name!r}")
