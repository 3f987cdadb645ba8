"""A mixed_float16 job for the multi-worker tests, run under `tfdist launch`: worker
`--bad_worker` gets one overflowing sample (finite loss, float16-overflowing scaled
gradient) at steps `--bad_steps`; every other batch is ordinary. Each task writes
`<out>/<type>-<index>.json`: the loss scale, step count and a kernel checksum after every
step, the loss per epoch, and its final weights.

    --loop fit | trainer   --exchange NAME (see EXCHANGES)   --clean (leave the bad steps
    out altogether: the run the others must end equal to)
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

STEPS, PER_WORKER = 8, 16
EXCHANGES = {"none": {}, "topk+EF": dict(compression="topk", ratio=0.3, error_feedback=True,
                                         min_size=0, start_step=3),
             "powersgd+EF": dict(compression="powersgd", rank=2, error_feedback=True,
                                 min_size=0),
             "DiLoCo 2": dict(hooks="diloco")}


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--loop", default="fit")
    p.add_argument("--exchange", default="none")
    p.add_argument("--bad_worker", type=int, default=1)
    p.add_argument("--bad_steps", default="2,5")
    p.add_argument("--clean", action="store_true")
    p.add_argument("--growth", type=int, default=3)
    return p.parse_args()


def batch(step, worker, bad):
    rng = np.random.default_rng(1000 * step + worker)
    x = rng.normal(size=(PER_WORKER, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True) * 0.5
    if bad:
        x[3] = 300.0  # its loss is finite; its gradient times the loss scale is not, in float16
    return x, y


def main():
    args = parse()
    bad_steps = {int(s) for s in args.bad_steps.split(",") if s}
    steps = [s for s in range(STEPS) if not (args.clean and s in bad_steps)]
    keras.mixed_precision.set_global_policy("mixed_float16")
    strategy = tfdist.get_strategy("multi_worker_mirrored")
    task_type, task_id = tfdist.strategies.task_of(strategy)
    worker = strategy.cluster_resolver.task_id if task_type == "worker" else 0

    def dataset_fn(context):
        index = context.input_pipeline_id
        parts = [batch(s, index, s in bad_steps and index == args.bad_worker) for s in steps]
        x, y = (np.concatenate(p) for p in zip(*parts))
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(PER_WORKER)

    options = dict(EXCHANGES[args.exchange])
    hooks = ([tfdist.local_sgd.DiLoCo(2, outer={"name": "nesterov", "learning_rate": 0.5})]
             if options.pop("hooks", None) else [])
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1, dtype="float32")])
        optimizer = tfdist.keras.DistributedOptimizer(
            keras.optimizers.SGD(0.01), options.pop("compression", "none"), strategy=strategy,
            hooks=hooks, **options)
    record = {"scales": [], "steps": [], "checksums": []}

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch_index, logs=None):
            optimizer = self.model.optimizer
            record["scales"].append(float(optimizer.dynamic_scale.numpy()))
            record["steps"].append(int(optimizer.iterations.numpy()))
            record["checksums"].append(float(np.sum(self.model.layers[0].kernel.numpy())))

    data = strategy.distribute_datasets_from_function(dataset_fn)
    if args.loop == "fit":
        with strategy.scope():
            model.compile(optimizer, "mse")  # Keras adds the loss scale; tfdist takes it over
        model.optimizer.dynamic_growth_steps = args.growth
        history = model.fit(data, epochs=1, steps_per_epoch=len(steps), verbose=0,
                            callbacks=[tfdist.callbacks.TrainingHooks(), Record()])
    else:
        trainer = tfdist.Trainer(model, optimizer, "mse", strategy=strategy)
        trainer.optimizer.dynamic_growth_steps = args.growth
        history = trainer.fit(lambda context: dataset_fn(context), epochs=1, verbose=0,
                              callbacks=[Record()])
    record.update(worker=worker, loss=history.history["loss"],
                  weights=[w.numpy().tolist() for w in model.weights])
    with open(os.path.join(args.out, f"{task_type}-{task_id}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    sys.exit(main())
