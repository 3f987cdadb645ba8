"""What tfdist adds to one replica step, in one process: the tutorial's custom UNet step
on MirroredStrategy over 2 logical CPUs, with Keras' Adam under `tf.function` against
`tfdist.keras.DistributedOptimizer(Adam, "none")` under `tfdist.function`, in
alternating blocks (both see the same machine at the same moment), from the same
initial weights. No network: what is left is graph work.

    python benchmarks/step_overhead.py [--pairs 16] [--block 8] [--out benchmarks/results]

Writes step_overhead.json (each block's median step time, per loop) and its plot
(step_overhead.png), and prints the overhead with a 95% interval over the pairs (t
distribution of the paired differences). The multi-worker measurement is overhead.py.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "unet_segmentation"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from model import unet  # noqa: E402

T95 = {4: 3.182, 8: 2.365, 12: 2.201, 16: 2.131, 24: 2.069, 32: 2.040}


def interval(differences):
    """Mean and 95% half-width of paired differences (t distribution)."""
    n = len(differences)
    t = T95.get(n - 1, T95[min(T95, key=lambda k: abs(k - (n - 1)))])
    return statistics.mean(differences), t * statistics.stdev(differences) / n ** 0.5


def make_step(strategy, model, optimizer, distributed):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum_over_batch_size")

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) / strategy.num_replicas_in_sync
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    def step(x, y):
        return strategy.run(replica_step, args=(x, y))

    if distributed:
        return tfdist.function(step, model=model, optimizer=optimizer)
    return tf.function(step)


def unet_steps(batch_size, image_size, classes, make_model):
    """({"plain": Keras' Adam step, "tfdist": `DistributedOptimizer(Adam, "none")`'s},
    the strategy, a fixed batch): MirroredStrategy on 2 logical CPUs, the same initial
    weights (`make_model()` after the same seed), steps not traced yet."""
    strategy = tfdist.get_strategy("mirrored", logical_cpus=2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch_size, image_size, image_size, 3)).astype("float32")
    y = rng.integers(0, classes, size=(batch_size, image_size, image_size))
    batch = next(iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors((x, y)))))
    steps = {}
    for name, distributed in (("plain", False), ("tfdist", True)):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model, optimizer = make_model(), keras.optimizers.Adam(1e-3)
            if distributed:
                optimizer = tfdist.keras.DistributedOptimizer(optimizer, "none")
            optimizer.build(model.trainable_variables)
        steps[name] = make_step(strategy, model, optimizer, distributed)
    return steps, strategy, batch


def plot(blocks, path):
    """Each block's median step time, per loop, in the order they ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name, seconds in blocks.items():
        ax.plot(range(1, len(seconds) + 1), [1000 * s for s in seconds], marker="o",
                markersize=3, label=name)
    ax.set_xlabel("pair of blocks")
    ax.set_ylabel("median step (ms)")
    ax.set_title("one process, 2 logical CPUs: Keras' Adam against tfdist's pass-through")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    steps, strategy, batch = unet_steps(args.batch_size, args.image_size, 3,
                                        lambda: unet(args.image_size, 3))
    for step in steps.values():
        for _ in range(3):  # trace and warm up
            step(*batch)
    blocks = {name: [] for name in steps}
    for pair in range(args.pairs):
        order = list(steps) if pair % 2 == 0 else list(reversed(list(steps)))
        for name in order:
            seconds = []
            for _ in range(args.block):
                began = time.perf_counter()
                tf.nest.map_structure(lambda t: t.numpy(), strategy.experimental_local_results(
                    steps[name](*batch)))
                seconds.append(time.perf_counter() - began)
            blocks[name].append(statistics.median(seconds))
    ratios = [t / p - 1 for t, p in zip(blocks["tfdist"], blocks["plain"])]
    mean, half = interval(ratios)
    result = {"blocks": blocks, "overhead": mean, "half_width_95": half,
              "plain_median_seconds": statistics.median(blocks["plain"]),
              "tfdist_median_seconds": statistics.median(blocks["tfdist"])}
    path = pathlib.Path(args.out) / "step_overhead.json"
    path.write_text(json.dumps(result, indent=1))
    plot(blocks, path.with_suffix(".png"))
    print(f"plain {result['plain_median_seconds']:.4f} s/step, tfdist "
          f"{result['tfdist_median_seconds']:.4f}: {mean:+.1%} (95% interval "
          f"{mean - half:+.1%} to {mean + half:+.1%}) over {args.pairs} pairs -> {path}")


if __name__ == "__main__":
    main()
