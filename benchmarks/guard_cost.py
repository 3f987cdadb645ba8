"""What the transactional step costs: the UNet step on 2 worker processes with and without it.

A step is a transaction (`tfdist.step.transaction`): an all-reduced count of the replicas
with a non-finite gradient decides whether it commits, and every update is conditional on
it. The count rides in the step's gradient all-reduce (one more float); only where a step
exchanges nothing (local SGD between averages) is it a scalar all-reduce of its own. Each worker holds two copies of the
UNet (same initial weights) under one MultiWorkerMirroredStrategy and trains them in
alternating blocks of steps with TensorFlow tutorial's custom loop
(`plain_tf_distribute.train_step`): once with plain `keras.optimizers.Adam` (Keras' own
all-reduce, no guard) and once with the same optimizer routed through tfdist with an empty
pipeline (the same all-reduce, plus the guard: finiteness checks, the flag's all-reduce,
the conditional updates). Alternating blocks in the same processes cancel this 2-core
machine's run-to-run spread. It also times the decision alone (finiteness checks of the
UNet's gradients and the scalar all-reduce) in a compiled function of its own.

    python benchmarks/guard_cost.py [--pairs 6 --block 8]

runs the 2 workers with `tfdist launch` (one core each) and writes
`benchmarks/results/guard_cost.{json,md,png}`.
"""

import json
import types

from measure import alternating_blocks
from measure.alternating_blocks import RESULTS, launch_workers, plot_blocks, timed_blocks


def worker(args):
    """One worker's part (under TF_CONFIG): alternating blocks; the first writes the json."""
    import keras
    import tensorflow as tf

    import plain_tf_distribute as plain  # puts the UNet example on sys.path
    from model import unet

    import tfdist
    from tfdist.step import transaction

    strategy = tfdist.get_strategy("multi_worker_mirrored", communication="ring")
    train = types.SimpleNamespace(dataset="synthetic", seed=0, image_size=32,
                                  num_examples=4096, batch_size=32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    steps = {}
    for name in ("no guard (plain Keras)", "transactional (tfdist)"):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = unet(32, 4, 16, 3, 0.1)
            optimizer = keras.optimizers.Adam(0.003)
            if name.startswith("transactional"):
                optimizer = tfdist.keras.with_gradient_pipeline(
                    optimizer, tfdist.training.GradientPipeline())
            optimizer.build(model.trainable_variables)
        steps[name] = plain.train_step(strategy, model, optimizer, loss_fn, train)
    grads = [tf.ones(v.shape) for v in model.trainable_variables]

    @tf.function
    def decide():
        return strategy.run(lambda: transaction.decide(grads).refusals)

    @tf.function
    def dispatch():  # what calling a compiled replica function costs by itself
        return strategy.run(lambda: tf.constant(0.0))

    def train(step, iterator):
        return lambda: float(step(next(iterator)))

    def call(function):
        return lambda: float(strategy.experimental_local_results(function())[0])

    blocks = timed_blocks({**{name: train(*steps[name]) for name in steps},
                           "decision alone": call(decide), "empty function": call(dispatch)},
                          args.pairs, args.block)
    if strategy.cluster_resolver.task_id == 0:
        with open(args.out, "w") as f:
            json.dump({"block_steps": args.block, "block_median_seconds": blocks}, f)


def drive(args):
    """Launches the 2 workers, then writes the results and the plot."""
    report(launch_workers(__file__, 2, "--pairs", args.pairs, "--block", args.block))


def report(raw):
    """Writes guard_cost.{json,md,png} from the workers' raw block times."""
    import numpy as np

    blocks = raw["block_median_seconds"]
    median = {name: float(np.median(values)) for name, values in blocks.items()}
    plain = median["no guard (plain Keras)"]
    pairs = [g / p - 1 for p, g in zip(blocks["no guard (plain Keras)"],
                                       blocks["transactional (tfdist)"])]
    summary = {"step_seconds": median, "overhead_median": float(np.median(pairs)),
               "overhead_per_pair": pairs,
               "decision_share_of_step": median["decision alone"] / plain,
               "decision_net_share_of_step":
                   (median["decision alone"] - median["empty function"]) / plain, **raw}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "guard_cost.json").write_text(json.dumps(summary, indent=1))
    lines = ["# Cost of the transactional step (NaN guard)", "",
             f"UNet (32x32, batch 16 per worker), 2 worker processes, one core each; "
             f"{len(pairs)} alternating pairs of {raw['block_steps']}-step blocks "
             "(`benchmarks/guard_cost.py`).", "",
             "| | median step time |", "|---|---|"]
    lines += [f"| {name} | {seconds * 1e3:.1f} ms |" for name, seconds in median.items()]
    lines += ["", f"Transactional against plain Keras: {summary['overhead_median']:+.1%} (median "
              f"of the pairs; single pairs {min(pairs):+.1%} to {max(pairs):+.1%}): the count "
              "rides in the gradient all-reduce, so the guard adds finiteness checks and "
              "conditional updates, no collective. Where a step has no all-reduce to carry it "
              "(local SGD between averages), the decision alone — finiteness checks of every "
              "gradient and a scalar all-reduce between the 2 processes — takes "
              f"{summary['decision_net_share_of_step']:.1%} of a plain step (net of the "
              f"{median['empty function'] * 1e3:.1f} ms of calling an empty compiled replica "
              "function)."]
    (RESULTS / "guard_cost.md").write_text("\n".join(lines) + "\n")
    plot_blocks(blocks, "UNet step, 2 workers: with and without the transactional step",
                "guard_cost")
    print("\n".join(lines))


if __name__ == "__main__":
    alternating_blocks.main(__doc__, worker, drive)
