"""Quality at equal samples: final training loss and validation mean IoU of the UNet for
every method and seed, against uncompressed synchronous training.

Runs in one process on 2 logical CPUs (MirroredStrategy: 2 replicas exchange exactly as
2 workers do, without the launch cost), `tfdist.Trainer` with each method's hook; every
method sees the same batches for a given seed.

    python benchmarks/quality.py --out results.json [--quick] [--methods none fp16 ...]
    python benchmarks/quality.py --table results.json [more.json ...] > results.md
"""

import argparse
import json
import os
import pathlib
import sys
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "unet_segmentation"))

import tfdist  # noqa: E402
from measure.methods import METHODS  # noqa: E402

QUALITY_METHODS = [m for m, spec in METHODS.items() if spec is not None]
QUICK_METHODS = ["none", "sign+EF", "sign", "topk+EF"]  # topk without EF: the full run
#: The inner optimizer's learning rate by default: Adam's is the UNet example's; momentum
#: SGD's (beta_1 its momentum) asks whether the error-fed compressors' gap is Adam's.
LEARNING_RATES = {"adam": 0.003, "momentum": 0.1}


def positive_rate(text):
    """argparse type: a positive, finite learning rate."""
    value = float(text)
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def train_one(strategy, method, seed, steps, epochs, warmup=None, start_step=None, beta_1=0.9,
              policy="float32", optimizer="adam", learning_rate=None, **averager_options):
    import keras

    import data
    import metrics
    from model import unet

    spec = METHODS[method]
    hooks = []
    if "compression" in spec:
        section = spec["compression"]
        if start_step is not None and isinstance(section, dict):  # --start_step: a warm-up
            section = {**section, "start_step": start_step}
        hooks.append(tfdist.compression.build(section))
    if "local_sgd" in spec:
        warmup = steps * epochs // 2 if warmup is None else warmup  # post-local SGD
        hooks.append(tfdist.local_sgd.ModelAverager(**{"warmup_steps": warmup,  # the method's own
                                                       **spec["local_sgd"]}, **averager_options))
    train = types.SimpleNamespace(dataset="synthetic", seed=seed, image_size=32,
                                  num_examples=4096, batch_size=32)
    keras.utils.set_random_seed(seed)
    keras.mixed_precision.set_global_policy(policy)
    with strategy.scope():
        model = unet(32, 4, 16, 3, 0.1)
    keras.mixed_precision.set_global_policy("float32")
    learning_rate = learning_rate or LEARNING_RATES[optimizer]
    inner = (keras.optimizers.Adam(learning_rate, beta_1=beta_1) if optimizer == "adam" else
             keras.optimizers.SGD(learning_rate, momentum=beta_1))
    trainer = tfdist.Trainer(model, inner,
                             keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                             strategy=strategy, metrics=metrics.segmentation_metrics(4),
                             hooks=hooks)
    started = time.perf_counter()
    history = trainer.fit(data.dataset_fn(train, "train"), epochs=epochs, steps_per_epoch=steps,
                          validation_data=data.dataset_fn(train, "validation"),
                          validation_steps=4, verbose=0).history
    compression = hooks[0].get_config() if "compression" in spec and spec["compression"] != \
        "auto" else None
    return {"method": method, "seed": seed, "steps": steps * epochs, "compression": compression,
            "adam_beta_1": beta_1, "policy": policy, "optimizer": optimizer,
            "learning_rate": learning_rate,
            "loss": history["loss"][-1], "val_mean_iou": history["val_mean_iou"][-1],
            "loss_curve": history["loss"], "seconds": time.perf_counter() - started}


def variant(row):
    """(method, the step compression started, beta_1, dtype policy, optimizer and its
    learning rate) of a result row."""
    start = (row.get("compression") or {}).get("start_step", 0)
    optimizer = row.get("optimizer", "adam")
    return (row["method"], start, row.get("adam_beta_1", 0.9), row.get("policy", "float32"),
            optimizer, row.get("learning_rate") or LEARNING_RATES[optimizer])


def baseline(groups, key):
    """The rows of `none` to compare variant `key` with: same optimizer and learning rate
    where they were run, else the default's."""
    default = ("none", 0, 0.9, "float32", "adam", LEARNING_RATES["adam"])
    return groups.get(("none", 0, 0.9, "float32", *key[4:]), groups.get(default, []))


def table(rows, mean_iou_points=1.0, loss_fraction=0.10):
    """Markdown: per variant, final validation mean IoU per seed and their mean, the loss,
    and both against `none` (the issue's target: within `mean_iou_points` points of mean
    IoU and `loss_fraction` of the final training loss)."""
    import statistics

    groups = {}
    for row in rows:
        groups.setdefault(variant(row), []).append(row)
    default = {r["seed"]: r for r in baseline(groups, ("none", 0, 0.9, "float32", "adam",
                                                        LEARNING_RATES["adam"]))}
    if not default:
        raise SystemExit("no rows of method none to compare with")
    base_iou = statistics.mean(r["val_mean_iou"] for r in default.values())
    base_loss = statistics.mean(r["loss"] for r in default.values())
    out = ["| method | optimizer | policy | compressed from step | beta_1 | val mean IoU per "
           "seed | mean | spread (sd) | Δ vs none, same seeds (points) | final train loss | "
           "vs none | within target |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, group in groups.items():
        method, start, beta_1, policy, optimizer, learning_rate = key
        base = {r["seed"]: r for r in baseline(groups, key)}
        group = sorted(group, key=lambda r: r["seed"])
        ious = [r["val_mean_iou"] for r in group]
        iou, loss = statistics.mean(ious), statistics.mean(r["loss"] for r in group)
        spread = statistics.stdev(ious) if len(ious) > 1 else float("nan")
        same = [base[r["seed"]] for r in group if r["seed"] in base]  # none on these seeds
        delta = 100 * (iou - statistics.mean(b["val_mean_iou"] for b in same))
        ratio = loss / statistics.mean(b["loss"] for b in same) - 1
        ok = delta >= -mean_iou_points and ratio <= loss_fraction
        out.append(f"| {method} | {optimizer} {learning_rate:g} | {policy} | "
                   f"{start if method != 'none' else '—'} | {beta_1:g} | "
                   + " / ".join(f"{v:.3f}" for v in ious)
                   + f" | {iou:.3f} | {spread:.3f} | {delta:+.1f} | {loss:.4f} | "
                   f"{100 * ratio:+.0f}% | {'yes' if ok else 'no'} |")
    seeds = sorted({r["seed"] for r in rows})
    steps = sorted({r["steps"] for r in rows})
    return "\n".join([f"UNet, 2 replicas (2 logical CPUs), {'/'.join(map(str, steps))} steps "
                      f"of global batch 32, seeds {seeds}; none: mean IoU {base_iou:.3f}, "
                      f"loss {base_loss:.4f}.", ""] + out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    parser.add_argument("--table", nargs="+", metavar="JSON",
                        help="print the markdown table of these result files and stop")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--methods", nargs="*", help="default: all (--quick: the main ones)")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--steps", type=int, help="steps per epoch")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--warmup", type=int, help="local SGD warm-up (default: half the steps)")
    parser.add_argument("--average_optimizer_state", action="store_true")
    parser.add_argument("--start_step", type=int,
                        help="compress from this step on (default: each method's own)")
    parser.add_argument("--beta_1", type=float, default=0.9,
                        help="Adam's momentum (0 for DGC's momentum correction: its own)")
    parser.add_argument("--optimizer", choices=sorted(LEARNING_RATES), default="adam",
                        help="the inner optimizer (momentum: SGD with momentum beta_1)")
    parser.add_argument("--learning_rate", type=positive_rate,
                        help=f"default: {LEARNING_RATES}")
    parser.add_argument("--policy", default="float32",
                        help="Keras dtype policy of the model (e.g. mixed_bfloat16)")
    args = parser.parse_args()
    if args.table:
        print(table([r for f in args.table for r in json.loads(pathlib.Path(f).read_text())]),
              end="")
        return
    if not args.out:
        parser.error("--out is required to train")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)  # one core per replica, as
    tf.config.threading.set_inter_op_parallelism_threads(2)  # in the worker benchmarks
    strategy = tfdist.get_strategy("mirrored", logical_cpus=2)
    steps, epochs = (24, 1) if args.quick else (40, 4)
    steps, epochs = args.steps or steps, args.epochs or epochs
    methods = args.methods or (QUICK_METHODS if args.quick else QUALITY_METHODS)
    rows = []
    for seed in args.seeds:
        for method in methods:
            rows.append(train_one(strategy, method, seed, steps, epochs, args.warmup,
                                  args.start_step, args.beta_1, args.policy, args.optimizer,
                                  args.learning_rate,
                                  average_optimizer_state=args.average_optimizer_state))
            print(f"quality {method:12s} {args.policy} {args.optimizer} seed {seed}: "
                  f"loss {rows[-1]['loss']:.4f}, "
                  f"val mean IoU {rows[-1]['val_mean_iou']:.3f} "
                  f"({rows[-1]['seconds']:.0f}s)", flush=True)
            pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))  # so far


if __name__ == "__main__":
    main()
