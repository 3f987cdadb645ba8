"""Tensor fusion: many gradients packed into one flat buffer, and back.

Like Horovod's tensor fusion, so that fifty small tensors are one collective, not fifty.
`Layout` records the static shapes. With `align` > 1 every tensor starts on a block of
`align` values (zero padded), so per-tensor statistics — the scales of int8, qsgd and
sign — are reductions over whole blocks, and a scale reaches its values by broadcasting
over a `[blocks, align]` view instead of a gather per value (3x cheaper on the UNet).
"""

import dataclasses

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static shapes of the tensors packed in one buffer, in order, each padded to a
    multiple of `align` values."""

    shapes: tuple
    align: int = 1

    @property
    def sizes(self):
        """Values of each tensor, without padding."""
        return tuple(int(np.prod(s)) for s in self.shapes)

    @property
    def padded_sizes(self):
        return tuple(-(-n // self.align) * self.align for n in self.sizes)

    @property
    def size(self):
        """Length of the buffer, padding included."""
        return sum(self.padded_sizes)

    @property
    def num_segments(self):
        return len(self.shapes)

    def blocks(self, buffer):
        """The buffer viewed as [blocks, align]; no block spans two tensors."""
        return tf.reshape(buffer, [-1, self.align])

    def block_ids(self):
        """int32 [blocks]: which tensor each block belongs to (sorted)."""
        counts = [n // self.align for n in self.padded_sizes]
        return tf.constant(np.repeat(np.arange(len(counts)), counts), tf.int32)

    def padding_mask(self):
        """float32 [blocks, align]: 1 on values, 0 on padding."""
        mask = np.concatenate([np.arange(p) < n for n, p in zip(self.sizes, self.padded_sizes)]
                              or [np.zeros(0, bool)])
        return tf.constant(mask.reshape(-1, self.align), tf.float32)


def tensor_max(blocks, layout):
    """Per-tensor maximum of a [blocks, align] view."""
    return tf.math.unsorted_segment_max(tf.reduce_max(blocks, axis=1), layout.block_ids(),
                                        layout.num_segments)


def tensor_sum(blocks, layout):
    """Per-tensor sum of a [blocks, align] view."""
    return tf.math.unsorted_segment_sum(tf.reduce_sum(blocks, axis=1), layout.block_ids(),
                                        layout.num_segments)


def per_block(per_tensor, layout):
    """A per-tensor statistic as [blocks, 1], ready to broadcast over the blocks."""
    return tf.gather(per_tensor, layout.block_ids())[:, None]


def pack(tensors, align=1):
    """(float32 flat buffer, Layout) of `tensors` (IndexedSlices are densified)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    layout = Layout(tuple(tuple(t.shape.as_list()) for t in tensors), align)
    if not tensors:
        return tf.zeros([0], tf.float32), layout
    parts = []
    for t, n, p in zip(tensors, layout.sizes, layout.padded_sizes):
        parts.append(tf.reshape(tf.cast(t, tf.float32), [-1]))
        if p > n:
            parts.append(tf.zeros([p - n], tf.float32))
    return tf.concat(parts, 0), layout


def unpack(buffer, layout, dtypes=None):
    """The tensors of `layout` from a flat buffer (cast back to `dtypes` if given)."""
    parts = tf.split(buffer, layout.padded_sizes) if layout.shapes else []
    tensors = [tf.reshape(part if n == p else part[:n], s) for part, n, p, s
               in zip(parts, layout.sizes, layout.padded_sizes, layout.shapes)]
    if dtypes is not None:
        tensors = [tf.cast(t, d) for t, d in zip(tensors, dtypes)]
    return tensors
