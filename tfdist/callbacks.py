"""`tfdist.callbacks`: the Keras callbacks of tfdist, for `model.fit` and `tfdist.Trainer`."""

from tfdist.keras.callbacks import BackupAndRestore, ModelCheckpoint, SyncReplicaState

__all__ = ["BackupAndRestore", "ModelCheckpoint", "SyncReplicaState"]
