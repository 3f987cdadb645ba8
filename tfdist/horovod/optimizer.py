"""Horovod's `DistributedOptimizer` (`horovod.tensorflow.keras`): a Keras optimizer whose
gradients are averaged over the workers before each update.

Built on tfdist's optimizer seam (`tfdist.seam.optimizer`): the optimizer becomes a routed
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
import numbers

import keras
import tensorflow as tf

from tfdist.compression.exchange import GradientCompression
from tfdist.compression.factory import build
from tfdist.config import ConfigError, checks
from tfdist.config.checks import check_arguments
from tfdist.config.yaml_source import Source
from tfdist.errors import shown
from tfdist.horovod import averaging, basics
from tfdist.horovod.averaging import is_model_averaging
from tfdist.horovod.gradients import Compression, check_options, reduce_gradients
from tfdist.horovod.ops import (OPS, WorkersContext, check_one_replica, reduce_op,
                                settle_over_workers)
from tfdist.keras import saving
from tfdist.seam.optimizer import with_gradient_pipeline
from tfdist.step.hooks import GradientPipeline, TrainingHook

__all__ = ["Compression", "DistributedOptimizer", "HorovodExchange"]

#: The most batches one update accumulates: far beyond use, within a 32-bit count.
MAX_PASSES = 2**31 - 1
SAVED = "horovod"  # the saved exchange's name (`tfdist.keras.saving` rebuilds it)
COMPRESSIONS = {"none": Compression.none, "fp16": Compression.fp16}


def _saved_compression(source, path, value):
    """Horovod's compression by name, or a tfdist compressor's options (`build` checks)."""
    if isinstance(value, dict):
        return value
    return checks.string(source, path, value, choices=tuple(COMPRESSIONS))


#: The saved exchange's options, each checked as a config file's value is on loading.
SAVED_OPTIONS = {"op": functools.partial(checks.string, choices=OPS),
                 "compression": _saved_compression, "sparse_as_dense": checks.boolean,
                 "scale": functools.partial(checks.number, minimum=0, open_minimum=True)}


class HorovodExchange(TrainingHook):
    """Each gradient reduced over the workers with `op` (Horovod's Average by default),
    compressed on the wire by `compression`, times `scale`; the step's verdict summed
    beside them.

    `compression` is Horovod's (`Compression.none`, `Compression.fp16`) or any of tfdist's
    (a name, a `compression:` section, a `GradientCompression`: top-k with error feedback,
    PowerSGD, int8, ...), which then exchanges over the workers (`WorkersContext`); its
    hook runs in the pipeline beside this one (`hooks`) for the rest of its contract (its
    state, phases and checkpointed residuals).
    """

    replaces_exchange = True

    def __init__(self, op="Average", compression=Compression.none, sparse_as_dense=False,
                 scale=1.0):
        self.op, self.sparse_as_dense, self.scale = reduce_op(op=op), sparse_as_dense, scale
        self.compression, self.compressor = compression, None
        if compression not in COMPRESSIONS.values():
            self.compression, self.compressor = Compression.none, _compressor(compression)
            if self.op not in ("Average", "Sum"):
                raise ValueError("tfdist's compressors sum or average the gradients. "
                                 f"Received: op={self.op!r}, compression="
                                 f"{self.compressor.compressor.name!r}")
            self.compressor.replaces_exchange = False  # its exchange is called from here

    def hooks(self):
        """The pipeline's hooks: this exchange, and the tfdist compressor it calls."""
        return [self] + ([self.compressor] if self.compressor is not None else [])

    def build(self, strategy, variables):
        group = basics.group()
        self.replica_group = WorkersContext(group) if group is not None else None
        check_one_replica(strategy)

    def get_config(self):
        """The options saved with a model (`from_config` rebuilds the exchange)."""
        compression = (self.compressor.get_config() if self.compressor is not None else
                       next(k for k, v in COMPRESSIONS.items() if v is self.compression))
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
        compression = options.get("compression", "none")
        return cls(options.get("op", "Average"), COMPRESSIONS.get(compression, compression)
                   if isinstance(compression, str) else compression,
                   options.get("sparse_as_dense", False), options.get("scale", 1.0))

    def exchange(self, grads, variables, step):
        group = basics.group()
        settle_over_workers()
        if self.compressor is None:
            reduced = reduce_gradients(grads, self.op, self.compression, self.sparse_as_dense)
        else:
            reduced = self._compressed(grads, variables, step, group)
        if self.scale == 1.0:
            return reduced
        return [g * tf.cast(self.scale, g.dtype) if not isinstance(g, tf.IndexedSlices) else
                tf.IndexedSlices(g.values * tf.cast(self.scale, g.values.dtype), g.indices,
                                 g.dense_shape) for g in reduced]

    def _compressed(self, grads, variables, step, group):
        """The tfdist compressor's sum over the workers (their mean for Average); in a job
        of one, the gradients as they are (as Horovod's)."""
        if group is None:
            return list(grads)
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) for g in grads]
        self.compressor.context = WorkersContext(group)
        summed = self.compressor.exchange(grads, variables, step)
        if self.op == "Sum":
            return summed
        share = 1.0 / group.size
        return [tf.IndexedSlices(g.values * tf.cast(share, g.values.dtype), g.indices,
                                 g.dense_shape) if isinstance(g, tf.IndexedSlices) else
                g * tf.cast(share, g.dtype) for g in summed]


def _compressor(compression):
    """A tfdist `GradientCompression` from what `compression=` was given."""
    if is_model_averaging(compression):
        raise ValueError("local SGD and DiLoCo replace the gradient exchange: give them to "
                         "hvd.DistributedOptimizer(compression=...) alone. Received: "
                         f"compression={compression!r:.80}")
    try:
        hook = build(compression)
    except (ConfigError, TypeError) as error:
        raise ValueError("compression must be hvd.Compression.none, hvd.Compression.fp16 or "
                         f"one of tfdist's compressions ({error})") from None
    if not isinstance(hook, GradientCompression):  # compression: auto
        raise ValueError("compression='auto' measures the replicas of a tfdist strategy; "
                         "under hvd.DistributedOptimizer name a compressor. Received: "
                         f"compression={compression!r:.80}")
    return hook


def exchange_hooks(op="Average", compression=Compression.none, sparse_as_dense=False,
                   scale=1.0, passes=1):
    """The pipeline's hooks for `hvd.DistributedOptimizer`'s options: a `HorovodExchange`
    (and the tfdist compressor it calls), or local SGD / DiLoCo over the workers
    (`tfdist.horovod.averaging`), whose warm-up averages gradients through one."""
    if not is_model_averaging(compression):
        return HorovodExchange(op, compression, sparse_as_dense, scale).hooks()
    if op != "Average" or passes != 1:
        raise ValueError("local SGD and DiLoCo average the workers' models: they take op="
                         "hvd.Average and no backward_passes_per_step (a longer period "
                         f"sends as seldom). Received: op={op!r}, backward_passes_per_step="
                         f"{passes}")
    averager = averaging.model_averager(compression)
    averager.synchronous_exchange = HorovodExchange(
        op, averager.warmup.exchange or Compression.none, sparse_as_dense)
    return [averager]


saving.SAVED_EXCHANGES[SAVED] = lambda config: HorovodExchange.from_config(config).hooks()
saving.SAVED_EXCHANGES[averaging.SAVED] = lambda config: exchange_hooks(
    compression=averaging.from_saved(config))


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
    `compression` is Horovod's (`Compression.none`, `Compression.fp16`) or, beyond
    Horovod, any of tfdist's, as `tfdist.keras.DistributedOptimizer` takes it: a name
    ("topk"), a `compression:` section ({"name": "powersgd", "rank": 2}) or a hook from
    `tfdist.compression.build`; or local SGD and DiLoCo over the workers
    (`tfdist.horovod.averaging`): a `tfdist.local_sgd.ModelAverager` / `DiLoCo`, or a
    `local_sgd:` section named "local_sgd" or "diloco" ({"name": "diloco", "period": 8}).
    Grouping, process sets and predivision are refused in one line.
    """
    basics.size()  # Horovod's error before init
    check_options(None, num_groups, groups, process_set, gradient_predivide_factor)
    passes = _checked_passes(backward_passes_per_step)
    optimizer, scale = _accumulating(keras.optimizers.get(optimizer), passes,
                                     average_aggregated_gradients)
    return with_gradient_pipeline(optimizer, GradientPipeline(
        exchange_hooks(op, compression, sparse_as_dense, scale, passes)))


def _checked_passes(passes):
    """`backward_passes_per_step` as an int (ValueError: not 1 to `MAX_PASSES` batches)."""
    if isinstance(passes, bool) or not isinstance(passes, numbers.Integral) \
            or not 1 <= passes <= MAX_PASSES:
        raise ValueError("backward_passes_per_step must be a whole number of batches, 1 to "
                         f"{MAX_PASSES:,}. Received: backward_passes_per_step={shown(passes)}")
    return int(passes)


def _accumulating(optimizer, passes, average_aggregated_gradients):
    """`optimizer` updating every `passes` batches (Keras' own accumulation), and the
    scale of the exchanged gradients (their sum unless `average_aggregated_gradients`)."""
    if passes == 1:
        return optimizer, 1.0
    if optimizer.gradient_accumulation_steps:
        raise ValueError("give backward_passes_per_step or the optimizer's "
                         "gradient_accumulation_steps, not both. Received: "
                         f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps}")
    config = {**optimizer.get_config(), "gradient_accumulation_steps": passes}
    optimizer = type(optimizer).from_config(config)  # Keras averages the passes
    return optimizer, 1.0 if average_aggregated_gradients else float(passes)
