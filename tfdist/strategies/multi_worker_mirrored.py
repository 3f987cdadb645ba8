"""MultiWorkerMirroredStrategy on which Keras 3 `fit`, `evaluate` and `predict` work."""

import tensorflow as tf
from tensorflow.python.eager import context  # the coordination-service barrier

from tfdist.strategies.collective_keys import next_key_base
from tfdist.strategies.initial_values import skip_broadcast_of_identical
from tfdist.strategies.batch_rows import WeighsTrainSteps
from tfdist.strategies.input_order import AgreedInputOrder
from tfdist.strategies.input_pipelines import StallFreeInput
from tfdist.strategies.keras_step_options import SupportedStepOptions
from tfdist.strategies.keras_build_batch import LocalBuildBatch
from tfdist.strategies.raw_errors import RawErrors

BARRIER_SECONDS = 3600


class NestedAndScalarReduce:
    """Strategy mixin: `reduce` maps over nested structures leaf by leaf, and treats
    ``axis=0`` on scalars as a reduction over replicas only (``axis=None``), the only
    meaning it can have. Every other call is the strategy's own."""

    def reduce(self, reduce_op, value, axis=None):
        if tf.nest.is_nested(value):
            self.keras_fixes["nested"] += 1
            return tf.nest.map_structure(lambda v: self.reduce(reduce_op, v, axis), value)
        if axis == 0 and _rank(self, value) == 0:
            self.keras_fixes["scalar_axis"] += 1
            axis = None
        return super().reduce(reduce_op, value, axis)


class MultiWorkerMirroredStrategy(RawErrors, SupportedStepOptions, WeighsTrainSteps,
                                  LocalBuildBatch, NestedAndScalarReduce,
                                  AgreedInputOrder, StallFreeInput,
                                  tf.distribute.MultiWorkerMirroredStrategy):
    """`tf.distribute.MultiWorkerMirroredStrategy` on which Keras 3 trains.

    Keras 3 (keras #20585, tensorflow #72388) fails before the first step with two or
    more workers, through two calls to `Strategy.reduce`:

    - `TensorFlowTrainer._maybe_symbolic_build` reduces a *nested* batch
      (``reduce("MEAN", (x, y), axis=None)``), which TF's `reduce` does not accept, and
      which fails again where the global batch does not split evenly: `LocalBuildBatch`
      answers it from this worker's batch, without a collective;
    - `reduce_per_replica` reduces scalar metrics with ``axis=0``, a dimension a scalar
      does not have: `NestedAndScalarReduce`.

    `keras_fixes` counts each fix applied, so a test notices if Keras stops making these
    calls.

    A new strategy per run in one process works too (TF's class fails, measured):

    - Each instance takes a fresh collective key range, like tfdist's
      `MirroredStrategy`. TF's instances all start from the same keys, so on one
      machine with several devices the second one's first all-reduce of another shape
      fails ("Shape mismatch in the collective instance 100"). Across workers the keys
      must agree. They do: each worker counts its own strategies, and every worker
      creates its MultiWorkerMirroredStrategy instances in the same order (it runs the
      same script).
    - With several workers, each new strategy re-enables the process's collective ops,
      which resets them. A worker that reached its first collective while a peer was
      still resetting failed ("Shape mismatch", 5 of 8 two-worker jobs, TF's keys) or
      hung (8 of 18, fresh keys). So the workers meet at a barrier of TF's coordination
      service once each has built the strategy (then 26 of 26 jobs passed, 10 of them
      with TF's keys: the barrier alone fixes this case).

    Its datasets are read in one order by every worker, so the workers' shares partition
    each epoch (`AgreedInputOrder`: fit's NumPy arrays and PyDataset; one line where an
    order cannot be agreed). Their iterators end without a pause (`StallFreeInput`), and
    variables created in `identical_initial_values()` (optimizer slots, tfdist's state)
    are not broadcast.
    """

    def __init__(self, *args, **kwargs):
        self._collective_key_base = next_key_base("multi_worker_mirrored")
        super().__init__(*args, **kwargs)
        skip_broadcast_of_identical(self.extended)
        _wait_for_peers(self)


def _wait_for_peers(strategy):
    """Blocks until every chief and worker task has built its `strategy` (same keys).

    A no-op outside a cluster and for tasks TF's coordination service does not
    coordinate (the evaluator).
    """
    task_type = strategy.cluster_resolver.task_type
    if task_type not in ("chief", "worker") or context.context().coordination_service is None:
        return
    barrier_id = f"tfdist/multi_worker_mirrored/{strategy._collective_key_base}"
    context.context().wait_at_barrier(barrier_id, BARRIER_SECONDS * 1000)


def _rank(strategy, value):
    """The rank of one replica's component of `value`, or None if unknown."""
    local = strategy.experimental_local_results(value)
    shape = getattr(local[0], "shape", None) if local else None
    return shape.rank if shape is not None else None
