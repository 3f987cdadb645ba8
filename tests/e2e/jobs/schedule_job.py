"""A job for tests/unit/keras/test_optimizer_objects.py, run under `tfdist launch` on 2 workers.

Each worker trains the same small model four times under MultiWorkerMirroredStrategy,
each from the same initial weights on its own rows: with Keras' own Adam and with
`tfdist.keras.DistributedOptimizer` around it, for two learning rates Keras cannot re-make
from a config — keras-io's GPT-2 recipe (`PolynomialDecay` whose `decay_steps` is a tensor,
`ds.cardinality() * epochs`) and a `LearningRateSchedule` without `get_config`. It writes
`<out>/<type>-<index>.npz` (each run's final weights, `<run>/<i>`) and a `.json` (each run's
step count and the last learning rate).
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402

PER_REPLICA, STEPS, EPOCHS = 16, 3, 2


class InverseTime(keras.optimizers.schedules.LearningRateSchedule):
    """A user's schedule without `get_config` (Keras trains with it, cannot save it)."""

    def __call__(self, step):
        return 0.01 / (1.0 + tf.cast(step, "float32"))


def rows(worker):
    rng = np.random.default_rng(20 + worker)
    x = rng.normal(size=(PER_REPLICA * STEPS, 6)).astype("float32")
    return x, (x @ np.linspace(-1, 1, 6).astype("float32"))[:, None]


def schedule(name, worker):
    if name == "custom":
        return InverseTime()
    local = tf.data.Dataset.from_tensor_slices(rows(worker)).batch(PER_REPLICA)
    return keras.optimizers.schedules.PolynomialDecay(  # keras-io's GPT-2 recipe
        5e-5, decay_steps=local.cardinality() * EPOCHS, end_learning_rate=0.0)


def train(strategy, worker, kind, name):
    with strategy.scope():
        keras.utils.set_random_seed(7)
        inputs = keras.Input((6,))
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))
        optimizer = keras.optimizers.Adam(schedule(name, worker))
        if kind == "tfdist":
            wrapped = tfdist.keras.DistributedOptimizer(optimizer)
            assert wrapped is optimizer and wrapped._learning_rate is optimizer._learning_rate
            optimizer = wrapped
        model.compile(optimizer, "mse")

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices(rows(worker)).batch(PER_REPLICA)

    data = strategy.distribute_datasets_from_function(dataset_fn)
    model.fit(data, epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
    step = int(optimizer.iterations.numpy())
    return ([v.numpy() for v in model.weights],
            {"steps": step, "rate": float(optimizer._learning_rate(step - 1))})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = tfdist.get_strategy("multi_worker_mirrored")
    task_type, worker = tfdist.strategies.task_of(strategy)
    arrays, report = {}, {}
    for name in ("poly", "custom"):
        for kind in ("plain", "tfdist"):
            weights, report[f"{kind}-{name}"] = train(strategy, worker, kind, name)
            arrays.update({f"{kind}-{name}/{i}": w for i, w in enumerate(weights)})
    stem = os.path.join(args.out, f"{task_type}-{worker}")
    np.savez(stem + ".npz", **arrays)
    with open(stem + ".json", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    sys.exit(main())
