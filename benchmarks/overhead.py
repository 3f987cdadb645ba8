"""What tfdist's training loop adds to a step: plain tf.distribute and `tfdist.Trainer` in
the same worker processes, in alternating blocks of steps.

Each worker holds two copies of the UNet (same initial weights) under one
`tf.distribute.MultiWorkerMirroredStrategy`: the custom loop of TensorFlow's tutorial
(`plain_tf_distribute.py`) and `tfdist.Trainer` in pass-through mode (no compression, no
local SGD). They train in turns, `--block` steps each, so both see the same machine, the
same network and the same moment: run-to-run differences of this 2-core machine (10-40%
between single runs) cancel. Run under a launcher that sets TF_CONFIG:

    tfdist launch job.yaml -- python benchmarks/overhead.py --output_dir out

The first worker writes metrics.json: the median step time of each block, per loop;
with --profile, also one more block of each traced by TF's profiler (op_profile.py): wall
and op milliseconds per step, ops run per step, op milliseconds by type.
"""

import argparse
import json
import os
import time
import types

import keras
import numpy as np
import tensorflow as tf

import op_profile
import plain_tf_distribute as plain  # noqa: F401  (puts the example on sys.path)
import data
import metrics
from model import unet

import tfdist


class StepTimer(keras.callbacks.Callback):
    """Each training step's duration (the step returns when its all-reduce is done)."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_train_batch_begin(self, batch, logs=None):
        self.began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds.append(time.perf_counter() - self.began)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--pairs", type=int, default=4, help="measured blocks per loop")
    parser.add_argument("--block", type=int, default=8, help="steps per block")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--bucket_bytes", type=int, default=None,
                        help="tfdist's all-reduce buckets (default: tfdist's default; 0: one)")
    parser.add_argument("--tfdist_loop", choices=["trainer", "own"], default="trainer",
                        help="tfdist's side: tfdist.Trainer.fit per block, or the tutorial's "
                        "own step under tfdist.function on one iterator (as plain's)")
    parser.add_argument("--fresh_input", action="store_true",
                        help="plain's blocks start a new input iterator each (as a fit call does)")
    parser.add_argument("--profile", action="store_true",
                        help="trace one more block of each loop with TF's profiler")
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    train = types.SimpleNamespace(dataset="synthetic", seed=0, image_size=32,
                                  num_examples=4096, batch_size=args.batch_size)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    models, optimizers = [], []
    for _ in range(2):  # the same initial weights
        keras.utils.set_random_seed(0)
        with strategy.scope():
            models.append(unet(32, 4, 16, 3, 0.1))
            optimizers.append(keras.optimizers.Adam(0.003))
        if len(optimizers) == 2:  # tfdist's, routed through its exchange with these buckets
            buckets = {} if args.bucket_bytes is None else {"bucket_bytes": args.bucket_bytes}
            optimizers[1] = tfdist.keras.DistributedOptimizer(
                optimizers[1], "none", strategy=strategy, **buckets)
    plain_step, iterator = plain.train_step(strategy, models[0], optimizers[0], loss_fn, train)
    trainer = tfdist.Trainer(models[1], optimizers[1], loss_fn, strategy=strategy,
                             metrics=metrics.segmentation_metrics(4))

    own_step, own_iterator = plain.train_step(
        strategy, models[1], optimizers[1], loss_fn, train,
        function=lambda step: tfdist.function(step, model=models[1]))

    def steps(step, batches):
        seconds = []
        for _ in range(args.block):
            began = time.perf_counter()
            float(step(next(batches)))
            seconds.append(time.perf_counter() - began)
        return seconds

    def plain_block():
        batches = iterator if not args.fresh_input else iter(
            strategy.distribute_datasets_from_function(data.dataset_fn(train, "train")))
        return steps(plain_step, batches)

    def tfdist_block():
        if args.tfdist_loop == "own":
            return steps(own_step, own_iterator)
        timer = StepTimer()
        trainer.fit(data.dataset_fn(train, "train"), epochs=1, steps_per_epoch=args.block,
                    callbacks=[timer], verbose=0)
        return timer.seconds

    plain_block(), tfdist_block()  # traced steps: not measured
    blocks = {"plain tf.distribute": [], "tfdist": []}
    for _ in range(args.pairs):
        blocks["plain tf.distribute"].append(float(np.median(plain_block())))
        blocks["tfdist"].append(float(np.median(tfdist_block())))
    result = {"block_steps": args.block, "block_median_seconds": blocks,
              "tfdist_loop": args.tfdist_loop, "fresh_input": args.fresh_input}
    if args.profile:  # every worker traces (they meet in each step's collectives)
        result["profile"] = {"plain tf.distribute": op_profile.profile(plain_block, args.block),
                             "tfdist": op_profile.profile(tfdist_block, args.block)}
    if (strategy.cluster_resolver.task_id if strategy.cluster_resolver else 0) == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "metrics.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
