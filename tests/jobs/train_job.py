"""A training job for the multi-worker tests, run under `tfdist launch`.

Each task writes `<out>/<type>-<index>.json` (history, steps, fixes applied...) and
`<out>/<type>-<index>.npz` (final weights). Options:

    --strategy multi_worker_mirrored | parameter_server
    --loop fit | trainer
    --model conv | dict | plain      (plain: no BatchNormalization, no Dropout)
    --backup DIR --kill EPOCH        (worker:1 SIGKILLs itself mid-epoch EPOCH, once)
    --local_sgd PERIOD --warmup W    local SGD; records a weight checksum after each step
    --accumulate K                   SGD with gradient_accumulation_steps=K
    --pause_after E1,E2              after epoch E the chief writes <out>/paused-E and waits
                                     for <out>/resume-E (for a test to kill a task meanwhile)
    --trace_batches                  parameter_server: each worker prints "batch on worker"
"""

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from models import conv_model, dataset, dict_model, loss  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="multi_worker_mirrored")
    p.add_argument("--loop", default="fit")
    p.add_argument("--model", default="conv")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--backup")
    p.add_argument("--kill", type=int)
    p.add_argument("--compression", help="name; exchanged compressed, min_size 1")
    p.add_argument("--ratio", type=float)
    p.add_argument("--rank", type=int)
    p.add_argument("--local_sgd", type=int, help="period")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--accumulate", type=int)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--pause_after", type=lambda text: {int(e) for e in text.split(",")},
                   default=set())
    p.add_argument("--trace_batches", action="store_true")
    return p.parse_args()


class PauseAfter(keras.callbacks.Callback):
    """The chief pauses after each of `epochs` until the test says so (at most 120 s)."""

    def __init__(self, epochs, out):
        self.epochs, self.out = epochs, out

    def on_epoch_end(self, epoch, logs=None):
        resume = os.path.join(self.out, f"resume-{epoch}")
        if epoch not in self.epochs or not tfdist.is_chief() or os.path.exists(resume):
            return
        open(os.path.join(self.out, f"paused-{epoch}"), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(resume) and time.monotonic() < deadline:
            time.sleep(0.1)


class Checksums(keras.callbacks.Callback):
    """This worker's copy of the first kernel, summed, after every step."""

    def __init__(self):
        self.sums = []

    def on_train_batch_end(self, batch, logs=None):
        self.sums.append(float(np.sum(self.model.trainable_variables[0].numpy())))


class EpochLog(keras.callbacks.Callback):
    """Appends each completed epoch to a file (chief only): proof of what ran."""

    def __init__(self, path):
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        if tfdist.is_chief():
            with open(self.path, "a") as f:
                f.write(f"{epoch} {logs['loss']:.6f}\n")


class KillOnce(keras.callbacks.Callback):
    """worker:1 dies (SIGKILL) in the middle of `epoch`, the first time only."""

    def __init__(self, epoch, marker):
        self.epoch, self.marker, self.current = epoch, marker, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        task = tfdist.strategies.task_of()
        if task == ("worker", 1) and self.current == self.epoch and batch == 2 \
                and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def _traced(y):
    with tf.control_dependencies([tf.print("batch on worker", output_stream=sys.stdout)]):
        return tf.identity(y)


def main():
    args = parse()
    strategy = tfdist.get_strategy(args.strategy)
    task_type, task_id = tfdist.strategies.task_of(strategy)
    name = f"{task_type}-{task_id}"
    dict_inputs = args.model == "dict"
    with strategy.scope():
        model = {"conv": conv_model, "dict": dict_model,
                 "plain": lambda: conv_model(seed=3, batchnorm=False, dropout=0)}[args.model]()
        optimizer = (keras.optimizers.SGD(0.05, gradient_accumulation_steps=args.accumulate)
                     if args.model == "plain" else keras.optimizers.Adam(0.01))
    if args.compression and args.strategy != "parameter_server":
        options = {k: v for k, v in (("ratio", args.ratio), ("rank", args.rank)) if v}
        optimizer = tfdist.keras.DistributedOptimizer(optimizer, args.compression, min_size=1,
                                                      strategy=strategy, **options)
    if args.accumulate and args.loop == "fit":  # tfdist's phased accumulation
        optimizer = tfdist.keras.DistributedOptimizer(optimizer, strategy=strategy)
    result = {"replicas": strategy.num_replicas_in_sync}
    callbacks = [tfdist.callbacks.SyncReplicaState()] if args.loop == "fit" else []
    hooks = []
    if args.accumulate and args.loop == "fit":
        callbacks.append(tfdist.callbacks.HookPhases())
    if args.local_sgd:
        if args.loop == "fit":
            callbacks.append(tfdist.callbacks.LocalSGD(args.local_sgd, args.warmup))
        else:
            hooks.append(tfdist.local_sgd.ModelAverager(args.local_sgd, args.warmup))
    checksums = Checksums()
    callbacks.append(checksums)
    if args.backup:
        callbacks += [tfdist.callbacks.BackupAndRestore(args.backup),
                     EpochLog(os.path.join(args.out, "epochs.log")),
                     tfdist.callbacks.ModelCheckpoint(
                         os.path.join(args.out, "model-{epoch}.weights.h5"),
                         save_weights_only=True)]
        if args.kill is not None:
            callbacks.append(KillOnce(args.kill, os.path.join(args.out, "killed")))

    if args.strategy == "parameter_server":
        with strategy.scope():
            model.compile(keras.optimizers.Adam(0.01), loss())
        try:
            model.fit(dataset(64, 32), epochs=1, verbose=0)
        except tfdist.strategies.UnsupportedByKerasError as e:
            result["fit_error"] = str(e)

        def dataset_fn(context):
            data = dataset(256, 32, seed=context.input_pipeline_id, dict_inputs=dict_inputs,
                           repeat=True).shuffle(8)
            if args.trace_batches:  # runs on the worker: its output is prefixed by the launcher
                data = data.map(lambda x, y: (tf.identity(x), _traced(y)))
            return data

        if args.trace_batches:  # and the coordinator's recovery messages
            tf.get_logger().setLevel("INFO")
        if args.pause_after:
            callbacks.append(PauseAfter(args.pause_after, args.out))
        hooks = [tfdist.compression.build(args.compression)] if args.compression else []
        trainer = tfdist.Trainer(model, optimizer, loss(), strategy=strategy,
                                 metrics=["sparse_categorical_accuracy"], hooks=hooks)
        history = trainer.fit(dataset_fn, epochs=args.epochs, steps_per_epoch=12, verbose=0,
                              callbacks=[c for c in callbacks if not isinstance(c, Checksums)])
        result.update(completed_steps=trainer.completed_steps, step=int(trainer.step.numpy()),
                      loss_count=float(trainer.loss_tracker.count.numpy()),
                      optimizer_iterations=int(trainer.optimizer.iterations.numpy()))
    elif args.loop == "fit":
        with strategy.scope():
            model.compile(optimizer, loss(), metrics=["sparse_categorical_accuracy"])
        data = dataset(128, args.batch, dict_inputs=dict_inputs)
        history = model.fit(data, epochs=args.epochs, verbose=0, callbacks=callbacks)
        result["evaluate"] = model.evaluate(data, verbose=0, return_dict=True)
        result["predict_shape"] = list(model.predict(data, verbose=0).shape)
    else:
        trainer = tfdist.Trainer(model, optimizer, loss(), strategy=strategy,
                                 metrics=["sparse_categorical_accuracy"], hooks=hooks)
        data = dataset(128, args.batch, dict_inputs=dict_inputs)
        history = trainer.fit(data, epochs=args.epochs, verbose=0, callbacks=callbacks)
        result["evaluate"] = trainer.evaluate(data, verbose=0)
        result["completed_steps"] = trainer.completed_steps

    result["history"] = history.history
    result["checksums"] = checksums.sums
    result["keras_fixes"] = dict(getattr(strategy, "keras_fixes", {}))
    np.savez(os.path.join(args.out, f"{name}.npz"), *[w.numpy() for w in model.weights])
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    sys.exit(main())
