"""Thin Keras 3 adapters over tfdist's core: the optimizer wrapper, saving, callbacks,
per-replica random draws."""

from tfdist.keras import saving  # noqa: F401  (registers the loader of saved routed optimizers)
from tfdist.keras.backup import ModelBackup
from tfdist.keras.distributed_optimizer import DistributedOptimizer, optimizer_from_config
from tfdist.keras.replica_seeds import per_replica_seeds
from tfdist.keras.saving import load_model
from tfdist.seam.optimizer import with_gradient_pipeline

__all__ = ["DistributedOptimizer", "ModelBackup", "load_model", "optimizer_from_config",
           "per_replica_seeds", "with_gradient_pipeline"]
