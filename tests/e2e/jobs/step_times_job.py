"""A multi-worker job with one worker slowed on purpose, its step times reported
(`tfdist.callbacks.StepTimes`), under `tfdist launch`:

    python step_times_job.py OUT --loop fit|trainer --slow INDEX --sleep SECONDS

trains a small conv model for 2 epochs of 6 steps; the worker of index INDEX sleeps
SECONDS in each forward pass (a layer that sleeps: the slow computer of a job). Writes <out>/<type>-<index>.json: its history, the clock's totals, and the
wall time of each of its steps measured by the host (`time.perf_counter` between batch
ends, the first of each epoch excepted).
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from models import conv_model, dataset, loss  # noqa: E402
from tfdist.seam.optimizer import pipeline_of  # noqa: E402
from tfdist.seam.owned import named_optimizers  # noqa: E402
from tfdist.step.step_clock import worker_index  # noqa: E402
from tfdist.strategies.task import task_of  # noqa: E402

STEPS, EPOCHS, BATCH = 6, 2, 16


class Sleep(keras.layers.Layer):
    """The identity, after sleeping `seconds` in each call (in the step's graph)."""

    def __init__(self, seconds, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def call(self, x):
        slept = tf.py_function(lambda: time.sleep(self.seconds) or 0.0, [], tf.float32)
        return x + tf.cast(0.0 * tf.reshape(slept, []), x.dtype)

    def compute_output_shape(self, shape):
        return shape


class Walls(keras.callbacks.Callback):
    """Each step's wall time on this worker, between batch ends (the host's clock)."""

    def __init__(self):
        super().__init__()
        self.ends, self.walls = None, []

    def on_epoch_begin(self, epoch, logs=None):
        self.ends = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self.ends is not None:
            self.walls.append(now - self.ends)
        self.ends = now


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--loop", default="fit")
    parser.add_argument("--slow", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--compression", default="none")
    args = parser.parse_args()
    strategy = tfdist.strategies.get_strategy("multi_worker_mirrored")
    me = worker_index(strategy)
    walls = Walls()
    callbacks = [walls, tfdist.callbacks.StepTimes(every_steps=args.every, persistence=2)]
    data = dataset(STEPS * BATCH, BATCH)
    with strategy.scope():
        net = conv_model(seed=3, batchnorm=False, dropout=0)
        model = keras.Sequential([keras.Input(net.input_shape[1:]),
                                  Sleep(args.sleep if me == args.slow else 0.0), net])
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), args.compression)
    if args.loop == "fit":
        with strategy.scope():
            model.compile(optimizer, loss())
        history = model.fit(data, epochs=EPOCHS, verbose=0,
                            callbacks=[tfdist.callbacks.TrainingHooks(), *callbacks])
    else:
        trainer = tfdist.Trainer(model, optimizer, loss(), strategy=strategy)
        history = trainer.fit(data, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    task_type, task_id = task_of(strategy)
    with open(os.path.join(args.out, f"{task_type}-{task_id}.json"), "w") as f:
        json.dump({"index": me, "history": history.history, "walls": walls.walls,
                   "totals": pipeline_of(named_optimizers(model)[0][1]).clock.totals()}, f)


if __name__ == "__main__":
    main()
