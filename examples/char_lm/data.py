"""Windows of the corpus as (bytes, next bytes) pairs, sharded per worker."""

import numpy as np
import tensorflow as tf

import tfdist

import corpus


def windows(text, count, length, seed):
    """`count` windows of `length` + 1 bytes at random places of `text` (seeded)."""
    starts = np.random.default_rng(seed).integers(0, len(text) - length - 1, size=count)
    data = np.frombuffer(text, np.uint8)
    return np.stack([data[s:s + length + 1] for s in starts]).astype(np.int32)


def dataset_fn(lm, split):
    """fn(InputContext) -> per-replica batches of `split`, repeated: every worker reads its
    own share of the same windows (training: new windows every step; validation: a fixed
    set, the same in every run)."""
    text, _ = corpus.read(split)
    if split == "train":
        count, seed = lm.epochs * lm.steps_per_epoch * lm.batch_size, lm.seed
    else:
        count, seed = lm.validation_steps * lm.batch_size, 10_000 + lm.seed
    chunks = windows(text, count, lm.sequence_length, seed)

    def fn(context):
        shard = chunks[context.input_pipeline_id::context.num_input_pipelines]
        data = tf.data.Dataset.from_tensor_slices((shard[:, :-1], shard[:, 1:]))
        batch = tfdist.strategies.replica_batch_size(context, lm.batch_size)  # any split
        return data.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return fn
