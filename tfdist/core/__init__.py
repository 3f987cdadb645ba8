"""The names tfdist documented under `tfdist.core` before the step core was split into
`tfdist.step` (one step), `tfdist.seam` (Keras' optimizer internals) and `tfdist.loop`
(between steps): a face that re-exports them, so code written against it keeps working.
"""

from tfdist.loop.driver import HookDriver, before_read
from tfdist.loop.function import StepFunction, function
from tfdist.seam.optimizer import pipeline_of, with_gradient_pipeline, with_hook
from tfdist.seam.replica_state import SyncReplicaState, sync_replica_state
from tfdist.step.hooks import GradientPipeline, TrainingHook, all_reduce_sum
from tfdist.step.transaction import Decision, decide

__all__ = ["Decision", "GradientPipeline", "HookDriver", "StepFunction", "SyncReplicaState",
           "TrainingHook", "all_reduce_sum", "before_read", "decide", "function", "pipeline_of",
           "sync_replica_state", "with_gradient_pipeline", "with_hook"]
