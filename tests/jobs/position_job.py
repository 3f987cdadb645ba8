"""The input position across a preemption on real workers (tests/test_input_position.py):
a UNet-style input — `distribute_datasets_from_function`, each worker its shard,
`repeat()` with `steps_per_epoch` — and a model that records the ids of the rows each
replica trains (<out>/records-<task>.txt, appended to across a relaunch). With
`--preempt E,B` worker:2 SIGTERMs itself after step B of epoch E (once: <out>/preempted);
at the end each task writes its weights to <out>/weights-<task>.npz."""

import argparse
import json
import os
import signal
import sys

import numpy as np

import tfdist

#: 4 workers: a shard of 12 rows each, 3 batches of 4 a pass, 4 steps an epoch (so an
#: epoch begins inside a pass: where the iterator stands matters)
ROWS, BATCH, STEPS, EPOCHS = 48, 4, 4, 3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--preempt", type=lambda text: tuple(int(v) for v in text.split(",")))
    args = p.parse_args()
    import keras
    import tensorflow as tf

    from tfdist.core.preemption import skipping

    strategy = tfdist.get_strategy("multi_worker_mirrored")
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    me = f"{task['type']}-{task['index']}"
    records = open(os.path.join(args.out, f"records-{me}.txt"), "a")

    def note(values):
        records.write(" ".join(map(str, sorted(values.numpy().tolist()))) + "\n")
        records.flush()
        return np.int64(0)

    class Record(keras.layers.Layer):
        def call(self, inputs, training=None):
            features, ids = inputs
            if training:
                with tf.control_dependencies([tf.py_function(note, [ids], tf.int64)]):
                    features = tf.identity(features)
            return features

    keras.utils.set_random_seed(0)
    with strategy.scope():
        features = keras.Input((4,), name="x")
        ids = keras.Input((), dtype="int64", name="id")
        model = keras.Model([features, ids],
                            keras.layers.Dense(1)(Record()([features, ids])))
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), "none"),
                      "mse")

    def dataset_fn(context):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(ROWS, 4)).astype("float32")
        y = (x @ np.arange(1, 5, dtype="float32"))[:, None]
        data = tf.data.Dataset.from_tensor_slices(({"x": x, "id": np.arange(ROWS)}, y))
        data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        return data.batch(BATCH, drop_remainder=True).repeat()

    class PreemptOnce(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            marker = os.path.join(args.out, "preempted")
            if (args.preempt and me == "worker-2" and (self.epoch, batch) == args.preempt
                    and not skipping(self.model, self.epoch, batch)
                    and not os.path.exists(marker)):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGTERM)

    callbacks = [PreemptOnce()]
    if args.preempt:
        callbacks.append(tfdist.callbacks.BackupAndRestore(os.path.join(args.out, "backup")))
    model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=EPOCHS,
              steps_per_epoch=STEPS, verbose=0, callbacks=callbacks)
    np.savez(os.path.join(args.out, f"weights-{me}.npz"), *[w.numpy() for w in model.weights])
    tfdist.strategies.barrier(strategy)


if __name__ == "__main__":
    sys.exit(main())
