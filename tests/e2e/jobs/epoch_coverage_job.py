"""Which examples each worker trains, per epoch, for every kind of input `fit` takes.

Run under `tfdist launch` (multi_worker_mirrored); each task writes
`<out>/<type>-<index>.json`: {kind: {"epochs": [[ids trained by this worker's replica, in
order], ...], "warnings": [tfdist's input-order warnings], "input_order": {...}}}. Every
example carries its id in column 0 of x; the model records it when called to train (by
`fit` and by `tfdist.Trainer`, whose kinds are named "trainer_...").

    --out DIR  --batch GLOBAL_BATCH  --epochs E  --examples N
"""

import argparse
import json
import math
import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.strategies.task import barrier  # noqa: E402

SEEN = []  # the ids this worker's replica trained since the last epoch end


class Recording(keras.Model):
    """Dense on x[:, 1:]; each train step notes the ids in x[:, 0]."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x, training=None):
        if training:  # fit's train step and the Trainer's
            tf.numpy_function(_note, [x[:, 0]], tf.int64)
        return self.dense(x[:, 1:])


def _note(ids):
    SEEN.extend(int(i) for i in ids)
    return np.int64(0)


class ShuffledRows(keras.utils.PyDataset):
    """keras-io's pattern: rows shuffled with NumPy's global generator, again each epoch."""

    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size
        self.rows = np.arange(len(x))
        np.random.shuffle(self.rows)

    def __len__(self):
        return math.ceil(len(self.x) / self.batch_size)

    def __getitem__(self, index):
        rows = self.rows[index * self.batch_size:(index + 1) * self.batch_size]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        np.random.shuffle(self.rows)


class TailShuffledRows(ShuffledRows):
    """The first batch's rows in place, the others shuffled (each worker alike only in the
    first batch: a check of the first batch alone would pass)."""

    def __init__(self, x, y, batch_size):
        super().__init__(x, y, batch_size)
        self.rows = np.arange(len(x))
        self.on_epoch_end()

    def on_epoch_end(self):
        np.random.shuffle(self.rows[self.batch_size:])


def generator(x, y, batch_size):
    """Forever: the rows in a new order each pass (an unseeded generator of its own)."""
    rng = np.random.default_rng()
    while True:
        rows = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            yield x[rows[start:start + batch_size]], y[rows[start:start + batch_size]]


def kinds(x, y, batch, task_index):
    """(name, fit keyword arguments) per input, in the order they run."""
    def tf_data(seed):
        return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed)
                .batch(batch))

    yield "numpy", dict(x=x, y=y, batch_size=batch, shuffle=True)
    yield "numpy_batch", dict(x=x, y=y, batch_size=batch, shuffle="batch")
    yield "generator", dict(x=generator(x, y, batch), steps_per_epoch=math.ceil(len(x) / batch))
    yield "tf_unseeded", dict(x=tf_data(None))
    yield "tf_seeded", dict(x=tf_data(7))
    yield "trainer_tf_unseeded", dict(dataset_or_fn=tf_data(None))
    yield "trainer_tf_seeded", dict(dataset_or_fn=tf_data(7))
    np.random.seed(100 + task_index)  # the workers' NumPy generators differ
    yield "py_dataset_unseeded", dict(x=ShuffledRows(x, y, batch))
    yield "py_dataset_tail", dict(x=TailShuffledRows(x, y, batch), shuffle=False)
    keras.utils.set_random_seed(1234)  # the same on every worker
    yield "py_dataset_seeded", dict(x=ShuffledRows(x, y, batch))


class EpochEnds(keras.callbacks.Callback):
    def __init__(self, epochs):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(list(SEEN))
        SEEN.clear()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--examples", type=int, default=192)
    args = parser.parse_args()
    strategy = tfdist.get_strategy("multi_worker_mirrored")
    task = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
    ids = np.arange(args.examples, dtype="float32")
    x = np.stack([ids, np.linspace(-1, 1, args.examples, dtype="float32")], axis=1)
    y = np.cos(ids)[:, None].astype("float32")
    with strategy.scope():
        model = Recording()
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        own = Recording()  # the Trainer's model
        own.build((None, 2))
    trainer = tfdist.Trainer(own, keras.optimizers.SGD(0.01), "mse", strategy=strategy)
    results = {}
    for name, inputs in kinds(x, y, args.batch, task[1]):
        epochs, before = [], dict(strategy.input_order)
        SEEN.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loop = trainer.fit if name.startswith("trainer") else model.fit
            loop(**inputs, epochs=args.epochs, verbose=0, callbacks=[EpochEnds(epochs)])
        said = [str(w.message) for w in caught if str(w.message).startswith("tfdist: ")]
        counts = {k: v - before.get(k, 0) for k, v in strategy.input_order.items()}
        results[name] = {"epochs": epochs, "warnings": said, "input_order": counts}
    with open(os.path.join(args.out, f"{task[0]}-{task[1]}.json"), "w") as f:
        json.dump(results, f)
    barrier(strategy)  # the chief exits last


if __name__ == "__main__":
    main()
