"""A 2-worker job that SIGTERMs one worker at a chosen moment (tests/e2e/test_sigterm_moments.py):
`--at` get_strategy (it returned), model (built), restore (BackupAndRestore's start, where a
backup is read), trace (the first step being traced), validation (the last epoch's), or
after_fit (the script goes on). worker:1 signals itself, as a pod Kubernetes evicts."""

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

import tfdist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--at", required=True, choices=["get_strategy", "model", "restore", "trace",
                                                   "validation", "after_fit"])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import keras

    strategy = tfdist.get_strategy("multi_worker_mirrored")
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    me = f"{task['type']}-{task['index']}"
    signalled = me == "worker-1"

    sent = []

    def signal_here(moment):
        if signalled and args.at == moment and not sent:
            sent.append(moment)  # once: a second SIGTERM means "stop now"
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the handler runs at once: nothing after this line

    signal_here("get_strategy")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.01), "none"),
                      "mse")
    signal_here("model")

    class At(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch = 0

        def on_train_begin(self, logs=None):
            signal_here("restore")

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self.epoch == 0 and batch == 0:
                signal_here("trace")

        def on_test_batch_end(self, batch, logs=None):
            if self.epoch == 1:
                signal_here("validation")

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model.fit(x, y, batch_size=16, epochs=2, validation_data=(x[:32], y[:32]), verbose=0,
              callbacks=[At(), tfdist.callbacks.BackupAndRestore(os.path.join(args.out,
                                                                             "backup"))])
    signal_here("after_fit")
    with open(os.path.join(args.out, f"done-{me}"), "w") as f:
        f.write("done\n")
    tfdist.strategies.barrier(strategy)


if __name__ == "__main__":
    sys.exit(main())
