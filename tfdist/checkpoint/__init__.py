"""Checkpoints a kill cannot lose (`CheckpointStore`): no TensorFlow here; the callbacks
and loops supply what writes and reads the files."""

from tfdist.checkpoint.errors import CheckpointError
from tfdist.checkpoint.store import CheckpointStore

__all__ = ["CheckpointError", "CheckpointStore"]
