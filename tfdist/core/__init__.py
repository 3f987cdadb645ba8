"""The step core every training loop shares (`model.fit`, `tfdist.Trainer`, your own loop):
the hook contract and pipeline, the loop's hook driver, the optimizer seam, the
transactional step, and variable helpers. Nothing here imports from the rest of tfdist.
"""

from tfdist.versions import require_supported

require_supported()  # a TensorFlow or Keras tfdist cannot be right on stops here, in one line

from tfdist.core.driver import HookDriver, StepFunction, before_read, function
from tfdist.core.hooks import GradientPipeline, TrainingHook, all_reduce_sum
from tfdist.core.optimizer import pipeline_of, with_gradient_pipeline, with_hook
from tfdist.core.replica_state import SyncReplicaState, sync_replica_state
from tfdist.core.transaction import Decision, decide

__all__ = ["Decision", "GradientPipeline", "HookDriver", "StepFunction", "SyncReplicaState",
           "TrainingHook", "all_reduce_sum", "before_read", "decide", "function", "pipeline_of",
           "sync_replica_state", "with_gradient_pipeline", "with_hook"]
