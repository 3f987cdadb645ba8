"""Tensor fusion: many gradients packed into one flat buffer, and back.

Like Horovod's tensor fusion, so that fifty small tensors are one collective, not fifty.
`Layout` records the static shapes; per-tensor statistics (the scales of int8, sign and
qsgd) use `segment_ids`, so fused tensors keep their own scale.
"""

import dataclasses

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static shapes of the tensors packed in one buffer, in order."""

    shapes: tuple

    @property
    def sizes(self):
        return tuple(int(np.prod(s)) for s in self.shapes)

    @property
    def size(self):
        return sum(self.sizes)

    @property
    def num_segments(self):
        return len(self.shapes)

    def segment_ids(self):
        """int32 [size]: which tensor each element of the buffer belongs to."""
        return tf.constant(np.repeat(np.arange(len(self.sizes)), self.sizes), tf.int32)


def pack(tensors):
    """(float32 flat buffer, Layout) of `tensors` (IndexedSlices are densified)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    layout = Layout(tuple(tuple(t.shape.as_list()) for t in tensors))
    if not tensors:
        return tf.zeros([0], tf.float32), layout
    return tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0), layout


def unpack(buffer, layout, dtypes=None):
    """The tensors of `layout` from a flat buffer (cast back to `dtypes` if given)."""
    parts = tf.split(buffer, layout.sizes) if layout.shapes else []
    tensors = [tf.reshape(p, s) for p, s in zip(parts, layout.shapes)]
    if dtypes is not None:
        tensors = [tf.cast(t, d) for t, d in zip(tensors, dtypes)]
    return tensors
