"""A job for tests/unit/keras/test_replica_seeds.py, run under `tfdist launch` on 2 workers: each
worker draws one Dropout mask per row of its share of a global batch of ones, from a plain
Keras Dropout and from one given `tfdist.keras.per_replica_seeds`, and writes them to
`<out>/<type>-<index>.json` as {"plain": rows, "folded": rows}.

    python replica_seeds_job.py OUT
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402

ROWS, FEATURES = 8, 64  # per worker (one replica each)


def masks(strategy, layer):
    """This worker's rows of `layer(ones, training=True) != 0`, as lists of 0/1."""
    def fn(context):
        return tf.data.Dataset.from_tensors(tf.ones((ROWS, FEATURES)))

    batch = next(iter(strategy.distribute_datasets_from_function(fn)))
    out = tf.function(lambda b: strategy.run(lambda v: layer(v, training=True), (b,)))(batch)
    [local] = strategy.experimental_local_results(out)
    return (local.numpy() != 0).astype(int).tolist()


def main():
    strategy = tfdist.get_strategy("multi_worker_mirrored")
    with strategy.scope():
        plain = keras.layers.Dropout(0.5, seed=7)
        folded = tfdist.keras.per_replica_seeds(keras.layers.Dropout(0.5, seed=7))
    result = {"plain": masks(strategy, plain), "folded": masks(strategy, folded)}
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    path = os.path.join(sys.argv[1], f"{task['type']}-{task['index']}.json")
    with open(path, "w") as f:
        json.dump(result, f)
    assert np.array(result["plain"]).shape == (ROWS, FEATURES)


if __name__ == "__main__":
    main()
