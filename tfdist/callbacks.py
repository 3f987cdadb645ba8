"""`tfdist.callbacks`: the Keras callbacks of tfdist, for `model.fit` and `tfdist.Trainer`."""

from tfdist.keras.callbacks import (BackupAndRestore, CommStats, CSVLogger, HookPhases,
                                    LearningRateWarmup, LocalSGD, ModelCheckpoint, StepTimes,
                                    SyncReplicaState, TensorBoard, TrainingHooks)

__all__ = ["BackupAndRestore", "CSVLogger", "CommStats", "HookPhases", "LearningRateWarmup",
           "LocalSGD", "ModelCheckpoint", "StepTimes", "SyncReplicaState", "TensorBoard", "TrainingHooks"]
