"""Gradient compressors: pure functions from a flat float32 buffer to a payload and back,
and the exchange of that payload, which each compressor owns.

`encode(x, layout, seeds)` returns a tuple of tensors (the payload); `decode(payload,
layout, seeds)` returns the buffer it stands for. `seeds` holds a ``shared`` seed (same on
every replica) and a ``local`` one (different per replica). `payload_bytes(layout)` is the
size of the payload, for communication statistics. `exchange(buffer, layout, state,
comm, seeds)` sends it through a `Communicator` and returns ``(sum over replicas, this
replica's share as sent, new state)``; by `collective`:

- ``"sum"``: payloads are added by an all-reduce, then decoded once (none, fp16, bf16,
  randomk — whose indices come from a seed all replicas share, so only values travel);
- ``"gather"``: payloads are all-gathered, each decoded, then summed (int8, int4, qsgd, sign,
  topk — whose payloads cannot be added as they are);
- PowerSGD overrides `exchange` (two all-reduces, and its Q matrices as state).

State is explicit (optax's init/update): `init_state(layout, seed)` gives a dict of
tensors the caller keeps in variables and passes back each step.
"""

import math

import numpy as np
import tensorflow as tf

from tfdist.compression import powersgd
from tfdist.compression.buffers import pack, per_block, tensor_max, tensor_sum, unpack
from tfdist.config.errors import ConfigError
from tfdist.config import checks
from tfdist.config.hyperparameters import BLOCK_SIZE, LEVELS, NAMES, RANK, RATIO
from tfdist.config.yaml_source import Source
from tfdist.errors import shown

BLOCK = 64  # quantisers' alignment: per-tensor scales broadcast over blocks


class Compressor:
    """Base class, and the identity ("none": tensors go in the plain fused all-reduce);
    see the module docstring."""

    name = "none"
    collective = "sum"
    align = 1  # the buffer layout this compressor wants (see `buffers.Layout`)
    compresses = False  # subclasses that change the payload say True
    bucketable = False  # a stateless all-reduce that may be split in buckets (the casts)

    def accepts(self, shape):
        """Whether a tensor of `shape` goes through this compressor (else uncompressed)."""
        return self.compresses

    def init_state(self, layout, seed):
        """The state this compressor keeps between steps (none by default)."""
        return {}

    def phase(self, step):
        """Compressors do the same at every step (see `wrappers.DelayedStart`)."""
        return None

    def for_phase(self, phase):
        return self

    def exchange(self, buffer, layout, state, comm, seeds):
        """(decoded sum over replicas, this replica's decoded payload, new state)."""
        payload = self.encode(buffer, layout, seeds)
        if self.collective == "sum":
            summed = self.decode(tuple(comm.all_reduce(payload)), layout, seeds)
            return summed, self.decode(payload, layout, seeds), state
        gathered = [comm.all_gather(p) for p in payload]
        decoded = [self.decode(tuple(g[r] for g in gathered), layout, seeds)
                   for r in range(comm.num_replicas)]
        # This replica's share from its own payload (the same bits as its gathered copy),
        # not picked out of `decoded` by replica id: that pick is constant-folded into a
        # graph that differs per replica, which TF's arithmetic optimizer then sums in a
        # different order on each (1 ulp apart, and EF21's kept sum drifted apart).
        return tf.add_n(decoded), self.decode(payload, layout, seeds), state

    def encode(self, x, layout, seeds):
        return (x,)

    def decode(self, payload, layout, seeds):
        return payload[0]

    def payload_bytes(self, layout):
        return 4 * layout.size

    def __repr__(self):
        return f"{type(self).__name__}()"


class Cast(Compressor):
    """fp16 / bf16: all-reduce in the reduced dtype, pre-scaled by 1/N against overflow."""

    compresses, bucketable = True, True

    collective = "sum"

    def __init__(self, dtype):
        names = {"float16": "fp16", "bfloat16": "bf16"}
        if getattr(dtype, "name", dtype) not in names:
            raise ConfigError(f"dtype: expected float16 or bfloat16. Received: dtype={shown(dtype)}",
                              file="Cast()")
        self.dtype = tf.as_dtype(dtype)
        self.name = names[self.dtype.name]

    def encode(self, x, layout, seeds):
        return (tf.cast(x / _num_replicas(), self.dtype),)

    def decode(self, payload, layout, seeds):
        return tf.cast(payload[0], tf.float32) * _num_replicas()

    def payload_bytes(self, layout):
        return 2 * layout.size


class Int8(Compressor):
    """8-bit linear quantisation with one float32 scale per tensor (max |x| / 127)."""

    compresses = True

    name, collective, align = "int8", "gather", BLOCK

    def encode(self, x, layout, seeds):
        blocks = layout.blocks(x)
        scale = tensor_max(tf.abs(blocks), layout) / 127.0
        scale = tf.where(scale > 0, scale, tf.ones_like(scale))
        q = tf.cast(tf.round(blocks / per_block(scale, layout)), tf.int8)
        return tf.reshape(q, [-1]), scale

    def decode(self, payload, layout, seeds):
        q, scale = payload
        return _flat(tf.cast(layout.blocks(q), tf.float32) * per_block(scale, layout))

    def payload_bytes(self, layout):
        return layout.size + 4 * layout.num_segments


class Int4(Int8):
    """4-bit linear quantisation (two values per byte) with one float32 scale per tensor
    (max |x| / 7): Streaming DiLoCo's 4-bit outer gradients (Douillard et al. 2025, arXiv
    2501.18512), here with integer levels -7..7."""

    name = "int4"
    LEVELS = 7

    def encode(self, x, layout, seeds):
        blocks = layout.blocks(x)
        scale = tensor_max(tf.abs(blocks), layout) / self.LEVELS
        scale = tf.where(scale > 0, scale, tf.ones_like(scale))
        q = tf.clip_by_value(tf.round(blocks / per_block(scale, layout)), -self.LEVELS,
                             self.LEVELS)
        nibbles = tf.reshape(tf.cast(q + self.LEVELS + 1, tf.uint8), [-1, 2])  # 1..15
        return nibbles[:, 0] + nibbles[:, 1] * 16, scale  # align is even

    def decode(self, payload, layout, seeds):
        packed, scale = payload
        nibbles = tf.stack([tf.bitwise.bitwise_and(packed, 15),
                            tf.bitwise.right_shift(packed, 4)], axis=1)
        q = tf.cast(tf.reshape(nibbles, [-1]), tf.float32) - (self.LEVELS + 1)
        return _flat(layout.blocks(q) * per_block(scale, layout))

    def payload_bytes(self, layout):
        return layout.size // 2 + 4 * layout.num_segments


class QSGD(Compressor):
    """Stochastic quantisation to `levels` levels of |x| / ||x|| per tensor; unbiased.

    Alistarh et al. 2017, "QSGD: Communication-Efficient SGD via Gradient Quantization
    and Encoding".
    """

    compresses = True

    name, collective, align = "qsgd", "gather", BLOCK

    def __init__(self, levels=LEVELS.default):
        self.levels = LEVELS.check(levels, type(self).__name__)

    def encode(self, x, layout, seeds):
        blocks = layout.blocks(x)
        norm = tf.sqrt(tensor_sum(tf.square(blocks), layout))
        safe = tf.where(norm > 0, norm, tf.ones_like(norm))
        scaled = tf.abs(blocks) * per_block(self.levels / safe, layout)
        noise = tf.random.stateless_uniform(tf.shape(blocks), seeds["local"])
        level = tf.floor(scaled + noise)  # E[level] = scaled: unbiased; padding stays 0
        return _flat(tf.cast(tf.sign(blocks) * level, tf.int8)), norm

    def decode(self, payload, layout, seeds):
        level, norm = payload
        return _flat(tf.cast(layout.blocks(level), tf.float32)
                     * per_block(norm / self.levels, layout))

    def payload_bytes(self, layout):
        return layout.size + 4 * layout.num_segments


class Sign(Compressor):
    """1 bit per value (bit-packed), scaled by mean |x| per tensor or per block.

    Seide et al. 2014, "1-bit stochastic gradient descent"; Bernstein et al. 2018,
    "signSGD". Biased: use it with error feedback, with which it is Karimireddy et al.
    2019's EF-signSGD ("Error Feedback Fixes SignSGD", arXiv 1901.09847): their scaled
    sign ||x||_1 / d · sign(x) of each parameter tensor is the default. With `block_size`,
    each block of that many values of a tensor gets its own scale (Zheng et al. 2019,
    "Communication-Efficient Distributed Blockwise Momentum SGD with Error-Feedback"):
    4 more bytes per block, and a compression error that no longer grows with how
    unevenly a tensor's magnitudes spread over its values.

    Args:
        block_size: values per scale, a multiple of 64 (0: one scale per tensor).
    """

    compresses = True

    name, collective, align = "sign", "gather", BLOCK
    _WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)  # bit i of a byte

    def __init__(self, block_size=BLOCK_SIZE.default):
        self.block_size = BLOCK_SIZE.check(block_size, type(self).__name__)

    def scale_groups(self, layout):
        """(int32 [blocks]: the scale of each aligned block, number of scales, float32
        [scales]: the values each scale covers, padding excluded)."""
        per_tensor = [n // self.align for n in layout.padded_sizes]
        span = self.block_size // self.align if self.block_size else None
        ids, counts = [], []
        for size, blocks in zip(layout.sizes, per_tensor):
            groups = 1 if span is None else -(-blocks // span)
            first = len(counts)
            ids.append(first + (np.arange(blocks) // (span or blocks)))
            width = self.block_size or size
            counts += [min(width, size - g * width) for g in range(groups)]
        ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        return (tf.constant(ids, tf.int32), len(counts),
                tf.constant(np.array(counts, np.float32)))

    def encode(self, x, layout, seeds):
        blocks = layout.blocks(x)
        ids, groups, counts = self.scale_groups(layout)
        scale = tf.math.unsorted_segment_sum(tf.reduce_sum(tf.abs(blocks), axis=1), ids,
                                             groups) / counts
        bits = tf.reshape(tf.cast(x >= 0, tf.uint8), [-1, 8])  # align is a multiple of 8
        packed = tf.reduce_sum(bits * tf.constant(self._WEIGHTS, tf.uint8), axis=1)
        return packed, scale

    def decode(self, payload, layout, seeds):
        packed, scale = payload
        bits = tf.bitwise.bitwise_and(packed[:, None], tf.constant(self._WEIGHTS, tf.uint8)) > 0
        ids, _, _ = self.scale_groups(layout)
        magnitude = tf.gather(scale, ids)[:, None] * layout.padding_mask()  # padding: 0
        return _flat(tf.where(layout.blocks(bits), magnitude, -magnitude))

    def payload_bytes(self, layout):
        return layout.size // 8 + 4 * self.scale_groups(layout)[1]

    def __repr__(self):
        return f"Sign(block_size={self.block_size})" if self.block_size else "Sign()"


class TopK(Compressor):
    """The `ratio` largest-magnitude values of the buffer, with their int32 indices."""

    compresses = True

    name, collective = "topk", "gather"

    def __init__(self, ratio=RATIO.default):
        self.ratio = RATIO.check(ratio, type(self).__name__)

    def k(self, layout):
        return max(1, math.ceil(self.ratio * layout.size))

    def encode(self, x, layout, seeds):
        _, indices = tf.math.top_k(tf.abs(x), k=self.k(layout), sorted=False)
        return tf.gather(x, indices), indices

    def decode(self, payload, layout, seeds):
        values, indices = payload
        return tf.scatter_nd(indices[:, None], values, [layout.size])

    def payload_bytes(self, layout):
        return 8 * self.k(layout)


class RandomK(Compressor):
    """`ratio` of the values at indices drawn from a seed all replicas share, so only the
    values travel and they can be all-reduced. Unbiased (scaled by size / k) unless
    `unbiased=False` (as error feedback wants: it keeps what was not sent)."""

    compresses = True

    name, collective = "randomk", "sum"

    def __init__(self, ratio=RATIO.default, unbiased=True):
        self.ratio, self.unbiased = RATIO.check(ratio, type(self).__name__), unbiased

    def k(self, layout):
        return max(1, math.ceil(self.ratio * layout.size))

    def indices(self, layout, seeds):
        scores = tf.random.stateless_uniform([layout.size], seeds["shared"])
        return tf.math.top_k(scores, k=self.k(layout), sorted=False).indices

    def encode(self, x, layout, seeds):
        return (tf.gather(x, self.indices(layout, seeds)),)

    def decode(self, payload, layout, seeds):
        scale = layout.size / self.k(layout) if self.unbiased else 1.0
        return tf.scatter_nd(self.indices(layout, seeds)[:, None], payload[0] * scale,
                             [layout.size])

    def payload_bytes(self, layout):
        return 4 * self.k(layout)


class PowerSGD(Compressor):
    """Rank-`rank` approximation of each matrix by one warm-started power iteration: P = MQ
    and Q' = M^T P̂ are all-reduced (`powersgd.py`). Vogels et al. 2019, "PowerSGD:
    Practical Low-Rank Gradient Compression for Distributed Optimization". Tensors of
    rank < 2 go uncompressed; the Q of each matrix is state."""

    name, collective, compresses = "powersgd", "powersgd", True
    per_tensor_state = ("powersgd_q",)  # one Q per matrix, numbered in the layout

    def __init__(self, rank=RANK.default):
        self.rank = RANK.check(rank, type(self).__name__)

    def accepts(self, shape):
        return len(shape) >= 2

    def init_state(self, layout, seed):
        return {f"powersgd_q{i}": powersgd.initial_q(s, self.rank, [seed, i])
                for i, s in enumerate(layout.shapes)}

    def exchange(self, buffer, layout, state, comm, seeds):
        matrices = [tf.reshape(t, powersgd.matrix_shape(s))
                    for t, s in zip(unpack(buffer, layout), layout.shapes)]
        names = [f"powersgd_q{i}" for i in range(len(layout.shapes))]
        approx, qs = powersgd.exchange(matrices, [state[n] for n in names], comm.all_reduce_fused)
        summed, _ = pack(approx)
        # this replica's share of the sum: what error feedback keeps the rest of
        return summed, summed / comm.num_replicas, dict(zip(names, qs))

    def payload_bytes(self, layout):
        return powersgd.payload_bytes(layout.shapes, self.rank)


def _flat(blocks):
    return tf.reshape(blocks, [-1])


def _num_replicas():
    context = tf.distribute.get_replica_context()
    return context.num_replicas_in_sync if context is not None else 1


def compressor_by_name(name, *, ratio=None, rank=None, levels=None, block_size=None,
                       error_feedback=False):
    """The `Compressor` called `name` (none, fp16, bf16, int8, int4, qsgd, sign, topk, randomk,
    powersgd) with its hyper-parameter (None: the declared default)."""
    checks.string(Source.of_call("compressor_by_name"), ("name",), name, NAMES)
    ratio = RATIO.default if ratio is None else ratio
    return {
        "none": lambda: Compressor(),
        "fp16": lambda: Cast("float16"),
        "bf16": lambda: Cast("bfloat16"),
        "int8": Int8,
        "int4": Int4,
        "qsgd": lambda: QSGD(LEVELS.default if levels is None else levels),
        "sign": lambda: Sign(BLOCK_SIZE.default if block_size is None else block_size),
        "topk": lambda: TopK(ratio),
        # Error feedback keeps what was not sent, so the values go unscaled.
        "randomk": lambda: RandomK(ratio, unbiased=not error_feedback),
        "powersgd": lambda: PowerSGD(RANK.default if rank is None else rank),
    }[name]()
