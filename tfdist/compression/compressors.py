"""Gradient compressors: pure functions from a flat float32 buffer to a payload and back.

Each compressor says how payloads combine across replicas:

- ``"sum"``: payloads are added by an all-reduce, then decoded once (none, fp16, bf16,
  randomk — whose indices come from a seed all replicas share, so only values travel);
- ``"gather"``: payloads are all-gathered, each decoded, then summed (int8, qsgd, sign,
  topk — whose payloads cannot be added as they are).

`encode(x, layout, seeds)` returns a tuple of tensors (the payload); `decode(payload,
layout, seeds)` returns the buffer it stands for. `seeds` holds a ``shared`` seed (same on
every replica) and a ``local`` one (different per replica). `payload_bytes(layout)` is the
size of the payload, for communication statistics. PowerSGD, which exchanges twice per
step, lives in `powersgd.py`.
"""

import math

import tensorflow as tf


class Compressor:
    """Base class; see the module docstring."""

    name = "none"
    collective = "sum"

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

    collective = "sum"

    def __init__(self, dtype):
        self.dtype = tf.as_dtype(dtype)
        self.name = {"float16": "fp16", "bfloat16": "bf16"}[self.dtype.name]

    def encode(self, x, layout, seeds):
        return (tf.cast(x / _num_replicas(), self.dtype),)

    def decode(self, payload, layout, seeds):
        return tf.cast(payload[0], tf.float32) * _num_replicas()

    def payload_bytes(self, layout):
        return 2 * layout.size


class Int8(Compressor):
    """8-bit linear quantisation with one float32 scale per tensor (max |x| / 127)."""

    name, collective = "int8", "gather"

    def encode(self, x, layout, seeds):
        ids = layout.segment_ids()
        scale = tf.math.segment_max(tf.abs(x), ids) / 127.0  # ids are sorted
        scale = tf.where(scale > 0, scale, tf.ones_like(scale))
        q = tf.cast(tf.round(x / tf.gather(scale, ids)), tf.int8)
        return q, scale

    def decode(self, payload, layout, seeds):
        q, scale = payload
        return tf.cast(q, tf.float32) * tf.gather(scale, layout.segment_ids())

    def payload_bytes(self, layout):
        return layout.size + 4 * layout.num_segments


class QSGD(Compressor):
    """Stochastic quantisation to `levels` levels of |x| / ||x|| per tensor; unbiased.

    Alistarh et al. 2017, "QSGD: Communication-Efficient SGD via Gradient Quantization
    and Encoding".
    """

    name, collective = "qsgd", "gather"

    def __init__(self, levels=15):
        if not 1 <= levels <= 127:
            raise ValueError(f"levels must be in [1, 127]. Received: levels={levels}")
        self.levels = levels

    def encode(self, x, layout, seeds):
        ids = layout.segment_ids()
        norm = tf.sqrt(tf.math.segment_sum(tf.square(x), ids))
        safe = tf.where(norm > 0, norm, tf.ones_like(norm))
        scaled = tf.abs(x) / tf.gather(safe, ids) * self.levels
        noise = tf.random.stateless_uniform(tf.shape(x), seeds["local"])
        level = tf.floor(scaled + noise)  # E[level] = scaled: unbiased
        return tf.cast(tf.sign(x) * level, tf.int8), norm

    def decode(self, payload, layout, seeds):
        level, norm = payload
        return tf.cast(level, tf.float32) * tf.gather(norm, layout.segment_ids()) / self.levels

    def payload_bytes(self, layout):
        return layout.size + 4 * layout.num_segments


class Sign(Compressor):
    """1 bit per value (bit-packed), scaled per tensor by mean |x|.

    Seide et al. 2014, "1-bit stochastic gradient descent"; Bernstein et al. 2018,
    "signSGD". Biased: use it with error feedback.
    """

    name, collective = "sign", "gather"
    _WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)  # bit i of a byte

    def encode(self, x, layout, seeds):
        ids = layout.segment_ids()
        scale = tf.math.segment_mean(tf.abs(x), ids)
        bits = tf.cast(x >= 0, tf.int32)
        bits = tf.pad(bits, [[0, -layout.size % 8]])
        packed = tf.reduce_sum(tf.reshape(bits, [-1, 8]) * tf.constant(self._WEIGHTS), axis=1)
        return tf.cast(packed, tf.uint8), scale

    def decode(self, payload, layout, seeds):
        packed, scale = payload
        weights = tf.constant(self._WEIGHTS)
        bits = tf.bitwise.bitwise_and(tf.cast(packed, tf.int32)[:, None], weights) > 0
        signs = tf.where(tf.reshape(bits, [-1])[:layout.size], 1.0, -1.0)
        return signs * tf.gather(scale, layout.segment_ids())

    def payload_bytes(self, layout):
        return math.ceil(layout.size / 8) + 4 * layout.num_segments


class TopK(Compressor):
    """The `ratio` largest-magnitude values of the buffer, with their int32 indices."""

    name, collective = "topk", "gather"

    def __init__(self, ratio=0.01):
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1]. Received: ratio={ratio}")
        self.ratio = ratio

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

    name, collective = "randomk", "sum"

    def __init__(self, ratio=0.01, unbiased=True):
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1]. Received: ratio={ratio}")
        self.ratio, self.unbiased = ratio, unbiased

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
    """Marker for PowerSGD (rank `rank`); its exchange is in `powersgd.py`."""

    name, collective = "powersgd", "powersgd"

    def __init__(self, rank=4):
        if rank < 1:
            raise ValueError(f"rank must be >= 1. Received: rank={rank}")
        self.rank = rank


def _num_replicas():
    context = tf.distribute.get_replica_context()
    return context.num_replicas_in_sync if context is not None else 1
