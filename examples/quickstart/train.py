"""Quickstart: a small classifier trained across workers with a custom training loop.

Runs under `tfdist launch`, which gives every task its TF_CONFIG:

    tfdist launch configs/quickstart.yaml -- \
        python examples/quickstart/train.py --config configs/quickstart.yaml

The data are synthetic and seeded (points labelled by a fixed random linear map), so
every run is reproducible. Each worker reads its own shard; `tfdist.Trainer` runs the
`tf.GradientTape` loop and MultiWorkerMirroredStrategy all-reduces the gradients. The
chief prints the loss per epoch and writes `metrics.json`; every worker prints a
checksum of its final weights, which must agree.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags, logging  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from problem import make_model, synthetic_dataset  # noqa: E402

flags.DEFINE_string("config", "configs/quickstart.yaml", "tfdist config file")
flags.DEFINE_string("output_dir", None, "where the chief writes metrics.json (optional)")
flags.DEFINE_integer("epochs", None, "override train.epochs")
flags.DEFINE_string("backup_dir", None, "override train.backup_dir: back up every epoch there "
                    "(shared by every worker); a preempted or resized run resumes from it")
FLAGS = flags.FLAGS

def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    config = tfdist.load_config(FLAGS.config)
    train = dict(config.section("train", {}))
    epochs = FLAGS.epochs or train.get("epochs", 5)
    steps, batch = train.get("steps_per_epoch", 40), train.get("global_batch_size", 64)
    seed = train.get("seed", 0)
    backup_dir = FLAGS.backup_dir or train.get("backup_dir")

    strategy = tfdist.get_strategy(config)  # MultiWorkerMirroredStrategy from TF_CONFIG

    def dataset_fn(context):
        per_replica = tfdist.strategies.replica_batch_size(context, batch)  # any split
        data = synthetic_dataset(seed).shard(context.num_input_pipelines,
                                             context.input_pipeline_id)
        return data.shuffle(4096, seed=seed).repeat().batch(per_replica, drop_remainder=True)

    with strategy.scope():
        model = make_model(seed)
    trainer = tfdist.Trainer(
        model, keras.optimizers.Adam(train.get("learning_rate", 0.01)),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True), strategy=strategy,
        metrics=["sparse_categorical_accuracy"])
    start = time.time()
    callbacks = [tfdist.callbacks.BackupAndRestore(backup_dir)] if backup_dir else []
    history = trainer.fit(dataset_fn, epochs=epochs, steps_per_epoch=steps, callbacks=callbacks,
                          verbose=2 if tfdist.is_chief(strategy) else 0).history["loss"]

    x, y = next(iter(synthetic_dataset(seed, "test", 2048).batch(2048)))
    accuracy = float(np.mean(np.argmax(model(x, training=False), axis=1) == y.numpy()))
    checksum = float(sum(np.sum(np.abs(v.numpy()).astype("float64")) for v in model.weights))
    print(f"final weights checksum {checksum:.6f}; held-out accuracy {accuracy:.3f}", flush=True)
    if tfdist.is_chief(strategy):
        print(f"loss fell from {history[0]:.4f} to {history[-1]:.4f} in "
              f"{time.time() - start:.1f}s across {strategy.num_replicas_in_sync} replicas",
              flush=True)
        if FLAGS.output_dir:
            os.makedirs(FLAGS.output_dir, exist_ok=True)
            with open(os.path.join(FLAGS.output_dir, "metrics.json"), "w") as f:
                json.dump({"loss": history, "accuracy": accuracy, "checksum": checksum,
                           "replicas": strategy.num_replicas_in_sync,
                           # epochs x steps when each step trained once (across a resize too)
                           "optimizer_steps": int(trainer.optimizer.iterations.numpy())},
                          f, indent=2)


if __name__ == "__main__":
    app.run(main)
