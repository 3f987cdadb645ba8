"""The compressed gradient exchange, as a `TrainingHook` that replaces the all-reduce.

One step on each replica: gradients of small tensors (fewer than `min_size` values, and
for PowerSGD every tensor of rank < 2) are fused into one float32 buffer and all-reduced
as they are; the others are fused into one buffer, to which error feedback adds the
residual, and which the compressor encodes; the payload itself crosses the network
(all-reduce for "sum" compressors, all-gather for "gather" ones) and is decoded and
summed on arrival. Under ParameterServerStrategy there is no exchange between replicas:
the casts and int8 compress each gradient *push* instead — encoded on the worker,
decoded inside the variable update on the parameter server (`PushCodec`, used by the
optimizer seam in `tfdist.core.optimizer`).
Before `start_step` everything goes uncompressed (delayed start):
the switch is a Python phase (collectives cannot sit inside `tf.cond` in replica context),
so the step function is traced once more when it happens (`TrainingHook.phase`).
Residuals and Qs change only if the step commits (`tfdist.core.transaction`): a NaN or Inf
gradient on any replica leaves them as they were on every replica.
"""

import tensorflow as tf

from tfdist.compression import powersgd
from tfdist.compression.buffers import Layout, pack, unpack
from tfdist.compression.compressors import PowerSGD, compressor_by_name
from tfdist.core import transaction
from tfdist.core.hooks import TrainingHook
from tfdist.core.variables import underlying
from tfdist.errors import UnsupportedError
from tfdist.strategies.kind import capabilities_of


def _key(variable):
    return id(underlying(variable))


class GradientCompression(TrainingHook):
    """Exchanges gradients through `compressor`, with optional error feedback.

    Args:
        compressor: a `Compressor` (see `tfdist.compression.compressors`).
        error_feedback: keep what compression lost and add it to the next gradient
            (Karimireddy et al. 2019, "Error Feedback Fixes SignSGD").
        start_step: steps exchanged uncompressed before compression starts.
        min_size: tensors with fewer values go uncompressed.
        seed: seed of the random choices (randomk indices, qsgd rounding, PowerSGD's Q0).
    """

    replaces_exchange = True

    def __init__(self, compressor, *, error_feedback=False, start_step=0, min_size=1024, seed=0):
        self.compressor, self.error_feedback = compressor, error_feedback
        self.start_step, self.min_size, self.seed = int(start_step), int(min_size), int(seed)
        self.residual, self.qs = None, []
        self.phased = self.start_step > 0

    def phase(self, step):
        """Compressing (True) from `start_step` on."""
        return step >= self.start_step

    @property
    def compressing(self):
        """Whether the step is traced to compress (the phase the driver entered)."""
        return self.phase(0) if self.current_phase is None else self.current_phase

    def get_config(self):
        """The options that rebuild this hook with `tfdist.compression.build(**config)`
        (saved with a Keras model whose optimizer exchanges through it).

        Returns:
            A dict of name, the compressor's ratio, rank or levels (if it has one),
            error_feedback, start_step, min_size and seed.

        Raises:
            ValueError: `build` would not make this compressor from those options (a
                compressor class of your own, or one made with other arguments).
        """
        params = {k: getattr(self.compressor, k) for k in ("ratio", "rank", "levels")
                  if hasattr(self.compressor, k)}
        config = {"name": self.compressor.name, **params,
                  "error_feedback": bool(self.error_feedback), "start_step": self.start_step,
                  "min_size": self.min_size, "seed": self.seed}
        try:
            rebuilt = compressor_by_name(self.compressor.name, **params,
                                         error_feedback=self.error_feedback)
        except (KeyError, TypeError, ValueError):
            rebuilt = None
        if type(rebuilt) is not type(self.compressor) or vars(rebuilt) != vars(self.compressor):
            raise ValueError("this compression cannot be described by build()'s options, so "
                             "it cannot be saved with the model; use a compressor by name. "
                             f"Received: compressor={self.compressor!r}, config={config}")
        return config

    # --- state ----------------------------------------------------------------------

    def build(self, strategy, variables):
        caps = capabilities_of(strategy)
        self.num_replicas = strategy.num_replicas_in_sync
        self.push = caps.push
        name = self.compressor.name
        self.push_codec = PushCodec(self.compressor) if self.push and name != "none" else None
        if self.push and not (caps.allows_compressor(name) and caps.allows_compression_options(
                error_feedback=self.error_feedback, start_step=self.start_step)):
            raise UnsupportedError(
                f"under {caps.name} only the gradient push is compressed, with "
                f"[{', '.join(caps.push_compression)}], without error feedback or delayed "
                f"start. Received: compression={name!r}, "
                f"error_feedback={self.error_feedback}, start_step={self.start_step}")
        self.slots = {_key(v): i for i, v in enumerate(variables)}
        shapes = [tuple(v.shape) for v in variables]
        self.large = [i for i, s in enumerate(shapes) if self._compressed(s)]
        self.small = [i for i in range(len(shapes)) if i not in set(self.large)]
        self.small_layout = Layout(tuple(shapes[i] for i in self.small))
        self.large_layout = Layout(tuple(shapes[i] for i in self.large), self.compressor.align)
        local = dict(trainable=False, aggregation=tf.VariableAggregation.NONE)
        if self.error_feedback and self.large:
            self.residual = tf.Variable(tf.zeros([self.large_layout.size]),
                                        name="tfdist_residual", **local)
        if isinstance(self.compressor, PowerSGD):
            self.qs = [tf.Variable(powersgd.initial_q(s, self.compressor.rank, [self.seed, i]),
                                   name=f"tfdist_powersgd_q{i}", **local)
                       for i, s in enumerate(self.large_layout.shapes)]

    def _compressed(self, shape):
        size = 1
        for d in shape:
            size *= d
        if isinstance(self.compressor, PowerSGD) and len(shape) < 2:
            return False
        return size >= self.min_size and self.compressor.name != "none"

    # --- the exchange ---------------------------------------------------------------

    def exchange(self, grads, variables, step):
        if self.push:  # nothing crosses between replicas; the push is compressed instead
            return list(grads)
        context = tf.distribute.get_replica_context()
        dense = [None] * len(self.slots)
        for grad, variable in zip(grads, variables):
            dense[self.slots[_key(variable)]] = tf.convert_to_tensor(grad)
        shapes = self.small_layout.shapes + self.large_layout.shapes
        for i, shape in zip(self.small + self.large, shapes):
            if dense[i] is None:
                dense[i] = tf.zeros(shape, tf.float32)
        small = _all_reduce(context, [dense[i] for i in self.small])
        large = self._exchange_large(context, [dense[i] for i in self.large], step)
        summed = dict(zip(self.small + self.large, small + large))
        return [tf.cast(summed[self.slots[_key(v)]], g.dtype) for g, v in zip(grads, variables)]

    def _exchange_large(self, context, tensors, step):
        if not tensors:
            return []
        buffer, layout = pack(tensors, self.compressor.align)
        if self.residual is not None:
            buffer += self.residual
        if self.compressing:
            summed = self._compressed_sum(context, buffer, layout, step)
        else:
            summed = self._plain_sum(context, buffer)
        return unpack(summed, layout)

    def _plain_sum(self, context, buffer):
        if self.residual is not None:
            transaction.assign(self.residual, tf.zeros_like(buffer))
        return context.all_reduce(tf.distribute.ReduceOp.SUM, buffer)

    def _compressed_sum(self, context, buffer, layout, step):
        if isinstance(self.compressor, PowerSGD):
            return self._powersgd_sum(context, buffer, layout)
        shared = tf.stack([tf.cast(self.seed, tf.int64), tf.cast(step, tf.int64)])
        local = tf.random.experimental.stateless_fold_in(shared, context.replica_id_in_sync_group)
        seeds = {"shared": shared, "local": local}
        payload = self.compressor.encode(buffer, layout, seeds)
        if self.compressor.collective == "sum":
            summed = self.compressor.decode(
                tuple(context.all_reduce(tf.distribute.ReduceOp.SUM, list(payload))), layout, seeds)
            own = self.compressor.decode(payload, layout, seeds) if self.residual is not None else None
        else:
            gathered = [_all_gather(context, p) for p in payload]
            decoded = [self.compressor.decode(tuple(g[r] for g in gathered), layout, seeds)
                       for r in range(context.num_replicas_in_sync)]
            summed = tf.add_n(decoded)
            own = tf.stack(decoded)[context.replica_id_in_sync_group]  # decoded once, reused
        if self.residual is not None:
            transaction.assign(self.residual, buffer - own)
        return summed

    def _powersgd_sum(self, context, buffer, layout):
        matrices = [tf.reshape(t, powersgd.matrix_shape(s))
                    for t, s in zip(unpack(buffer, layout), layout.shapes)]
        approx, new_qs = powersgd.exchange(matrices, [q.read_value() for q in self.qs],
                                           lambda ts: _all_reduce(context, ts))
        for q, new in zip(self.qs, new_qs):
            transaction.assign(q, new)
        summed, _ = pack(approx)
        if self.residual is not None:  # what this replica's share of the sum did not carry
            transaction.assign(self.residual, buffer - summed / context.num_replicas_in_sync)
        return summed

    # --- statistics -----------------------------------------------------------------

    def bytes_per_step(self, step=None):
        """{"payload": bytes this replica contributes, "dense": float32 bytes uncompressed,
        "gathered": the part of the payload that is all-gathered (the rest is all-reduced)}."""
        dense = 4 * (sum(self.small_layout.sizes) + sum(self.large_layout.sizes))
        if step is not None and step < self.start_step:
            return {"payload": dense, "dense": dense, "gathered": 0}
        if isinstance(self.compressor, PowerSGD):
            large = powersgd.payload_bytes(self.large_layout.shapes, self.compressor.rank)
        else:
            large = self.compressor.payload_bytes(self.large_layout) if self.large else 0
        gather = self.compressing and self.compressor.collective == "gather"
        return {"payload": 4 * self.small_layout.size + large, "dense": dense,
                "gathered": large if gather else 0}


class PushCodec:
    """Compresses one gradient pushed to a parameter server: `encode` runs on the worker,
    `decode` inside the variable's update on the server (the payload is what crosses)."""

    def __init__(self, compressor):
        self.compressor = compressor

    def encode(self, grad):
        """(payload tensors, layout) of `grad`."""
        buffer, layout = pack([grad], self.compressor.align)
        return self.compressor.encode(buffer, layout, None), layout

    def decode(self, payload, layout):
        return unpack(self.compressor.decode(payload, layout, None), layout)[0]


def _all_gather(context, tensor):
    """[replicas, ...] of every replica's `tensor`. Bytes go as int32 (not every
    collective implementation gathers int8/uint8), bit for bit, padded to whole words."""
    if tensor.dtype not in (tf.int8, tf.uint8):
        return context.all_gather(tensor[None], axis=0)
    size = tensor.shape[0]
    words = tf.bitcast(tf.reshape(tf.pad(tensor, [[0, -size % 4]]), [-1, 4]), tf.int32)
    gathered = context.all_gather(words[None], axis=0)
    replicas = context.num_replicas_in_sync
    return tf.reshape(tf.bitcast(gathered, tensor.dtype), [replicas, -1])[:, :size]


def _all_reduce(context, tensors):
    """Sums `tensors` over replicas in one fused float32 all-reduce (which carries the
    step's finiteness verdict if nothing did before)."""
    if not tensors:
        return []
    buffer, layout = pack(tensors)
    return unpack(transaction.all_reduce_sum(context, [buffer])[0], layout)
