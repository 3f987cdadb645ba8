"""A job for the multi-worker transactional-step test, run under `tfdist launch`.

Every worker trains one good step, then a step in which only one worker's batch holds a NaN,
then a good step again. Each writes `<out>/<type>-<index>.json`: the error the bad step
raised, which parts of its own copy of the state (weights, optimizer slots and iterations,
residuals, Qs, the Trainer's step) the bad step changed, and the final weights and
optimizer state (the same on every worker). Options:

    --loop fit | trainer
    --compression NAME       exchanged with error feedback (none: plain tfdist exchange)
    --clean                  skip the bad step (the reference run)
    --bad_worker K           the worker whose batch holds the NaN (default 1)
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from models import conv_model, images, loss  # noqa: E402
from tfdist.step.variables import underlying  # noqa: E402

PER_REPLICA = 16


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--loop", default="fit")
    p.add_argument("--compression", default="none")
    p.add_argument("--clean", action="store_true")
    p.add_argument("--bad_worker", type=int, default=1)
    p.add_argument("--out", required=True)
    return p.parse_args()


def batches(strategy, worker, bad, bad_worker=1):
    """This worker's batch for one step (`bad`: a NaN pixel, on `bad_worker` only)."""
    x, y = images(PER_REPLICA, seed=10 + worker + (100 if bad else 0))
    if bad and worker == bad_worker:
        x[3, 2, 2, 0] = np.nan

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(PER_REPLICA)

    return dataset_fn


def state(strategy, model, trainer, hooks):
    """{name: this worker's copy} of all the state a step can change."""
    variables = [underlying(v) for v in model.weights + model.optimizer.variables]
    for hook in hooks:
        variables += [v for v in [getattr(hook, "residual", None)] if v is not None]
        variables += list(getattr(hook, "qs", []))
    if trainer is not None:
        variables.append(trainer.optimizer.iterations)
    values = {}
    for i, variable in enumerate(variables):
        for replica, value in enumerate(strategy.experimental_local_results(variable)):
            values[f"{i}@{replica}"] = np.array(value.numpy())
    return values


def main():
    args = parse()
    strategy = tfdist.get_strategy("multi_worker_mirrored")
    task_type, worker = tfdist.strategies.task_of(strategy)
    with strategy.scope():
        model = conv_model(seed=3, batchnorm=args.loop == "trainer", dropout=0)
        optimizer = keras.optimizers.Adam(0.01)
    ef = args.compression != "none"
    hooks = [tfdist.compression.build(args.compression, min_size=64, error_feedback=ef)]
    trainer = None
    if args.loop == "trainer":
        trainer = tfdist.Trainer(model, optimizer, loss(), strategy=strategy, hooks=hooks)

        def step(fn):
            trainer.fit(fn, verbose=0)
    else:
        with strategy.scope():
            model.compile(tfdist.keras.DistributedOptimizer(optimizer, hooks[0]), loss())

        def step(fn):
            model.fit(strategy.distribute_datasets_from_function(fn), verbose=0)

    step(batches(strategy, worker, bad=False))
    result = {"raised": None}
    if not args.clean:
        before = state(strategy, model, trainer, hooks)
        try:
            step(batches(strategy, worker, bad=True, bad_worker=args.bad_worker))
        except tf.errors.InvalidArgumentError as e:
            result["raised"] = e.message
        after = state(strategy, model, trainer, hooks)
        result["state"] = sorted(before)
        result["changed"] = sorted(k for k in before if not np.array_equal(before[k], after[k]))
        result["finite"] = all(bool(np.all(np.isfinite(v))) for v in after.values())
    step(batches(strategy, worker, bad=False))
    result["final"] = [v.numpy().tolist() for v in model.weights + model.optimizer.variables]
    with open(os.path.join(args.out, f"{task_type}-{worker}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    sys.exit(main())
