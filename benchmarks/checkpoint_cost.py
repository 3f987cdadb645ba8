"""What backups cost: the UNet demo's epoch with `tfdist.callbacks.BackupAndRestore` saving
every N steps, against the same epoch with no backup.

One process, 2 replicas on 2 logical CPUs (MirroredStrategy), the demo's model (32x32,
16 filters, depth 3) and batch (32), `model.fit` of 80 steps (one demo epoch). Each backup
is a `tfdist.checkpoint.CheckpointStore` checkpoint of the weights and the optimizer
state: written to a directory of its own, fsynced, renamed into place, then the `latest`
pointer switched (a kill at any moment leaves a good backup). The variants alternate, so
the machine's drift falls on all of them alike; the cost of one save is the difference to
no backup divided by the number of saves (every step: 80).

    python benchmarks/checkpoint_cost.py [--repeats 3]

Writes benchmarks/results/checkpoint_cost.{json,md,png}.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent / "examples" / "unet_segmentation"))
STEPS = 80  # one epoch of the demo
EVERY = (None, 80, 20, 5, 1)  # None: no backup


def measure(repeats):
    import keras

    import data
    import tfdist
    from model import unet

    strategy = tfdist.get_strategy("mirrored", logical_cpus=2)
    train = types.SimpleNamespace(dataset="synthetic", seed=0, image_size=32,
                                  num_examples=4096, batch_size=32)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = unet(32, 4, 16, 3, 0.1)
        model.compile(keras.optimizers.Adam(0.003),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = strategy.distribute_datasets_from_function(data.dataset_fn(train, "train"))
    model.fit(dataset, epochs=1, steps_per_epoch=10, verbose=0)  # traced: not measured
    class TimedBackup(tfdist.callbacks.BackupAndRestore):
        """Times each save (averaging nothing: no local SGD here; the write, fsyncs and
        the switch of `latest`)."""

        def _save_model(self):
            began = time.perf_counter()
            super()._save_model()
            saves.append(time.perf_counter() - began)

    seconds = {every: [] for every in EVERY}
    size, saves = None, []
    for _ in range(repeats):
        for every in EVERY:
            with tempfile.TemporaryDirectory() as backup:
                callbacks = [] if every is None else [TimedBackup(
                    backup, save_freq=every, delete_checkpoint=False)]
                began = time.perf_counter()
                model.fit(dataset, epochs=1, steps_per_epoch=STEPS, verbose=0,
                          callbacks=callbacks)
                seconds[every].append(time.perf_counter() - began)
                if every == 1:
                    size = _bytes_of_one_checkpoint(pathlib.Path(backup))
    return seconds, size, saves


def _bytes_of_one_checkpoint(directory):
    latest = (directory / "latest").read_text().strip()
    return sum(p.stat().st_size for p in (directory / latest).rglob("*") if p.is_file())


def report(seconds, size, saves):
    base = statistics.median(seconds[None])
    per_save = statistics.median(saves)
    rows = []
    for every in EVERY:
        median = statistics.median(seconds[every])
        count = 0 if every is None else STEPS // every
        rows.append({"every": every, "saves": count, "epoch_seconds": median,
                     "runs": seconds[every], "overhead": median / base - 1,
                     "predicted_overhead": count * per_save / base})
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "checkpoint_cost.json").write_text(json.dumps(
        {"steps": STEPS, "checkpoint_bytes": size, "save_seconds": saves, "rows": rows},
        indent=1))
    lines = ["# What backups cost (BackupAndRestore on the UNet demo)", "",
             f"`benchmarks/checkpoint_cost.py`: {STEPS} steps of `model.fit` (one demo epoch), "
             "2 replicas on 2 logical CPUs, the demo's UNet and batch; median of "
             f"{len(seconds[None])} alternating runs. One checkpoint (weights + Adam state): "
             f"{size / 1e6:.2f} MB.", "",
             "| backup | saves per epoch | epoch seconds (runs) | vs no backup | saves x "
             "median save / epoch |", "|---|---|---|---|---|"]
    for row in rows:
        name = "none" if row["every"] is None else f"every {row['every']} steps"
        runs = " / ".join(f"{r:.2f}" for r in row["runs"])
        lines.append(f"| {name} | {row['saves']} | {row['epoch_seconds']:.2f} ({runs}) | "
                     f"{row['overhead']:+.1%} | {row['predicted_overhead']:+.1%} |")
    lines += ["", f"One save takes {per_save * 1e3:.0f} ms (median of {len(saves)}, timed "
              f"around the callback's save; {min(saves) * 1e3:.0f}-{max(saves) * 1e3:.0f} ms), "
              f"against a step of {rows[0]['epoch_seconds'] / STEPS * 1e3:.0f} ms; epoch times "
              "vary by more than a few saves from run to run on this 2-core machine (the "
              "last column is the cost the saves alone predict). Preemption needs no periodic "
              "save at all: a SIGTERM saves once, after the next step; periodic saves bound "
              "what a SIGKILL (no warning) loses."]
    (RESULTS / "checkpoint_cost.md").write_text("\n".join(lines) + "\n")
    plot(rows)
    print("\n".join(lines))


def plot(rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = ["none" if r["every"] is None else f"every {r['every']}" for r in rows]
    ax.bar(names, [100 * r["overhead"] for r in rows], color="#3c8dbc")
    ax.set_ylabel("epoch time vs no backup (%)")
    ax.set_xlabel("backup save frequency (steps)")
    ax.set_title("BackupAndRestore on the UNet demo (80 steps)")
    fig.tight_layout()
    fig.savefig(RESULTS / "checkpoint_cost.png", dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per variant")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1. Received: {args.repeats}")
    report(*measure(args.repeats))


if __name__ == "__main__":
    main()
