"""The UNet example's training with plain tf.distribute — no tfdist in the process.

The baseline of the benchmarks: `tf.distribute.MultiWorkerMirroredStrategy` and the
custom training loop of TensorFlow's own tutorial (Keras 3 `model.fit` does not run on
multi-worker strategies out of the box), on the same model, data, hyper-parameters and
per-step metrics (loss, pixel accuracy, mean IoU) as `examples/unet_segmentation`. Run it under any launcher that sets TF_CONFIG:

    tfdist launch job.yaml -- python benchmarks/plain_tf_distribute.py --output_dir out

The first worker writes metrics.json with the same fields the UNet example writes for
the benchmarks (seconds_per_step, timeline, final loss).
"""

import argparse
import json
import os
import pathlib
import sys
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "unet_segmentation"
sys.path.insert(0, str(EXAMPLE))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import data  # noqa: E402  (the example's input pipeline: plain tf.data)
import metrics  # noqa: E402  (two Keras metrics)
from model import unet  # noqa: E402


def loopback_bytes():
    try:
        with open("/proc/net/dev") as f:
            return int(next(l for l in f if l.strip().startswith("lo:")).split(":", 1)[1].split()[0])
    except (OSError, StopIteration):
        return None


def train_step(strategy, model, optimizer, loss_fn, train, function=tf.function):
    """(step, iterator): the tutorial's custom training step with the example's metrics
    (returns the loss summed over replicas) compiled by `function`, and an iterator over
    `train`'s batches."""
    with strategy.scope():
        tracked = [keras.metrics.Mean(name="loss"), *metrics.segmentation_metrics(4)]
    iterator = iter(strategy.distribute_datasets_from_function(data.dataset_fn(train, "train")))

    def step(batch):
        def replica_step(images, masks):
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = loss_fn(masks, logits)  # 1/replicas share
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            tracked[0].update_state(loss * strategy.num_replicas_in_sync)
            for metric in tracked[1:]:
                metric.update_state(masks, logits)
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    return function(step), iterator


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=0.003)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    train = types.SimpleNamespace(dataset="synthetic", seed=args.seed, image_size=args.image_size,
                                  num_examples=4096, batch_size=args.batch_size)
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = unet(args.image_size, 4, 16, 3, 0.1)
        optimizer = keras.optimizers.Adam(args.learning_rate)
    step, iterator = train_step(strategy, model, optimizer,
                                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                train)

    start, seconds, timeline = time.time(), [], []
    for _ in range(args.steps):
        began = time.perf_counter()
        loss = float(step(next(iterator)))
        seconds.append(time.perf_counter() - began)
        timeline.append((round(time.time() - start, 3), loss, loopback_bytes()))
    task = strategy.cluster_resolver.task_id if strategy.cluster_resolver else 0
    if task == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        losses = [t[1] for t in timeline]
        with open(os.path.join(args.output_dir, "metrics.json"), "w") as f:
            json.dump({"seconds_per_step": float(np.median(seconds)), "timeline": timeline,
                       "final": {"loss": float(np.mean(losses[-10:]))},
                       "replicas": strategy.num_replicas_in_sync}, f)


if __name__ == "__main__":
    main()
