"""The compressed gradient exchange, as a `TrainingHook` that replaces the all-reduce.

The hook is a thin adapter: it builds the transformation
`MinSize(DelayedStart(ErrorFeedback(compressor)))` (`wrappers.py`; each part only if
asked), keeps the transformation's state (error-feedback residual, PowerSGD's Qs) in
variables, and runs it on each replica through a `Communicator`: small tensors fused
into one uncompressed all-reduce, the others fused into one buffer that the compressor
encodes, exchanges (all-reduce, all-gather, or PowerSGD's two all-reduces) and decodes.
Before `start_step` everything goes uncompressed; the switch is a phase (collectives
cannot sit inside `tf.cond` in replica context), so the step is traced once more then.
State changes only if the step commits (`tfdist.step.transaction`): a NaN or Inf gradient
on any replica leaves it as it was on every replica. Under parameter servers nothing
crosses between replicas: the casts and int8 compress each gradient *push* instead
(`PushCodec`, used by the optimizer seam in `tfdist.seam.optimizer`).
"""

import functools
import numbers

import tensorflow as tf

from tfdist.compression.buffers import Layout
from tfdist.compression.communicator import Communicator
from tfdist.compression.compressors import Cast, compressor_by_name
from tfdist.compression.corrections import (checked_corrections, ratio_schedule, stage_of,
                                            transform_of)
from tfdist.compression.push import PushCodec, Pushed
from tfdist.compression.slots import Slots
from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.config.sections.compression import EXCHANGE_OPTIONS
from tfdist.config.yaml_source import Source
from tfdist.errors import UnsupportedError
from tfdist.seam.frozen_variance import FrozenVariance
from tfdist.step import gradients, transaction
from tfdist.step.buckets import DEFAULT_BUCKET_BYTES
from tfdist.step.hooks import TrainingHook, exchange_rows_apart
from tfdist.step.resize import rule_of_state
from tfdist.step.tracing import do_not_convert
from tfdist.strategies.kind import capabilities_of

#: The exchange's arguments, checked as the config's compression section is; the seed
#: of random compressors (random-k, QSGD's rounding) is any 64-bit integer.
ARGUMENTS = {**EXCHANGE_OPTIONS, "seed": checks.integer}
_ARGUMENTS = Source.of_call("GradientCompression")


class GradientCompression(TrainingHook):
    """Exchanges gradients through `compressor`, with optional error feedback.

    Args:
        compressor: a `Compressor` (see `tfdist.compression.compressors`).
        error_feedback: True: keep what compression lost and add it to the next gradient
            (Karimireddy et al. 2019, "Error Feedback Fixes SignSGD"); "ef21": send the
            compressed change of a per-replica estimate of the gradient, and exchange the
            sum of the estimates (Richtarik, Sokolov and Fatkhullin 2021, "EF21",
            arXiv 2106.05203; before `start_step` the estimates follow the gradients).
        start_step: steps exchanged uncompressed before compression starts.
        min_size: tensors with fewer values go uncompressed.
        seed: seed of the random choices (randomk indices, qsgd rounding, PowerSGD's Q0).
        momentum_correction: the momentum m of DGC's local velocity u = m u + g, which is
            accumulated (v += u) and exchanged instead of the gradient, with momentum
            factor masking (u and v zeroed where values were sent). topk and randomk with
            error_feedback=True; give the optimizer no momentum of its own (DGC applies
            plain SGD to the exchanged sum). Lin et al. 2018, "Deep Gradient Compression",
            arXiv 1712.01887. 0: off.
        local_clip_norm: DGC's local gradient clipping: each replica clips its gradient
            (the global L2 norm of the compressed tensors) to this norm / sqrt(N) before
            accumulating it (0: off).
        ratio_warmup_steps, ratio_warmup_start: DGC's exponential warm-up of a top-k or
            random-k ratio from `ratio_warmup_start` down to the compressor's ratio over
            these steps after `start_step`, in `corrections.STAGES` stages (0: off).
        bucket_bytes: all-reduce the uncompressed tensors (and the casts') in buckets of
            this size that overlap the backward pass (`tfdist.step.buckets`; 0: one
            fused buffer; None: `DEFAULT_BUCKET_BYTES`).
        freeze_variance: from `start_step` on, an Adam or AdamW optimizer keeps its second
            moment as it was then (1-bit Adam, Tang et al. 2021, arXiv 2102.02888:
            error feedback does not mix with Adam's variance;
            `tfdist.seam.frozen_variance.frozen_variance_adam`). Needs start_step > 0: the
            warm-up that learns it.

    Raises:
        ConfigError: an option out of its range, or one the compressor does not take.

    Attributes (once built):
        state: {name: tf.Variable} of the transformation's state, per replica.
        large_layout: the layout of the compressed buffer.
    """

    replaces_exchange = True
    #: The replicas it exchanges among: None, those of the replica context; Horovod's
    #: workers (`tfdist.horovod.ops.WorkersContext`, from `hvd.DistributedOptimizer`).
    context = None

    def __init__(self, compressor, *, error_feedback=False, start_step=0, min_size=1024, seed=0,
                 momentum_correction=0.0, local_clip_norm=0.0, ratio_warmup_steps=0,
                 ratio_warmup_start=0.25, bucket_bytes=None, freeze_variance=False):
        if error_feedback not in (True, False, "ef21"):
            raise _ARGUMENTS.error(("error_feedback",), "expected True, False or 'ef21'. "
                                   f"Received: error_feedback={error_feedback!r}")
        checked = check_arguments(
            "GradientCompression", ARGUMENTS, start_step=start_step, min_size=min_size,
            seed=seed, freeze_variance=freeze_variance,
            bucket_bytes=DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes)
        self.compressor, self.error_feedback = compressor, error_feedback
        self.bucket_bytes, self.seed = checked["bucket_bytes"], checked["seed"]
        self.start_step, self.min_size = checked["start_step"], checked["min_size"]
        self.corrections = {"momentum_correction": momentum_correction,
                            "local_clip_norm": local_clip_norm,
                            "ratio_warmup_steps": ratio_warmup_steps,
                            "ratio_warmup_start": ratio_warmup_start}
        self.corrections = checked_corrections(compressor, error_feedback, self.corrections)
        self.freeze_variance = checked["freeze_variance"]
        if self.freeze_variance and self.start_step <= 0:
            raise _ARGUMENTS.error(("freeze_variance",), "freeze_variance keeps Adam's "
                                   "second moment as it was at start_step (1-bit Adam, Tang "
                                   "et al. 2021): it needs a warm-up that learns it, "
                                   f"start_step > 0. Received: start_step={self.start_step}")
        ratio = getattr(compressor, "ratio", None)
        self.schedule = (ratio_schedule(ratio, self.corrections["ratio_warmup_start"],
                                        self.corrections["ratio_warmup_steps"])
                         if ratio is not None else [(0, None)])
        self.transforms = [transform_of(_with_ratio(compressor, r), error_feedback, self.corrections,
                                       self.start_step, self.min_size)
                           for _, r in self.schedule]
        self.transform = self.transforms[-1]  # every stage has its layout and state
        self.phased = self.start_step > 0 or len(self.schedule) > 1
        self.state = {}

    def phase(self, step):
        """Compressing (True) from `start_step` on; with a ratio warm-up, (compressing, the
        warm-up's stage)."""
        compressing = step >= self.start_step
        if len(self.schedule) == 1:
            return compressing
        return compressing, stage_of(self.schedule, step - self.start_step)

    @property
    def compressing(self):
        """Whether the step is traced to compress (the phase the driver entered)."""
        phase = self.phase(0) if self.current_phase is None else self.current_phase
        return phase[0] if isinstance(phase, tuple) else phase

    @property
    def stage(self):
        """The ratio warm-up's stage the step is traced for (the last one without one)."""
        phase = self.phase(0) if self.current_phase is None else self.current_phase
        return phase[1] if isinstance(phase, tuple) else len(self.schedule) - 1

    def frozen_variance_step(self):
        """The optimizer step Adam's second moment stays at, in the phase traced (None:
        not frozen)."""
        return self.start_step if self.freeze_variance and self.compressing else None

    def updater(self, inner):
        """The update stage (`tfdist.step.update`): Adam's frozen variance from
        `start_step` (1-bit Adam), the gradient pushed encoded to a parameter server."""
        step = self.frozen_variance_step()
        inner = inner if step is None else FrozenVariance(inner, step)
        return inner if self.push_codec is None else Pushed(self.push_codec, inner)

    @property
    def residual(self):
        return self.state.get("residual")

    @property
    def qs(self):
        return [v for k, v in sorted(self.state.items()) if k.startswith("powersgd_q")]

    def get_config(self):
        """The options that rebuild this hook with `tfdist.compression.build(**config)`
        (saved with a Keras model whose optimizer exchanges through it).

        Returns:
            A dict of name, the compressor's ratio, rank, levels or block_size (if it
            has one), the corrections that are on, error_feedback, start_step, min_size
            and seed.

        Raises:
            ValueError: `build` would not make this compressor from those options (a
                compressor class of your own, or one made with other arguments).
        """
        params = _described(self.compressor, self.error_feedback)
        defaults = {"momentum_correction": 0.0, "local_clip_norm": 0.0, "ratio_warmup_steps": 0,
                    "ratio_warmup_start": 0.25}
        corrections = {k: v for k, v in self.corrections.items() if v != defaults[k]}
        if self.bucket_bytes != DEFAULT_BUCKET_BYTES:
            corrections["bucket_bytes"] = self.bucket_bytes
        if self.freeze_variance:
            corrections["freeze_variance"] = True
        error_feedback = "ef21" if self.error_feedback == "ef21" else bool(self.error_feedback)
        config = {"name": self.compressor.name, **(params or {}), **corrections,
                  "error_feedback": error_feedback, "start_step": self.start_step,
                  "min_size": self.min_size, "seed": self.seed}
        if params is None:
            raise ValueError("this compression cannot be described by build()'s options, so "
                             "it cannot be saved with the model; use a compressor by name. "
                             f"Received: compressor={self.compressor!r}, config={config}")
        return config

    # --- state ----------------------------------------------------------------------

    def build(self, strategy, variables, shapes=None):
        """State for exchanging the gradients of `variables` — or, given `shapes`, tensors
        of those shapes (`exchange_dense`)."""
        caps = capabilities_of(strategy)
        self.push = caps.push
        name = self.compressor.name
        corrected = any(v != d for v, d in zip(self.corrections.values(), (0.0, 0.0, 0, 0.25)))
        if self.push and (corrected or not (caps.allows_compressor(name) and
                                            caps.allows_compression_options(
                error_feedback=self.error_feedback, start_step=self.start_step))):
            raise UnsupportedError(
                f"under {caps.name} only the gradient push is compressed, with "
                f"[{', '.join(caps.push_compression)}], without error feedback or delayed "
                f"start. Received: compression={name!r}, "
                f"error_feedback={self.error_feedback}, start_step={self.start_step}")
        self.push_codec = (PushCodec(self.compressor)
                           if self.push and self.compressor.compresses else None)
        self.shapes = (_checked_shapes(shapes) if shapes is not None
                       else [tuple(v.shape) for v in variables])
        self.slots = Slots(variables, self.shapes)
        small, large, self.large_layout = self.transform.split(self.shapes)
        self.small_size = Layout(tuple(self.shapes[i] for i in small)).size
        local = dict(trainable=False, aggregation=tf.VariableAggregation.NONE)
        self.state = {key: tf.Variable(value, name=f"tfdist_{key}", **local)
                      for key, value in self.transform.init_state(self.shapes, self.seed).items()}

    def replica_state(self):
        return [self.state[key] for key in sorted(self.state)]

    def replica_state_rules(self):
        return [rule_of_state(key) for key in sorted(self.state)]

    # --- the exchange ---------------------------------------------------------------

    @do_not_convert
    def exchange(self, grads, variables, step):
        """The compressed sum of `grads`. An `IndexedSlices` gradient (an embedding's) goes
        as its rows, all-gathered as TensorFlow's strategies do — in the cast's dtype for
        fp16 and bf16, as they are for the other compressors, which choose among dense
        values — and the dense gradients go through the compressor, with the state (error
        feedback's residual, PowerSGD's Q, ...) of theirs: what the whole table would have
        sent densely (the rows a step did not touch) never crosses."""
        if self.push:  # nothing crosses between replicas; the push is compressed instead
            return list(grads)
        exchange = functools.partial(self.exchange_dense, step=step)
        if not any(gradients.is_sparse(g) for g in grads):
            return self.slots.exchange_all(exchange, grads, variables)
        dense_variables = [v for g, v in zip(grads, variables) if not gradients.is_sparse(g)]
        rows_dtype = (self.compressor.dtype  # rows cross in the cast's dtype, compressing
                      if self.compressing and isinstance(self.compressor, Cast) else None)
        return exchange_rows_apart(
            grads, lambda dense: self.slots.exchange_present(exchange, dense, dense_variables),
            sparse_dtype=rows_dtype, context=self.context)

    @do_not_convert
    def exchange_dense(self, dense, step, context=None, present=None):
        """(replica context) The sums of `dense` (tensors of the shapes built, in their
        order; or of those `present` lists, the indices of the shapes built, in order)
        over `context`'s replicas (None: every replica in sync)."""
        present = list(range(len(self.shapes))) if present is None else list(present)
        built = [self.shapes[i] for i in present]
        shapes = [tuple(getattr(t, "shape", ())) for t in dense]
        if len(shapes) != len(built) or any(
                not tf.TensorShape(s).is_compatible_with(b) for s, b in zip(shapes, built)):
            raise ValueError(f"exchange_dense takes one tensor of each shape built, in order "
                             f"({built!s:.80}). Received: shapes {shapes!s:.80}")
        comm = Communicator(context or self.context, bucket_bytes=self.bucket_bytes)
        transform = self.transforms[self.stage].for_phase(self.compressing)
        whole = {k: v.read_value() for k, v in self.state.items()}
        state, put_back = whole, lambda new: new
        if len(present) < len(self.shapes):  # the others cross as rows
            state, put_back = transform.restricted(self.shapes, present, whole)
        summed, state = transform.exchange(dense, state, comm, _seeds(self.seed, comm, step))
        state = put_back(state)
        for key, value in state.items():
            transaction.assign(self.state[key], value)
        return summed

    # --- statistics -----------------------------------------------------------------

    def bytes_per_step(self, step=None):
        """{"payload": bytes this replica contributes, "dense": float32 bytes uncompressed,
        "gathered": the part of the payload that is all-gathered (the rest is all-reduced)}."""
        dense = 4 * (self.small_size + sum(self.large_layout.sizes))
        if step is not None and step < self.start_step:
            return {"payload": dense, "dense": dense, "gathered": 0}
        compressor = _with_ratio(self.compressor, self.schedule[
            self.stage if step is None else stage_of(self.schedule, step - self.start_step)][1])
        large = compressor.payload_bytes(self.large_layout) if self.large_layout.shapes else 0
        gather = self.compressing and self.compressor.collective == "gather"
        return {"payload": 4 * self.small_size + large, "dense": dense,
                "gathered": large if gather else 0}


def _described(compressor, error_feedback):
    """The options (ratio, rank, levels, block_size: those it has) that rebuild `compressor`
    by name (`compressor_by_name`), or None if they do not (a class of your own, or one
    made with other arguments)."""
    params = {k: getattr(compressor, k) for k in ("ratio", "rank", "levels")
              if hasattr(compressor, k)}
    if getattr(compressor, "block_size", 0):  # sign's scales per block
        params["block_size"] = compressor.block_size
    try:
        rebuilt = compressor_by_name(compressor.name, **params, error_feedback=error_feedback)
    except (KeyError, TypeError, ValueError):
        return None
    return params if type(rebuilt) is type(compressor) and vars(rebuilt) == vars(compressor) \
        else None


def _seeds(seed, comm, step):
    """The step's random seeds: one every replica shares, one of this replica's own."""
    shared = tf.stack([tf.cast(seed, tf.int64), tf.cast(step, tf.int64)])
    return {"shared": shared,
            "local": tf.random.experimental.stateless_fold_in(shared, comm.replica_id)}


def _checked_shapes(shapes):
    """`build`'s `shapes` as tuples of non-negative integers, or a one-line ValueError."""
    problem = (isinstance(shapes, (str, bytes)) or not isinstance(shapes, (list, tuple))
               or not shapes)
    checked = []
    for shape in [] if problem else shapes:
        dims = list(shape) if isinstance(shape, (list, tuple, tf.TensorShape)) else None
        if dims is None or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool)
                                   and d >= 0 for d in dims):
            problem = True
            break
        checked.append(tuple(int(d) for d in dims))
    if problem:
        raise ValueError(f"shapes must be a non-empty list of fully defined tensor shapes "
                         f"(non-negative integers). Received: shapes={shapes!r:.80}")
    return checked


def _with_ratio(compressor, ratio):
    """`compressor` keeping `ratio` of the values (itself when `ratio` is None or its own)."""
    if ratio is None or ratio == compressor.ratio:
        return compressor
    copy = object.__new__(type(compressor))
    copy.__dict__.update(vars(compressor), ratio=ratio)
    return copy
