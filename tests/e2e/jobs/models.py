"""Models and data shared by the strategy tests and the jobs they launch."""

import keras
import numpy as np
import tensorflow as tf

IMAGE, CLASSES = 8, 3


def images(n, seed=0):
    """Seeded images whose class is the brightest of three image regions."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, IMAGE, IMAGE, 1)).astype("float32")
    y = rng.integers(0, CLASSES, size=n).astype("int32")
    for i, c in enumerate(y):
        x[i, :, c * 2:c * 2 + 3, 0] += 1.5
    return x, y


def conv_model(seed=0, batchnorm=True, dropout=0.2):
    """Conv + BatchNormalization + Dropout: the layers that break distributed Keras 3."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((IMAGE, IMAGE, 1)), keras.layers.Conv2D(8, 3, activation="relu")]
    if batchnorm:
        layers.append(keras.layers.BatchNormalization())
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers += [keras.layers.Flatten(), keras.layers.Dense(CLASSES)]
    return keras.Sequential(layers)


def dict_model(seed=0):
    """A functional model fed a dict: {"image": ..., "bias": ...}."""
    keras.utils.set_random_seed(seed)
    image = keras.Input((IMAGE, IMAGE, 1), name="image")
    bias = keras.Input((1,), name="bias")
    h = keras.layers.Conv2D(4, 3, activation="relu")(image)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Dropout(0.1)(keras.layers.Flatten()(h))
    h = keras.layers.Concatenate()([h, bias])
    return keras.Model({"image": image, "bias": bias}, keras.layers.Dense(CLASSES)(h))


def dataset(n, batch, seed=0, dict_inputs=False, repeat=False):
    """`images` as a dataset of global batches, in a fixed order."""
    x, y = images(n, seed)
    features = {"image": x, "bias": np.ones((n, 1), "float32")} if dict_inputs else x
    data = tf.data.Dataset.from_tensor_slices((features, y))
    return (data.repeat() if repeat else data).batch(batch)


def split_in_one_worker(rows, replicas):
    """How TF splits a global batch between one worker's replicas (`rebatch`): into
    consecutive parts, the first ``rows % replicas`` of them one row longer."""
    return [rows // replicas + (r < rows % replicas) for r in range(replicas)]


def split_between_workers(rows, workers):
    """How TF splits a global batch between workers of one replica each (measured on TF
    2.21: auto-sharding by data): consecutive parts of ``ceil(rows / workers)`` rows, the
    last one what is left (30 rows on 4 workers: 8, 8, 8, 6)."""
    part = -(-rows // workers)
    return [min(part, max(0, rows - w * part)) for w in range(workers)]


def replica_share_weights(n, batch, replicas, split=split_in_one_worker):
    """Per-row sample weights under which one device trains as `replicas` replicas do on
    global batches of `batch` rows that do not split evenly.

    `split` gives the rows of each replica's part of a global batch of b rows; each
    replica's loss is the mean over its own rows and counts 1/replicas, so a row of a
    part of n_r rows weighs b / (replicas * n_r) in the mean over the global batch.
    """
    weights = []
    for start in range(0, n, batch):
        b = min(batch, n - start)
        for rows in split(b, replicas):
            weights += [b / (replicas * rows)] * rows
    return np.asarray(weights, "float32")


def weighted_dataset(n, batch, replicas, split=split_in_one_worker, seed=0):
    """`dataset` with `replica_share_weights` as each row's sample weight."""
    weights = replica_share_weights(n, batch, replicas, split)
    return tf.data.Dataset.zip(dataset(n, batch, seed),
                               tf.data.Dataset.from_tensor_slices(weights).batch(batch)).map(
        lambda data, w: (*data, w))


def loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
