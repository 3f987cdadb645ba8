"""Compute cost of each compressor: encode + decode time as a fraction of a training step.

On the UNet example's gradients (the same shapes, fused as tfdist fuses them), one
replica, compiled with tf.function: the time of compress + decompress (and PowerSGD's
matrix products and orthonormalisation) against the time of one UNet training step at
the per-worker batch of the 2-worker demo (the conservative denominator: one process has
both cores), and, when benchmarks/compression_bytes.py has run, against the measured
step of the real 2-worker job. No network is involved.

    python benchmarks/compression_cost.py

Writes benchmarks/results/compression_cost.json and .md.
"""

import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "unet_segmentation"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import shapes  # noqa: E402
from model import unet  # noqa: E402
from tfdist.compression import build  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SETTINGS = {"fp16": {}, "bf16": {}, "int8": {}, "qsgd": {"levels": 15}, "sign": {},
            "topk": {"ratio": 0.01}, "randomk": {"ratio": 0.01}, "powersgd": {"rank": 4}}
LIMITS = {"fp16": 0.05, "bf16": 0.05, "int8": 0.05, "sign": 0.05, "topk": 0.15, "powersgd": 0.15}


ROUNDS = 5  # medians over rounds: this 2-core machine is noisy


def timed(function, repeats=20):
    """Median seconds per call over ROUNDS rounds of `repeats` calls."""
    function()  # trace and warm up
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(repeats):
            function()
        rounds.append((time.perf_counter() - start) / repeats)
    return float(np.median(rounds))


def step_time(model, batch=16):
    model.compile(keras.optimizers.Adam(0.003),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = shapes.shapes_dataset(0, 32, num_examples=batch).batch(batch).cache().repeat()
    model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)
    return timed(lambda: model.fit(data, steps_per_epoch=10, epochs=1, verbose=0), 1) / 10


def exchange_time(model, name):
    hook = build(name, min_size=0, error_feedback=name in ("sign", "topk", "randomk", "powersgd"),
                 **SETTINGS[name])
    variables = model.trainable_variables
    hook.build(tf.distribute.get_strategy(), variables)
    grads = [tf.random.normal(v.shape) for v in variables]
    run = tf.function(lambda: tf.distribute.get_strategy().run(
        lambda: hook.exchange(grads, variables, tf.constant(0, tf.int64))))
    plain = tf.function(lambda: [tf.identity(g) for g in grads])  # the call overhead alone
    return timed(run) - timed(plain)


def two_worker_step():
    """Seconds per step of the uncompressed 2-worker job measured by compression_bytes.py."""
    path = RESULTS / "compression_bytes.json"
    if not path.exists():
        return None
    rows = json.loads(path.read_text())["rows"]
    return next((r.get("seconds_per_step") for r in rows if r["name"] == "none"), None)


def main():
    keras.utils.set_random_seed(0)
    model = unet(32, 4, 16, 3, 0.1)
    step = step_time(model)
    rows = []
    for name in SETTINGS:
        cost = max(exchange_time(model, name), 0.0)
        limit = LIMITS.get(name)
        rows.append({"name": name, "seconds": cost, "fraction_of_step": cost / step,
                     "limit": limit, "meets_limit": None if limit is None else cost / step <= limit})
        print(f"{name:9s} {cost * 1e3:7.2f} ms = {cost / step:6.1%} of a {step * 1e3:.0f} ms step",
              flush=True)
    two_workers = two_worker_step()
    lines = [f"Step: {step * 1e3:.0f} ms on one process (batch 16, all cores); "
             + (f"{two_workers * 1e3:.0f} ms on 2 workers (compression_bytes.json, `none`)."
                if two_workers else "run compression_bytes.py for the 2-worker step."), "",
             "| compressor | compress + decompress | share of a 1-process step | limit | "
             "share of a 2-worker step |", "|---|---|---|---|---|"]
    for r in rows:
        limit = "" if r["limit"] is None else (f"<= {r['limit']:.0%} "
                                               + ("met" if r["meets_limit"] else "MISSED"))
        share = f"{r['seconds'] / two_workers:.1%}" if two_workers else ""
        lines.append(f"| {r['name']} | {r['seconds'] * 1e3:.2f} ms | "
                     f"{r['fraction_of_step']:.1%} | {limit} | {share} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compression_cost.json").write_text(json.dumps(
        {"step_seconds": step, "rows": rows, "cpus": os.cpu_count()}, indent=2))
    (RESULTS / "compression_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
