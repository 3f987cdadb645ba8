"""TensorFlow's "Distributed training with Keras" tutorial, as written, with its callbacks
swapped for tfdist's, under MultiWorkerMirroredStrategy (run under `tfdist launch`).

The tutorial's steps: the strategy; the data (MNIST there: seeded images here, no
download); the model built and compiled in `strategy.scope()`; TensorBoard,
ModelCheckpoint (weights each epoch), a learning-rate decay and its printer as callbacks;
`fit`; then, right after it, `load_weights` of the latest checkpoint and `evaluate`.

    keras_tutorial_job.py --out DIR [--epochs N] [--slow_last_write SECONDS]

`--slow_last_write`: the chief writes its last checkpoint SECONDS late (a slow disk), so
that a worker leaving `fit` before the chief's write is complete reads an older one.
Each task writes DIR/<type>-<index>.json: the checkpoint it loaded, its evaluation, the
loaded weights' checksum and (the chief) its weights at the end of fit.
"""

import argparse
import glob
import json
import os
import re
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from models import images  # noqa: E402

BUFFER_SIZE, BATCH_SIZE_PER_REPLICA = 256, 32


def make_model():
    """The tutorial's model (its 28x28 MNIST images are 8x8 here)."""
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10)])


def eval_data():
    return images(128, seed=1)


def decay(epoch):
    return 1e-3 if epoch < 3 else 1e-4


class PrintLR(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"Learning rate for epoch {epoch + 1} is "
              f"{float(self.model.optimizer.learning_rate.numpy())}", flush=True)


class SlowLastWrite(keras.callbacks.Callback):
    """Before ModelCheckpoint: on the chief, the last epoch's end (and so its write) waits."""

    def __init__(self, seconds, epochs):
        super().__init__()
        self.seconds, self.epochs = seconds, epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epochs and tfdist.is_chief():
            time.sleep(self.seconds)


def latest_checkpoint(checkpoint_dir):
    """The newest `ckpt_{epoch}.weights.h5` (tf.train.latest_checkpoint's part in Keras 3)."""
    found = glob.glob(os.path.join(checkpoint_dir, "ckpt_*.weights.h5"))
    return max(found, key=lambda p: int(re.search(r"ckpt_(\d+)", p).group(1)), default=None)


def checksum(model):
    return float(sum(np.abs(w).sum() for w in model.get_weights()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--slow_last_write", type=float, default=0)
    parser.add_argument("--chief_only", action="store_true",
                        help="tfdist's writing callbacks on the chief alone (Horovod's habit)")
    args = parser.parse_args()

    strategy = tfdist.get_strategy("multi_worker_mirrored")  # first: before any dataset
    global_batch = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
    x, y = images(512, seed=0)
    train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).cache().shuffle(
        BUFFER_SIZE, seed=0).batch(global_batch)
    eval_dataset = tf.data.Dataset.from_tensor_slices(eval_data()).batch(global_batch)

    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = make_model()
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=keras.optimizers.Adam(), metrics=["accuracy"])

    checkpoint_dir = os.path.join(args.out, "training_checkpoints")
    checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch}.weights.h5")
    writing = [
        tfdist.callbacks.TensorBoard(log_dir=os.path.join(args.out, "logs")),
        SlowLastWrite(args.slow_last_write, args.epochs),
        tfdist.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
        tfdist.callbacks.CSVLogger(os.path.join(args.out, "log.csv")),
    ]
    chief = tfdist.is_chief(strategy)
    callbacks = [*(writing if chief or not args.chief_only else []),
                 keras.callbacks.LearningRateScheduler(decay), PrintLR()]
    model.fit(train_dataset, epochs=args.epochs, callbacks=callbacks, verbose=0)
    fitted = checksum(model)
    reads = chief or not args.chief_only  # else nothing said the chief's writes are done
    latest = latest_checkpoint(checkpoint_dir) if reads else None
    if reads:
        model.load_weights(latest)
    eval_loss, eval_acc = model.evaluate(eval_dataset, verbose=0)
    task_type, task_id = tfdist.strategies.task_of()
    result = {"loaded": latest and os.path.basename(latest), "eval_loss": float(eval_loss),
              "eval_accuracy": float(eval_acc), "loaded_checksum": checksum(model),
              "fitted_checksum": fitted, "global_batch": global_batch}
    with open(os.path.join(args.out, f"{task_type}-{task_id}.json"), "w") as f:
        json.dump(result, f)
    print("Eval loss: {}, Eval accuracy: {}".format(eval_loss, eval_acc), flush=True)


if __name__ == "__main__":
    main()
