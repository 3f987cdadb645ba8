"""Local SGD with islands on a linear model, for tests/unit/local_sgd/test_islands.py: on N
logical CPUs (MirroredStrategy, one process) or as one task of a multi-worker job (`tfdist launch`).

Replica r (global index) trains at step t on its own batch `batch(r, t)`; the job writes
every replica's final weights to ``<out>/<task>.npz`` (``replica_<r>`` entries) so that
the test compares each one with `reference`, a NumPy simulation of the same training.

    --replicas N        logical CPUs (MirroredStrategy); omit under tfdist launch
    --islands SPEC      a count, "host", or JSON lists of worker indices
    --period H --warmup W --steps S --lr LR --loop trainer|fit|own --policy NAME
    --island-steps N,M  local steps each island trains per period (heterogeneous islands),
                        or auto (measured); the counts used go to <out>/<task>.pace.json
    --slow-workers I,J --slow-seconds S   those workers' steps take S seconds longer
    --compression NAME  the synchronisation's compression (min_size 0)
    --warmup-compression NAME   the warm-up's (min_size 0)
    --fragments F --overlap K   Streaming DiLoCo's fragments and overlapped steps
    --spoil STEP:REPLICA:nan|huge   that replica's batch at that step is NaN, or 1000x
                                    (its float16 gradient overflows)

`own` is the tutorial's `tf.GradientTape` loop under `tfdist.function`.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

FEATURES, BATCH = 3, 4


def batch(replica, step, spoil=None):
    """(x, y) of one replica at one step: the same on every machine; `spoil` (step,
    replica, "nan" or "huge") spoils one replica's batch at one step."""
    rng = np.random.default_rng(1000 * replica + step)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = (x @ np.array([[1.5], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)
    if spoil is not None and (step, replica) == tuple(spoil[:2]):
        x = np.full_like(x, np.nan) if spoil[2] == "nan" else x * 1000
    return x, y


def initial_weights():
    return np.full((FEATURES, 1), 0.1, np.float32), np.zeros((1,), np.float32)


def int8(x):
    """NumPy of tfdist's int8 round trip of one tensor: levels -127..127 of max |x|."""
    scale = np.float32(np.abs(x).max() / 127) or np.float32(1)
    return (np.round(x / scale) * scale).astype(np.float32)


def across_islands(deltas, groups, times=None):
    """The int8-exchanged sum over the islands of `deltas` (one flat float32 tensor per
    island), hierarchically: the replica at place p of each island sends its island's p-th
    share times `times` (default: the island's size, i.e. the island's change counted for
    each of its replicas), quantised on its own."""
    size = len(groups[0])
    times = size if times is None else times
    shard = -(-deltas[0].size // size)
    padded = [np.pad(d, (0, shard * size - d.size)) for d in deltas]
    total = np.concatenate([sum(int8(times * d[p * shard:(p + 1) * shard]) for d in padded)
                            for p in range(size)])
    return total[:deltas[0].size]


def reference(replicas, groups, period, warmup, steps, lr, skip=None, island_steps=None,
              loop_reads=False, compression=None, warmup_compression=None):
    """NumPy: every replica's (kernel, bias) after `steps` steps of islands local SGD
    (plain averaging), `groups` as lists of replica indices; `skip` (step, replica): that
    replica's island skips that step (a loss-scale overflow), the others do not (a replica
    of None: every island skips it). `island_steps`: island i trains on island_steps[i] of
    each period's calls (evenly spread; a call that trains nothing reads no batch, unless
    `loop_reads`: your own loop's), and the averages weigh islands by those counts.
    `compression` "int8": the islands' changes since the last synchronisation go as
    `across_islands` sends them (equal islands of workers); `warmup_compression` "int8":
    the warm-up's gradients too, summed inside each island first."""
    w = [list(initial_weights()) for _ in range(replicas)]
    island_of = {r: i for i, g in enumerate(groups) for r in g}

    def grad(kernel, bias, r, t):
        x, y = batch(r, t)
        error = x @ kernel + bias - y
        return 2 * x.T @ error / len(x), 2 * error.mean(0)

    def counts_of(index):  # island_steps: counts, or [(first period, counts), ...]
        if not island_steps:
            return [period] * len(groups)
        if not isinstance(island_steps[0], (list, tuple)):
            return island_steps
        return [c for first, c in island_steps if first <= index][-1]

    def trained(r, call):  # local call `call` (may be < 0: the first period's counts)
        within, count = call % period, counts_of(max(call, 0) // period)[island_of[r]]
        return (within + 1) * count // period > within * count // period

    def trains(r, t):
        return t < warmup or trained(r, t - warmup)

    def weights(local):  # each replica's by its island's trained calls in the last period
        weight = np.array([sum(trained(r, c) for c in range(local - period, local))
                           for r in range(replicas)], np.float64)
        return weight / weight.sum()

    read = [0] * replicas  # batches each replica has read (a call training nothing reads none)
    for t in range(steps):
        grads = [grad(*w[r], r, t if loop_reads else read[r]) for r in range(replicas)]
        for r in range(replicas):
            if not trains(r, t):
                continue
            read[r] += 1
            if skip is not None and t == skip[0] and (
                    skip[1] is None or island_of[r] == island_of[skip[1]]):
                continue
            members = range(replicas) if t < warmup else groups[island_of[r]]
            gk = np.mean([grads[m][0] for m in members], 0)
            gb = np.mean([grads[m][1] for m in members], 0)
            if t < warmup and warmup_compression == "int8":
                sums = [sum(flat(grads[m]) for m in g) for g in groups]
                total = across_islands(sums, groups, times=1) / np.float32(replicas)
                gk, gb = total[:FEATURES].reshape(FEATURES, 1), total[FEATURES:]
            w[r] = [w[r][0] - lr * gk, w[r][1] - lr * gb]
        local = t + 1 - warmup
        if t == warmup - 1 or (t == 0 and warmup == 0):
            anchor = flat(w[0] if warmup else initial_weights())  # where local steps start
        if t >= warmup and (local % period == 0 or t == steps - 1):
            weight = weights(local)
            mean = [sum(weight[r] * w[r][i] for r in range(replicas)).astype(np.float32)
                    for i in (0, 1)]
            if compression == "int8":
                change = across_islands([flat(w[g[0]]) - anchor for g in groups], groups)
                anchor = anchor + change / np.float32(replicas)
                mean = [anchor[:FEATURES].reshape(FEATURES, 1), anchor[FEATURES:]]
            w = [list(mean) for _ in range(replicas)]
    return w


def slowed(seconds):
    """A step that takes `seconds` longer (nothing else changes)."""
    import time

    import tensorflow as tf

    def pause():
        time.sleep(seconds)
        return np.float32(0)

    def slow(x):
        done = tf.ensure_shape(tf.numpy_function(pause, [], tf.float32, stateful=True), [])
        return x + tf.cast(done, x.dtype)

    return slow


def flat(weights):
    kernel, bias = weights
    return np.concatenate([kernel.ravel(), bias.ravel()]).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--replicas", type=int)
    parser.add_argument("--islands", default=None)
    parser.add_argument("--period", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--loop", default="trainer")
    parser.add_argument("--policy", default=None)
    parser.add_argument("--spoil", default=None)
    parser.add_argument("--island-steps", default=None)
    parser.add_argument("--compression", default=None)
    parser.add_argument("--warmup-compression", default=None)
    parser.add_argument("--fragments", type=int, default=1)
    parser.add_argument("--overlap", type=int, default=0)
    parser.add_argument("--slow-workers", default="")
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    args = parser.parse_args()
    spoil = None
    if args.spoil:
        step, replica, kind = args.spoil.split(":")
        spoil = (int(step), int(replica), kind)

    import keras
    import tensorflow as tf

    import tfdist
    from tfdist.step.variables import underlying

    if args.replicas:
        strategy = tfdist.get_strategy("mirrored", logical_cpus=args.replicas)
        task = "local"
    else:
        strategy = tfdist.get_strategy("multi_worker_mirrored")
        kind, index = tfdist.strategies.task_of(strategy)
        task = f"{kind}-{index}"
    if args.policy:
        keras.mixed_precision.set_global_policy(args.policy)
    islands = args.islands
    if islands is not None:
        islands = json.loads(islands) if islands.startswith("[") else (
            islands if islands == "host" else int(islands))
    replicas = strategy.num_replicas_in_sync
    workers = max(1, len(json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
                         .get("worker", [])) + len(json.loads(os.environ.get("TF_CONFIG", "{}"))
                                                   .get("cluster", {}).get("chief", [])))
    local = replicas // workers

    def dataset_fn(context):
        worker = context.input_pipeline_id
        xs, ys = zip(*[batch(worker * local + k % local, k // local, spoil)
                       for k in range(args.steps * local)])
        # infinite (repeated): TF then reads each step's batch without a collective across
        # workers (its check for a partial last batch), so islands decouple
        return tf.data.Dataset.from_tensor_slices((np.stack(xs), np.stack(ys))).repeat()

    with strategy.scope():
        inputs = keras.Input((FEATURES,))
        layer = keras.layers.Dense(1, dtype=args.policy or "float32")
        features = inputs
        if task.startswith("worker-") and task[7:] in args.slow_workers.split(","):
            features = keras.layers.Lambda(slowed(args.slow_seconds),
                                           output_shape=(FEATURES,))(inputs)
        model = keras.Model(inputs, layer(features))
        kernel, bias = initial_weights()
        layer.kernel.assign(kernel)
        layer.bias.assign(bias)
        island_steps = (args.island_steps if args.island_steps in (None, "auto")
                        else [int(n) for n in args.island_steps.split(",")])
        compression, warmup_compression = (
            name and {"name": name, "min_size": 0}
            for name in (args.compression, args.warmup_compression))
        averager = tfdist.local_sgd.ModelAverager(
            period=args.period, warmup_steps=args.warmup, islands=islands,
            island_steps=island_steps, compression=compression,
            warmup_compression=warmup_compression, fragments=args.fragments,
            overlap_steps=args.overlap)
        optimizer = keras.optimizers.SGD(args.lr)
        if args.policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0)
    if args.loop == "trainer":
        trainer = tfdist.Trainer(model, optimizer, "mse", strategy=strategy, hooks=[averager])
        try:
            trainer.fit(dataset_fn, epochs=1, steps_per_epoch=args.steps, verbose=0)
        except tf.errors.InvalidArgumentError as error:  # a refused step (--spoil nan)
            with open(os.path.join(args.out, f"{task}.refused"), "w") as f:
                f.write(error.message)
            tfdist.strategies.barrier(strategy)  # every worker writes before any exits
            sys.exit(3)
    elif args.loop == "fit":  # Keras' own loop, the averager as a callback
        with strategy.scope():
            model.compile(optimizer, "mse")
        history = model.fit(
            strategy.distribute_datasets_from_function(dataset_fn), epochs=1,
            steps_per_epoch=args.steps, verbose=0,
            callbacks=[tfdist.callbacks.LocalSGD(period=args.period, warmup_steps=args.warmup,
                                                 islands=islands, island_steps=island_steps)])
        with open(os.path.join(args.out, f"{task}.logs"), "w") as f:  # the epoch's logs
            json.dump(history.history, f)
    elif args.loop == "own":  # a tf.GradientTape loop as TensorFlow's tutorials write it
        own_loop(strategy, model, optimizer, averager, dataset_fn, args.steps)
    else:
        sys.exit(f"unknown --loop {args.loop}")
    per_replica = [strategy.experimental_local_results(underlying(v)) for v in
                   (layer.kernel, layer.bias)]
    first = worker_index(task) * local
    arrays = {f"replica_{first + i}_{name}": np.asarray(values[i])
              for name, values in zip(("kernel", "bias"), per_replica) for i in range(local)}
    np.savez(os.path.join(args.out, f"{task}.npz"), **arrays)
    if averager.pace is not None and args.loop != "fit":  # the counts of trained calls used
        with open(os.path.join(args.out, f"{task}.pace.json"), "w") as f:
            json.dump(averager.pace.history, f)
    if args.loop == "trainer":  # what this worker's replica sent, by kind
        with open(os.path.join(args.out, f"{task}.json"), "w") as f:
            json.dump(averager.wire_meter.totals(), f)
    tfdist.strategies.barrier(strategy)


def own_loop(strategy, model, optimizer, averager, dataset_fn, steps):
    """The custom training loop of TensorFlow's distributed-training tutorial, with
    `tfdist.function` instead of `tf.function` and the averager among the optimizer's
    hooks."""
    import tensorflow as tf

    import tfdist

    global_batch = BATCH * strategy.num_replicas_in_sync
    with strategy.scope():
        optimizer = tfdist.keras.DistributedOptimizer(optimizer, hooks=[averager])
        optimizer.build(model.trainable_variables)

    def replica_step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            predictions = tf.cast(model(features), tf.float32)  # float16 under mixed_float16
            per_example = tf.reduce_mean(tf.square(predictions - labels), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss)  # loss scaling, if the policy asks for it
        optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables),
                                      model.trainable_variables))

    step = tfdist.function(lambda inputs: strategy.run(replica_step, args=(inputs,)),
                           model=model, optimizer=optimizer)
    batches = iter(strategy.distribute_datasets_from_function(dataset_fn))
    for _ in range(steps):
        step(next(batches))
    step.before_read()


def worker_index(task):
    """The MultiWorkerMirroredStrategy worker index of a task (chief first)."""
    if task == "local":
        return 0
    kind, index = task.rsplit("-", 1)
    tf_config = json.loads(os.environ["TF_CONFIG"])
    has_chief = bool(tf_config["cluster"].get("chief"))
    return int(index) + (1 if kind == "worker" and has_chief else 0)


if __name__ == "__main__":
    main()
