"""A Horovod Keras script as Horovod's examples write it (its own model per process, a
shard of the data by rank, `hvd.DistributedOptimizer`, `BroadcastGlobalVariablesCallback`,
`MetricAverageCallback`), with only its import changed; or, `--single`, the same model
trained in one process on the batches the workers' shards make together — what Horovod's
averaged gradients are equivalent to. Writes the weights to <out>/<rank or single>.npz."""

import argparse

import keras
import numpy as np

import tfdist.horovod.tensorflow.keras as hvd

WORKERS_BATCH, STEPS, EPOCHS = 8, 4, 2


def data(workers):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(workers * WORKERS_BATCH * STEPS, 4)).astype("float32")
    return x, (x ** 2).sum(1, keepdims=True) - 1.0


def model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--single", type=int, help="one process, as this many workers")
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    hvd.init()
    workers = args.single or hvd.size()
    x, y = data(workers)
    net = model()
    if args.single:  # step i: every worker's i-th batch, one mean
        shards = np.split(np.arange(len(x)), workers)
        order = np.concatenate([s[i * WORKERS_BATCH:(i + 1) * WORKERS_BATCH]
                                for i in range(STEPS) for s in shards])
        net.compile(keras.optimizers.SGD(0.05 * workers), "mse")
        net.fit(x[order], y[order], batch_size=WORKERS_BATCH * workers, epochs=EPOCHS,
                verbose=0, shuffle=False)
        np.savez(f"{args.out}/single.npz", *net.get_weights())
        return
    shard = slice(hvd.rank() * len(x) // workers, (hvd.rank() + 1) * len(x) // workers)
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    net.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05 * hvd.size()),
                                         compression=compression), "mse")
    history = net.fit(x[shard], y[shard], batch_size=WORKERS_BATCH, epochs=EPOCHS, verbose=0,
                      shuffle=False, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                                hvd.callbacks.MetricAverageCallback()])
    np.savez(f"{args.out}/{hvd.rank()}.npz", *net.get_weights(),
             loss=np.asarray(history.history["loss"]))


if __name__ == "__main__":
    main()
