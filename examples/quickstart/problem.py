"""The quickstart's problem: seeded synthetic points and a small classifier."""

import keras
import numpy as np
import tensorflow as tf

NUM_FEATURES, NUM_CLASSES = 16, 4


def synthetic_dataset(seed, split="train", num_examples=8192):
    """Gaussian points labelled by argmax of a random linear map fixed by `seed`."""
    w = np.random.default_rng(seed).normal(size=(NUM_FEATURES, NUM_CLASSES)).astype("float32")
    rng = np.random.default_rng([seed, ("train", "test").index(split)])
    x = rng.normal(size=(num_examples, NUM_FEATURES)).astype("float32")
    y = np.argmax(x @ w, axis=1).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y))


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((NUM_FEATURES,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(NUM_CLASSES),
    ])
