"""Bytes per step of a model whose gradient is mostly an embedding's rows, on the wire.

A text classifier with an Embedding of 200,000 x 64 (51 MB of float32), 2 workers, global
batches of 32 sequences of 64 tokens drawn from a Zipf law (frequent tokens repeat, as in
text), inside a private network namespace (`unshare -n`, root): the loopback counters count
exactly what the job sent. Each run twice, for a short and a long number of steps; the
difference / the difference in steps is the bytes per step, free of start-up traffic.

- ``tensorflow``: TensorFlow's own MultiWorkerMirroredStrategy and its custom-training-loop
  tutorial, no tfdist in the process (the table's gradient is an IndexedSlices, which TF
  all-gathers as its rows);
- ``none``, ``fp16``, ``int8``, ``topk+ef``: tfdist's MultiWorkerMirroredStrategy and
  `model.fit` with `DistributedOptimizer`; CommStats' estimate beside the measurement.

    python benchmarks/embedding_bytes.py [--quick]

Writes benchmarks/results/embedding_bytes.json, .md and .png.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

VOCAB, DIM, LENGTH, BATCH = 200_000, 64, 64, 32
EXCHANGES = {
    "tensorflow": None,
    "none": {"name": "none"},
    "fp16": {"name": "fp16"},
    "int8": {"name": "int8"},
    "topk+ef": {"name": "topk", "ratio": 0.01, "error_feedback": True, "min_size": 0},
}


# --- the job (run on every task) ----------------------------------------------------------

def tokens(seed, rows):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = np.minimum(rng.zipf(1.3, (rows, LENGTH)) - 1, VOCAB - 1).astype("int32")
    y = (x[:, 0] % 2).astype("int32")
    return x, y


def model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((LENGTH,), dtype="int32"),
                             keras.layers.Embedding(VOCAB, DIM),
                             keras.layers.GlobalAveragePooling1D(),
                             keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])


def job(args):
    import tensorflow as tf

    if args.exchange == "tensorflow":  # the strategy before any other TensorFlow op
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        import tfdist

        strategy = tfdist.get_strategy("multi_worker_mirrored")
    x, y = tokens(0, BATCH * args.steps)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    if args.exchange == "tensorflow":
        logs = _tensorflow_loop(strategy, data)
    else:
        logs = _tfdist_fit(strategy, data, EXCHANGES[args.exchange])
    if _is_first_worker():
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "metrics.json"), "w") as f:
            json.dump(logs, f)


def _is_first_worker():
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    return config.get("task", {}).get("index", 0) == 0


def _tensorflow_loop(strategy, data):
    import keras
    import tensorflow as tf

    with strategy.scope():
        net, optimizer = model(), keras.optimizers.SGD(0.1)

    @tf.function
    def step(batch):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    keras.losses.sparse_categorical_crossentropy(y, net(x), from_logits=True),
                    global_batch_size=BATCH)
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    times = []
    for batch in strategy.experimental_distribute_dataset(data):
        began = time.perf_counter()
        float(step(batch))
        times.append(time.perf_counter() - began)
    return {"step_seconds": times}


def _tfdist_fit(strategy, data, compression):
    import keras

    import tfdist

    StepTimes = _step_times()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope():
        net = model()
        net.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1), compression),
                    loss)
    stats, timer = tfdist.callbacks.CommStats(), StepTimes()
    history = net.fit(data, epochs=1, verbose=0,
                      callbacks=[tfdist.callbacks.TrainingHooks(), stats, timer])
    return {**{k: float(v[-1]) for k, v in history.history.items()},
            "step_seconds": timer.seconds}


def _step_times():
    import keras

    class StepTimes(keras.callbacks.Callback):
        """Wall seconds of each training step (batch begin to batch end)."""

        def on_train_begin(self, logs=None):
            self.seconds = []

        def on_train_batch_begin(self, batch, logs=None):
            self.began = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self.began)

    return StepTimes


# --- the measurement ----------------------------------------------------------------------

def measure(exchange, short, long):
    from measure.netns import ROOT, run_in_namespace

    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"tfdist-embedding-{exchange}-"))
    try:
        config = workdir / "job.yaml"
        config.write_text("cluster: {worker: 2}\nstrategy: {name: multi_worker_mirrored, "
                          "communication: ring}\n")
        runs = {}
        for steps in (short, long):
            out = workdir / f"out-{steps}"
            command = [sys.executable, str(ROOT / "benchmarks" / "embedding_bytes.py"), "--job",
                       "--exchange", exchange, "--steps", steps, "--output_dir", out]
            runs[steps] = run_in_namespace(config, command, out, workdir)
        per_step = (runs[long][0] - runs[short][0]) / (long - short)
        logs = runs[long][1]
        seconds = statistics.median(logs["step_seconds"][2:])  # after the traces
        estimate = 2 * logs["comm_bytes_per_worker"] if "comm_bytes_per_worker" in logs else None
        row = {"exchange": exchange, "loopback_bytes_per_step": per_step,
               "seconds_per_step": seconds, "commstats_bytes_per_step": estimate,
               "compression_ratio": logs.get("compression_ratio"),
               "compression_ratio_vs_tensorflow": logs.get("compression_ratio_vs_tensorflow")}
        print(f"{exchange:10s} {per_step / 1e6:8.3f} MB/step {seconds:6.3f} s/step", flush=True)
        return row
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def markdown(results):
    rows = results["rows"]
    tf_bytes = next(r for r in rows if r["exchange"] == "tensorflow")["loopback_bytes_per_step"]
    dense = 2 * 4 * VOCAB * DIM  # what a dense all-reduce of the table alone sends (2 workers)
    lines = [f"Embedding {VOCAB:,} x {DIM}, 2 workers, global batch {BATCH} x {LENGTH} tokens "
             f"(Zipf 1.3), loopback in a private namespace, steps {results['steps']}; "
             f"the table alone all-reduced densely would send {dense / 1e6:.1f} MB a step.",
             "", "| exchange | MB/step (loopback) | vs TensorFlow's own | CommStats MB/step | "
             "CommStats vs measured | ratio vs dense tables | ratio vs TensorFlow | s/step |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        estimate = r["commstats_bytes_per_step"]
        gap = "" if not estimate else f"{estimate / r['loopback_bytes_per_step'] - 1:+.1%}"
        ratio = r.get("compression_ratio")
        versus = r.get("compression_ratio_vs_tensorflow")
        lines.append(
            f"| {r['exchange']} | {r['loopback_bytes_per_step'] / 1e6:.3f} | "
            f"{r['loopback_bytes_per_step'] / tf_bytes:.2f}x | "
            f"{'' if not estimate else f'{estimate / 1e6:.3f}'} | {gap} | "
            f"{'' if ratio is None else f'{ratio:.0f}x'} | "
            f"{'' if versus is None else f'{versus:.2f}x'} | {r['seconds_per_step']:.3f} |")
    none = next(r for r in rows if r["exchange"] == "none")["loopback_bytes_per_step"]
    lines += ["", f"tfdist `none` against TensorFlow's own strategy: {none / tf_bytes:.3f}x the "
              f"bytes ({'met' if none <= tf_bytes * 1.01 else 'MISSED'}: no more than TF's)."]
    return "\n".join(lines) + "\n"


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r["exchange"] for r in rows], [r["loopback_bytes_per_step"] / 1e6 for r in rows],
           color=["#888888"] + ["#3c8dbc"] * (len(rows) - 1))
    ax.axhline(2 * 4 * VOCAB * DIM / 1e6, color="#c0392b", linestyle="--",
               label="the table all-reduced densely")
    ax.set_yscale("log")
    ax.set_ylabel("MB per step (loopback, 2 workers)")
    ax.set_title(f"Embedding {VOCAB:,} x {DIM}: bytes on the wire per step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", action="store_true", help="(internal) run one task's job")
    parser.add_argument("--exchange", choices=list(EXCHANGES), default="none")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--output_dir")
    parser.add_argument("--quick", action="store_true", help="fewer steps per run")
    args = parser.parse_args()
    if args.job:
        return job(args)
    if os.geteuid() != 0 or not shutil.which("unshare"):
        sys.exit("this benchmark needs root and unshare(1) for a private network namespace")
    short, long = (4, 12) if args.quick else (5, 25)
    results = {"steps": [short, long], "vocab": VOCAB, "dim": DIM,
               "rows": [measure(name, short, long) for name in EXCHANGES]}
    from time_to_accuracy import RESULTS, write_files

    (RESULTS / "embedding_bytes.json").write_text(json.dumps(results, indent=2))
    write_files("embedding_bytes", results, markdown, plot)


if __name__ == "__main__":
    main()
