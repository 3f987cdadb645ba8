"""Horovod scripts as Horovod's examples write them, with only their import changed: its
own model per process, a shard of the data by rank, and

- `fit`: `hvd.DistributedOptimizer` (`--passes N`: `backward_passes_per_step=N`, summed as
  Horovod's default, or averaged with `--average-passes`), `BroadcastGlobalVariablesCallback`,
  `MetricAverageCallback`;
- `mixed`: `fit` under mixed_float16 (its loss scale given: see `main`);
- `tape`: a `tf.function` step with `hvd.DistributedGradientTape` and
  `hvd.broadcast_variables` after the first batch (Horovod's tensorflow2_mnist.py);
- `fp16`: `fit` with `compression=hvd.Compression.fp16` (`--passes` is fit's and mixed's);
- `nan`: `fit` with a NaN in the last rank's batch of step NAN_STEP (of the first epoch):
  tfdist refuses that step on every rank and stops fit; each rank writes the refusal to
  <out>/refused-<rank>.txt and saves the weights the refusal left;
- `reload`: `fit` with momentum for one epoch; rank 0 saves the model (<out>/reload.keras),
  every rank loads it (even ranks with `keras.models.load_model`, odd ones with
  `hvd.load_model`) and fits the second epoch;
- `families`: `fit` on the model families users bring: an Embedding (its gradient an
  IndexedSlices), a Dense over a sequence, two inputs and two outputs, a frozen layer.
- `topk`: `families` with tfdist's top-k and error feedback through
  `hvd.DistributedOptimizer(compression=...)` (beyond Horovod): exchanged between the
  workers, the Embedding's rows gathered.
- `local_sgd`, `diloco`: `families` with tfdist's local SGD (a `local_sgd:` section,
  momentum averaged too) and DiLoCo (a `tfdist.local_sgd.DiLoCo` of 2 fragments) through
  `hvd.DistributedOptimizer(compression=...)`: each worker trains apart between
  synchronisations over Horovod's workers.
- `MODE+mixed`: MODE under mixed_float16 (its loss scale given, as `mixed`'s).

`--backup DIR` adds tfdist's `BackupAndRestore(DIR/<mode>)` to fit's callbacks (what a
Horovod script opts into for preemption); `--preempt E,B,R`: rank R SIGTERMs itself after
step B of epoch E, once in each mode; every rank logs the steps it trains to
<out>/steps-<mode>-<rank>.log, and a relaunched job skips the modes it finished.

`--single W` trains the same models in one process on the batches W workers' shards make
together — what Horovod's averaged gradients are equivalent to; `fp16` and `topk` there
are tfdist's own exchange (`tfdist.keras.DistributedOptimizer` with `NATIVE[mode]`; fp16's
min_size 0: Horovod casts every tensor), `local_sgd` and `diloco` its own `ModelAverager`,
under a MirroredStrategy of W logical CPUs, a replica per worker's batch. Writes the
weights (and losses) to <out>/<mode>-<rank or single>.npz."""

import argparse
import functools
import os
import signal

import keras
import numpy as np
import tensorflow as tf

import tfdist
import tfdist.horovod.tensorflow.keras as hvd

WORKERS_BATCH, STEPS, EPOCHS = 8, 4, 2
NAN_STEP = 1


def data(workers):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(workers * WORKERS_BATCH * STEPS, 4)).astype("float32")
    return x, (x ** 2).sum(1, keepdims=True) - 1.0


def in_steps(workers):
    """The rows of every worker's shard in the order the workers' steps read them
    together: step i's global batch is every worker's i-th batch, rank by rank."""
    shards = np.split(np.arange(workers * WORKERS_BATCH * STEPS), workers)
    return np.concatenate([s[i * WORKERS_BATCH:(i + 1) * WORKERS_BATCH]
                           for i in range(STEPS) for s in shards])


def model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def families_model():
    """Tokens through an Embedding and a Dense over the sequence, beside features through
    a frozen Dense; two outputs."""
    keras.utils.set_random_seed(1)
    tokens, features = keras.Input((4,), dtype="int32"), keras.Input((4,))
    sequence = keras.layers.Dense(3, activation="tanh")(keras.layers.Embedding(12, 4)(tokens))
    frozen = keras.layers.Dense(3, trainable=False)
    joined = keras.layers.Concatenate()([keras.layers.GlobalAveragePooling1D()(sequence),
                                         frozen(features)])
    return keras.Model([tokens, features], [keras.layers.Dense(1)(joined),
                                            keras.layers.Dense(2)(joined)])


def families_data(x, y):
    """The families model's inputs and targets, from the same rows."""
    tokens = (np.floor(np.abs(x) * 4) % 12).astype("int32")
    return [tokens, x], [y, x[:, :2]]


def rows(data, index):
    """`data` (an array or a list of them) at `index`."""
    return [part[index] for part in data] if isinstance(data, list) else data[index]


MOMENTUM = {"reload": 0.9, "local_sgd": 0.5}
MODELS = {mode: (families_model, families_data)
          for mode in ("families", "topk", "local_sgd", "diloco")}
#: tfdist's compressions each mode exchanges with, natively in one process (`native`) and
#: through hvd.DistributedOptimizer (`fp16` there is Horovod's own).
NATIVE = {"fp16": {"name": "fp16", "min_size": 0},
          "topk": {"name": "topk", "ratio": 0.25, "error_feedback": True, "min_size": 0}}
#: tfdist's model averaging each mode trains with (beyond Horovod): a `local_sgd:` section
#: through hvd.DistributedOptimizer, the same as a `ModelAverager` natively; DiLoCo as the
#: object, both ways.
AVERAGING = {"local_sgd": lambda: {"name": "local_sgd", "period": 3, "warmup_steps": 2,
                                   "average_optimizer_state": True},
             "diloco": lambda: tfdist.local_sgd.DiLoCo(2, fragments=2)}


def single(x, y, workers, passes=1, summed=False, initial_scale=None, upto=None,
           mode="fit"):
    """One process: each update on `passes` steps of every worker's batches, one mean
    (times `passes` when Horovod sums the passes); `upto`: only the first `upto` steps
    (those before the step a NaN refused)."""
    order, epochs = in_steps(workers), EPOCHS
    if upto is not None:
        order, epochs = order[:upto * WORKERS_BATCH * workers], 1
    build, inputs = MODELS.get(mode, (model, lambda x, y: (x, y)))
    net, (x, y) = build(), inputs(x, y)
    rate = 0.05 * workers * (passes if summed else 1)
    optimizer = keras.optimizers.SGD(rate, momentum=MOMENTUM.get(mode, 0.0))
    if initial_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=initial_scale)
    net.compile(optimizer, "mse")
    history = net.fit(rows(x, order), rows(y, order), batch_size=WORKERS_BATCH * workers * passes,
                      epochs=epochs, verbose=0, shuffle=False)
    return net.get_weights() + optimizer_state(net), history.history["loss"]


@functools.lru_cache(maxsize=None)
def mirrored(workers):
    """TensorFlow's MirroredStrategy of `workers` logical CPUs, one per process: two
    instances' collectives would share instance keys."""
    return tf.distribute.MirroredStrategy(tfdist.strategies.ensure_logical_cpus(workers))


def native(x, y, workers, mode, initial_scale=None):
    """tfdist's own exchange (`NATIVE[mode]`) in one process: a replica per worker, each
    on that worker's batch of every step (a global batch splits in order over the
    replicas)."""
    strategy = mirrored(workers)
    order = in_steps(workers)
    build, inputs = MODELS.get(mode, (model, lambda x, y: (x, y)))
    x, y = inputs(x, y)
    with strategy.scope():
        net = build()
        optimizer = keras.optimizers.SGD(0.05 * workers, momentum=MOMENTUM.get(mode, 0.0))
        if mode in AVERAGING:
            averager = AVERAGING[mode]()
            if isinstance(averager, dict):
                averager = tfdist.local_sgd.ModelAverager(
                    **{k: v for k, v in averager.items() if k != "name"})
            optimizer = tfdist.keras.DistributedOptimizer(optimizer, hooks=[averager])
        else:
            optimizer = tfdist.keras.DistributedOptimizer(optimizer, NATIVE[mode])
        if initial_scale:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer,
                                                            initial_scale=initial_scale)
        net.compile(optimizer, "mse")
    history = net.fit(rows(x, order), rows(y, order), batch_size=WORKERS_BATCH * workers,
                      epochs=EPOCHS, verbose=0, shuffle=False,
                      callbacks=[tfdist.callbacks.TrainingHooks()])
    return net.get_weights() + optimizer_state(net), history.history["loss"]


class PreemptOnce(keras.callbacks.Callback):
    """Each rank logs the steps it trains in `mode` (not those a resumed run skips); rank
    `at[2]` SIGTERMs itself after step `at[1]` of epoch `at[0]`, once per mode."""

    def __init__(self, out, at, mode):
        self.out, self.at, self.mode, self.epoch = out, at, mode, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        from tfdist.step.preemption import skipping

        if skipping(self.model, self.epoch, batch):
            return
        with open(os.path.join(self.out, f"steps-{self.mode}-{hvd.rank()}.log"), "a") as f:
            f.write(f"{self.epoch} {batch} {int(self.model.optimizer.iterations.numpy())}\n")
        marker = os.path.join(self.out, f"preempted-{self.mode}")
        if self.at and (self.epoch, batch, hvd.rank()) == self.at \
                and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGTERM)


def optimizer_state(net):
    """[the loss scale (1 without one), the updates the optimizer counted]."""
    optimizer = net.optimizer
    scale = float(optimizer.dynamic_scale.numpy()) if hasattr(optimizer, "dynamic_scale") else 1.0
    return [np.float32(scale), np.float32(optimizer.iterations.numpy())]


def fit(x, y, passes, average_passes, fp16, initial_scale=None, extra=(), refused=None,
        mode="fit", out=None):
    """Horovod's Keras idiom; `refused`: where to write tfdist's refusal of a step (the
    weights are then those it left); `mode` reload: saved to `out` after the first epoch
    and loaded back on every rank."""
    build, inputs = MODELS.get(mode, (model, lambda x, y: (x, y)))
    net, (x, y) = build(), inputs(x, y)
    compression = (hvd.Compression.fp16 if fp16 else NATIVE[mode] if mode in NATIVE
                   else AVERAGING[mode]() if mode in AVERAGING else hvd.Compression.none)
    optimizer = keras.optimizers.SGD(0.05 * hvd.size(), momentum=MOMENTUM.get(mode, 0.0))
    if initial_scale:  # mixed_float16's loss scaling, by hand (else compile adds it)
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=initial_scale)
    net.compile(hvd.DistributedOptimizer(optimizer,
                                         compression=compression,
                                         backward_passes_per_step=passes,
                                         average_aggregated_gradients=average_passes), "mse")
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(), *extra]
    epochs = [(0, EPOCHS)] if mode != "reload" else [(0, 1), (1, EPOCHS)]
    losses = []
    try:
        for first, last in epochs:
            if first:
                net = reloaded(net, f"{out}/reload.keras")
            history = net.fit(x, y, batch_size=WORKERS_BATCH, initial_epoch=first,
                              epochs=last, verbose=0, shuffle=False, callbacks=callbacks)
            losses += history.history["loss"]
    except tf.errors.InvalidArgumentError as error:
        if refused is None:
            raise
        with open(refused, "w") as f:
            f.write(error.message)
        return net.get_weights() + optimizer_state(net), [np.nan]
    return net.get_weights() + optimizer_state(net), losses


def reloaded(net, path):
    """`net` saved by rank 0 and loaded by every rank: even ranks with Keras' own
    `load_model`, odd ranks with Horovod's."""
    if hvd.rank() == 0:
        net.save(path)
    hvd.allreduce(tf.constant(0.0), name="saved")  # every rank waits for the file
    if hvd.rank() % 2:
        return hvd.load_model(path)
    return keras.models.load_model(path)


def tape(x, y):
    net = model()
    loss = keras.losses.MeanSquaredError()
    opt = keras.optimizers.SGD(0.05 * hvd.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss_value = loss(labels, net(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(net.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)  # Keras 3: a list
        return loss_value

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(WORKERS_BATCH)
    losses = [float(training_step(a, b, i == 0))
              for i, (a, b) in enumerate(dataset.repeat(EPOCHS))]
    return net.get_weights() + [np.float32(1.0), np.float32(opt.iterations.numpy())], losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--modes", default="fit", help="fit,tape")
    parser.add_argument("--single", type=int, help="one process, as this many workers")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--average-passes", action="store_true")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--policy", default="float32", help="e.g. mixed_float16")
    parser.add_argument("--backup", help="tfdist.callbacks.BackupAndRestore's directory")
    parser.add_argument("--preempt", help="E,B,R: rank R SIGTERMs itself after step B of "
                                          "epoch E")
    args = parser.parse_args()
    at = tuple(int(v) for v in args.preempt.split(",")) if args.preempt else None
    modes = [(name, *name.partition("+")[::2]) for name in args.modes.split(",")]
    if args.single and {*NATIVE, *AVERAGING} & {mode for _, mode, _ in modes}:
        tfdist.strategies.ensure_logical_cpus(args.single)  # before TensorFlow's first op
    hvd.init()
    workers = args.single or hvd.size()
    x, y = data(workers)
    for label, mode, policy in modes:
        # mixed (or MODE+mixed, or any mode under --policy mixed_float16): under
        # mixed_float16 with a loss scale small enough never to overflow here (the
        # per-worker batch overflows where one process's larger one does not)
        mixed = "mixed" in (mode, policy) or args.policy == "mixed_float16"
        scale = 256 if mixed else None
        keras.mixed_precision.set_global_policy("mixed_float16" if scale else args.policy)
        if args.single:
            passes = args.passes if mode in ("fit", "mixed") else 1
            weights, losses = (
                native(x, y, workers, mode, scale) if mode in {**NATIVE, **AVERAGING} else
                single(x, y, workers, passes, not args.average_passes, scale,
                       NAN_STEP if mode == "nan" else None, mode))
            name = "single"
        else:
            shard = slice(hvd.rank() * len(x) // workers, (hvd.rank() + 1) * len(x) // workers)
            mine = x[shard].copy()
            if mode == "nan" and hvd.rank() == workers - 1:
                mine[NAN_STEP * WORKERS_BATCH, 0] = np.nan
            if at and os.path.exists(f"{args.out}/{label}-{hvd.rank()}.npz"):
                continue  # done before the job was preempted in a later mode
            extra = ([PreemptOnce(args.out, at, label)] if at else []) + (
                [tfdist.callbacks.BackupAndRestore(f"{args.backup}/{label}")]
                if args.backup else [])
            passes = args.passes if mode in ("fit", "mixed") else 1
            weights, losses = (tape(mine, y[shard]) if mode == "tape" else
                               fit(mine, y[shard], passes, args.average_passes,
                                   args.fp16 or mode == "fp16", scale, extra,
                                   f"{args.out}/refused-{hvd.rank()}.txt"
                                   if mode == "nan" else None, mode, args.out))
            name = hvd.rank()
        np.savez(f"{args.out}/{label}-{name}.npz", *weights, loss=np.asarray(losses))


if __name__ == "__main__":
    main()
