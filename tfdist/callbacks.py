"""`tfdist.callbacks`: the Keras callbacks of tfdist, for `model.fit` and `tfdist.Trainer`."""

from tfdist.keras.callbacks import (BackupAndRestore, CommStats, HookPhases,
                                    LearningRateWarmup, LocalSGD, ModelCheckpoint,
                                    SyncReplicaState, TrainingHooks)

__all__ = ["BackupAndRestore", "CommStats", "HookPhases", "LearningRateWarmup", "LocalSGD",
           "ModelCheckpoint", "SyncReplicaState", "TrainingHooks"]
