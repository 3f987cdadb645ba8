"""Checkpoints a kill cannot lose (`CheckpointStore`): no TensorFlow here; the callbacks
and loops supply what writes and reads the files."""

from tfdist.checkpoint.store import CheckpointError, CheckpointStore

__all__ = ["CheckpointError", "CheckpointStore"]
