"""What weighing each replica by its rows costs: the UNet step on worker processes with and
without it.

With tfdist's exchange a step weighs each replica's gradient by its share of the global
batch's rows (`tfdist/strategies/batch_rows.py`), which needs the rows' sum over the
replicas: one scalar all-reduce a step, issued from the batch alone so that it can run
beside the forward pass. Each worker holds two copies of the UNet (same initial weights)
under one MultiWorkerMirroredStrategy, both routed through tfdist's (empty) pipeline, and
trains them in alternating blocks of steps, once weighed and once not: alternating blocks
in the same processes cancel this 2-core machine's run-to-run spread. The global batch is
one the workers do not divide (the case the weights are for); the unweighed copy trains
as TensorFlow's own strategy weighs it.

    python benchmarks/row_weights_cost.py [--workers 2 --pairs 6 --block 8]

runs the workers with `tfdist launch` and writes
`benchmarks/results/row_weights_cost.{json,md,png}`.
"""

import json
import types

from measure import alternating_blocks
from measure.alternating_blocks import RESULTS, launch_workers, plot_blocks, timed_blocks

NAMES = ("unweighed (each replica's mean)", "weighed by rows (tfdist)")


def worker(args):
    """One worker's part (under TF_CONFIG): alternating blocks; the first writes the json."""
    import keras

    import plain_tf_distribute  # noqa: F401 (puts the UNet example on sys.path)
    import data
    from model import unet

    import tfdist
    from tfdist.strategies import batch_rows

    strategy = tfdist.get_strategy("multi_worker_mirrored", communication="ring")
    train = types.SimpleNamespace(dataset="synthetic", seed=0, image_size=32,
                                  num_examples=4096, batch_size=args.batch)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    steps = {}
    for name in NAMES:
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = unet(32, 4, 16, 3, 0.1)
            optimizer = tfdist.keras.with_gradient_pipeline(
                keras.optimizers.Adam(0.003), tfdist.training.GradientPipeline())
            optimizer.build(model.trainable_variables)
        steps[name] = _step(strategy, model, optimizer, loss_fn, train, data,
                            weighed=name == NAMES[1], batch_rows=batch_rows)

    blocks = timed_blocks({name: (lambda step, iterator: lambda: float(step(next(iterator))))(
        *steps[name]) for name in NAMES}, args.pairs, args.block)
    if strategy.cluster_resolver.task_id == 0:
        with open(args.out, "w") as f:
            json.dump({"workers": args.workers, "global_batch": args.batch,
                       "block_steps": args.block, "block_median_seconds": blocks}, f)


def _step(strategy, model, optimizer, loss_fn, train, data, weighed, batch_rows):
    """(step, iterator): the tutorial's step, its replica function weighed or not."""
    import contextlib

    import tensorflow as tf

    iterator = iter(strategy.distribute_datasets_from_function(data.dataset_fn(train, "train")))

    def replica_step(images, masks):
        with batch_rows.weighing(images) if weighed else contextlib.nullcontext():
            with tf.GradientTape() as tape:
                loss = loss_fn(masks, model(images, training=True))  # 1/replicas share
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(batch):
        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    return step, iterator


def drive(args):
    """Launches the workers, then writes the results and the plot."""
    report(launch_workers(__file__, args.workers, "--workers", args.workers, "--batch",
                          args.batch, "--pairs", args.pairs, "--block", args.block))


def report(raw):
    """Writes row_weights_cost.{json,md,png} from the workers' raw block times."""
    import numpy as np

    blocks = raw["block_median_seconds"]
    median = {name: float(np.median(values)) for name, values in blocks.items()}
    pairs = [w / u - 1 for u, w in zip(blocks[NAMES[0]], blocks[NAMES[1]])]
    summary = {"step_seconds": median, "overhead_median": float(np.median(pairs)),
               "overhead_per_pair": pairs, **raw}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "row_weights_cost.json").write_text(json.dumps(summary, indent=1))
    lines = ["# Cost of weighing each replica by its rows", "",
             f"UNet (32x32), a global batch of {raw['global_batch']} over {raw['workers']} "
             "worker processes (one core each, on one 2-core machine, loopback); "
             f"{len(pairs)} alternating pairs of {raw['block_steps']}-step blocks "
             "(`benchmarks/row_weights_cost.py`).", "",
             "| | median step time |", "|---|---|"]
    lines += [f"| {name} | {seconds * 1e3:.1f} ms |" for name, seconds in median.items()]
    lines += ["", f"Weighed against unweighed: {summary['overhead_median']:+.1%} (median of the "
              f"pairs; single pairs {min(pairs):+.1%} to {max(pairs):+.1%}): one scalar "
              "all-reduce of the rows a step, issued from the batch alone, and one multiply "
              "per gradient."]
    (RESULTS / "row_weights_cost.md").write_text("\n".join(lines) + "\n")
    plot_blocks(blocks, "UNet step: each replica weighed by its rows, or not", "row_weights_cost")
    print("\n".join(lines))


def arguments(parser):
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="the global batch")


if __name__ == "__main__":
    alternating_blocks.main(__doc__, worker, drive, arguments)
