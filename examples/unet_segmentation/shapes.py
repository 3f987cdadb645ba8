"""A synthetic segmentation dataset: shapes on textured backgrounds, made with tf.data.

Every example is a pure function of (seed, index) through stateless random ops, so the
data are identical on every run and every machine, need no download, and shard without
overlap by sharding the indices. Classes: 0 background, 1 circle, 2 square, 3 triangle;
shape colours are random, so a model must learn the shapes, not their colours.
"""

import math

import tensorflow as tf

CLASSES = ("background", "circle", "square", "triangle")
SPLIT_OFFSET = {"train": 0, "validation": 1 << 30}
SHAPES_PER_IMAGE = 2


def example(seed, index, image_size):
    """(image float32 [s, s, 3] in [0, 1], mask int32 [s, s]) for one index."""
    seeds = tf.random.experimental.stateless_split(
        tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)]), 3 + SHAPES_PER_IMAGE)
    size = image_size
    grid = tf.range(size, dtype=tf.float32) / size
    yy, xx = tf.meshgrid(grid, grid, indexing="ij")
    image = _texture(seeds[0], xx, yy) * _colour(seeds[1], 0.3, 0.9)
    image += 0.05 * tf.random.stateless_normal([size, size, 3], seeds[2])
    mask = tf.zeros([size, size], tf.int32)
    for k in range(SHAPES_PER_IMAGE):
        label, inside = _shape(seeds[3 + k], xx, yy)
        mask = tf.where(inside, label, mask)
        colour = _colour(tf.random.experimental.stateless_fold_in(seeds[3 + k], 7), 0.0, 1.0)
        image = tf.where(inside[..., None], colour + 0.05 * image, image)
    return tf.clip_by_value(image, 0.0, 1.0), mask


def _texture(seed, xx, yy):
    """Random stripes and blobs: two sinusoids of random frequency, phase and direction."""
    p = tf.random.stateless_uniform([6], seed, 0.0, 1.0)
    f1, f2 = 2.0 + 8.0 * p[0], 2.0 + 8.0 * p[1]
    a1, a2 = math.pi * p[2], math.pi * p[3]
    wave = (tf.sin(2 * math.pi * f1 * (xx * tf.cos(a1) + yy * tf.sin(a1)) + 6.28 * p[4])
            + tf.sin(2 * math.pi * f2 * (xx * tf.cos(a2) + yy * tf.sin(a2)) + 6.28 * p[5]))
    return (0.5 + 0.2 * wave)[..., None]


def _colour(seed, low, high):
    return tf.random.stateless_uniform([3], seed, low, high)


def _shape(seed, xx, yy):
    """(class label, boolean mask) of one random shape."""
    p = tf.random.stateless_uniform([4], seed, 0.0, 1.0)
    label = 1 + tf.cast(p[0] * 3, tf.int32)
    cx, cy = 0.2 + 0.6 * p[1], 0.2 + 0.6 * p[2]
    r = 0.15 + 0.13 * p[3]
    dx, dy = xx - cx, yy - cy
    circle = dx ** 2 + dy ** 2 <= r ** 2
    square = tf.logical_and(tf.abs(dx) <= 0.85 * r, tf.abs(dy) <= 0.85 * r)
    triangle = tf.logical_and(tf.abs(dy) <= r, tf.abs(dx) <= 0.6 * (dy + r))
    inside = tf.gather(tf.stack([circle, square, triangle]), label - 1)
    return label, inside


def shapes_dataset(seed, image_size, split="train", num_examples=4096, shard=(1, 0)):
    """The examples of one split, in order, for shard `shard` = (count, index) of them.

    Args:
        seed: the data seed; the same seed gives the same data.
        image_size: height and width in pixels.
        split: "train" or "validation" (disjoint index ranges).
        num_examples: examples in the split.
        shard: (number of shards, this shard's index); shards do not overlap.
    """
    if split not in SPLIT_OFFSET:
        raise ValueError(f"split must be one of {list(SPLIT_OFFSET)}. Received: split={split!r}")
    start = SPLIT_OFFSET[split]
    indices = tf.data.Dataset.range(start, start + num_examples).shard(*shard)
    return indices.map(lambda i: example(seed, i, image_size),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
