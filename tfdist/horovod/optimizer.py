"""Horovod's `DistributedOptimizer` (`horovod.tensorflow.keras`): a Keras optimizer whose
gradients are averaged over the workers before each update.

Built on tfdist's optimizer seam (`tfdist.core.optimizer`): the optimizer becomes a routed
copy whose exchange is `HorovodExchange` — each gradient allreduced over the workers'
group (`tfdist.horovod.gradients`), cast to float16 on the wire with `Compression.fp16` —
and the step stays one transaction: each worker's finiteness flag rides the same
collectives (each process is a replica of its own: `decide` alone would take its own
flag for the verdict), so a NaN gradient on one worker refuses the step on all, and under
mixed_float16 an overflow on one worker skips the step and halves the scale on all.
`backward_passes_per_step=N` is Keras' own gradient accumulation (`gradient_accumulation_
steps`, each micro-step's gradient kept on its worker, one exchange per update).

A saved model keeps the exchange (`HorovodExchange.get_config`, under the name `SAVED`):
`keras.models.load_model` gives it back wherever `tfdist.horovod` or `tfdist.keras` is
imported, and `load_model` (Horovod's `hvd.load_model`) puts any loaded optimizer behind it.
"""

import functools

import keras
import tensorflow as tf

from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.config.yaml_source import Source
from tfdist.core import transaction
from tfdist.core.hooks import GradientPipeline, TrainingHook
from tfdist.core.optimizer import with_gradient_pipeline
from tfdist.errors import UnsupportedError
from tfdist.horovod import basics
from tfdist.horovod.gradients import Compression, check_options, reduce_gradients
from tfdist.horovod.ops import OPS, allreduce, reduce_op
from tfdist.keras import saving  # noqa: F401 (the Loader that gives the exchange back)

__all__ = ["Compression", "DistributedOptimizer", "HorovodExchange"]

SAVED = "horovod"  # the saved exchange's name (`tfdist.keras.saving` rebuilds it)
COMPRESSIONS = {"none": Compression.none, "fp16": Compression.fp16}
#: The saved exchange's options, each checked as a config file's value is on loading.
SAVED_OPTIONS = {"op": functools.partial(checks.string, choices=OPS),
                 "compression": functools.partial(checks.string, choices=tuple(COMPRESSIONS)),
                 "sparse_as_dense": checks.boolean,
                 "scale": functools.partial(checks.number, minimum=0, open_minimum=True)}


class HorovodExchange(TrainingHook):
    """Each gradient reduced over the workers with `op` (Horovod's Average by default),
    compressed on the wire by `compression`, times `scale`; the step's verdict summed
    beside them."""

    replaces_exchange = True

    def __init__(self, op="Average", compression=Compression.none, sparse_as_dense=False,
                 scale=1.0):
        self.op, self.compression = reduce_op(op=op), compression
        self.sparse_as_dense, self.scale = sparse_as_dense, scale

    def build(self, strategy, variables):
        if strategy.num_replicas_in_sync > 1:
            raise UnsupportedError(
                "hvd.DistributedOptimizer averages over Horovod's workers, each process one "
                "replica: build and compile the model outside any strategy scope, as Horovod "
                "scripts do (or, under a strategy, use tfdist.keras.DistributedOptimizer). "
                f"Received: {type(strategy).__name__} of {strategy.num_replicas_in_sync} "
                "replicas")

    def get_config(self):
        """The options saved with a model (`from_config` rebuilds the exchange)."""
        compression = next(k for k, v in COMPRESSIONS.items() if v is self.compression)
        return {"name": SAVED, "op": self.op, "compression": compression,
                "sparse_as_dense": self.sparse_as_dense, "scale": self.scale}

    @classmethod
    def from_config(cls, config):
        """The exchange a saved model's `get_config()` describes; its options are checked
        as a config file's are (a saved file is input too).

        Raises:
            tfdist.ConfigError: an unknown option, or a value out of its range.
        """
        source = Source.of_call("hvd.load_model")
        options = dict(checks.mapping(source, (), config, ("name", *SAVED_OPTIONS)))
        checks.string(source, ("name",), options.pop("name", None), choices=(SAVED,))
        options = check_arguments("hvd.load_model", SAVED_OPTIONS, **options)
        return cls(options.get("op", "Average"), COMPRESSIONS[options.get("compression", "none")],
                   options.get("sparse_as_dense", False), options.get("scale", 1.0))

    def exchange(self, grads, variables, step):
        decision = transaction.current()
        if decision is not None and basics.group() is not None:  # every worker's verdict
            decision.settle_across([allreduce(r, op="Sum") for r in decision.riders()])
        reduced = reduce_gradients(grads, self.op, self.compression, self.sparse_as_dense)
        if self.scale == 1.0:
            return reduced
        return [g * tf.cast(self.scale, g.dtype) if not isinstance(g, tf.IndexedSlices) else
                tf.IndexedSlices(g.values * tf.cast(self.scale, g.values.dtype), g.indices,
                                 g.dense_shape) for g in reduced]


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",  # noqa: N802
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op="Average", gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """`optimizer` with its gradients averaged over the workers before each update, as
    Horovod's (call `hvd.init()` first).

    `backward_passes_per_step=N` updates every N-th batch with the sum of the N batches'
    averaged gradients (their mean with `average_aggregated_gradients=True`), as
    Horovod's; it needs fit's steps driven by tfdist (`hvd.callbacks.
    BroadcastGlobalVariablesCallback` does it, or `tfdist.callbacks.TrainingHooks()`).
    `optimizer.iterations` counts as Keras' own gradient accumulation counts (updates).
    Grouping, process sets and predivision are refused in one line.
    """
    basics.size()  # Horovod's error before init
    check_options(compression, num_groups, groups, process_set, gradient_predivide_factor)
    passes = backward_passes_per_step
    if type(passes) is not int or passes < 1:
        raise ValueError("backward_passes_per_step must be a whole number of batches, 1 or "
                         f"more. Received: backward_passes_per_step={passes!r}")
    optimizer = keras.optimizers.get(optimizer)
    scale = 1.0
    if passes > 1:
        if optimizer.gradient_accumulation_steps:
            raise ValueError("give backward_passes_per_step or the optimizer's "
                             "gradient_accumulation_steps, not both. Received: "
                             f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps}")
        config = {**optimizer.get_config(), "gradient_accumulation_steps": passes}
        optimizer = type(optimizer).from_config(config)  # Keras averages the passes
        scale = 1.0 if average_aggregated_gradients else float(passes)
    exchange = HorovodExchange(op, compression, sparse_as_dense, scale)
    return with_gradient_pipeline(optimizer, GradientPipeline([exchange]))
