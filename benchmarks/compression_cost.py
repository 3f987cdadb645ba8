"""Compute cost of each compressor: encode + decode time as a fraction of a training step.

On the UNet example's gradients (the same shapes, fused as tfdist fuses them), one
replica, compiled with tf.function: the time of compress + decompress (and PowerSGD's
matrix products and orthonormalisation) against the time of one UNet training step at
the per-worker batch of the 2-worker demo. No network is involved.

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


def timed(function, repeats=30):
    function()  # trace and warm up
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats


def step_time(model, batch=16):
    model.compile(keras.optimizers.Adam(0.003),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = shapes.shapes_dataset(0, 32, num_examples=batch).batch(batch).cache().repeat()
    model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=30, epochs=1, verbose=0)
    return (time.perf_counter() - start) / 30


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
    lines = ["| compressor | compress + decompress | share of a step | limit |", "|---|---|---|---|"]
    for r in rows:
        limit = "" if r["limit"] is None else (f"<= {r['limit']:.0%} "
                                               + ("met" if r["meets_limit"] else "MISSED"))
        lines.append(f"| {r['name']} | {r['seconds'] * 1e3:.2f} ms | "
                     f"{r['fraction_of_step']:.1%} | {limit} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compression_cost.json").write_text(json.dumps(
        {"step_seconds": step, "rows": rows, "cpus": os.cpu_count()}, indent=2))
    (RESULTS / "compression_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
