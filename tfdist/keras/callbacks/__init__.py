"""Keras callbacks that are safe under multi-worker strategies."""

from tfdist.keras.callbacks.backup_and_restore import BackupAndRestore
from tfdist.keras.callbacks.comm_stats import CommStats
from tfdist.keras.callbacks.training_hooks import HookPhases, TrainingHooks
from tfdist.keras.callbacks.learning_rate_warmup import LearningRateWarmup
from tfdist.keras.callbacks.local_sgd import LocalSGD
from tfdist.keras.callbacks.logs import CSVLogger, TensorBoard
from tfdist.keras.callbacks.model_checkpoint import ModelCheckpoint
from tfdist.keras.callbacks.step_times import StepTimes
from tfdist.keras.callbacks.sync_replica_state import SyncReplicaState

__all__ = ["BackupAndRestore", "CSVLogger", "CommStats", "HookPhases", "LearningRateWarmup",
           "LocalSGD", "ModelCheckpoint", "StepTimes", "SyncReplicaState", "TensorBoard", "TrainingHooks"]
