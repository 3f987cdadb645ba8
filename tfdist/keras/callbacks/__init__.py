"""Keras callbacks that are safe under multi-worker strategies."""

from tfdist.keras.callbacks.backup_and_restore import BackupAndRestore
from tfdist.keras.callbacks.model_checkpoint import ModelCheckpoint

__all__ = ["BackupAndRestore", "ModelCheckpoint"]
