"""Why do the error-fed compressors end with a higher training loss? (issue 33 item 4)

The UNet's full schedule (480 steps) in one process on 2 logical CPUs (quality.py's
`train_one`: each method sees the same batches for a seed), varying one thing at a time:

- the inner optimizer: Adam (the example's) against SGD with momentum 0.9 — if Adam's
  per-coordinate scale were what error feedback's bursts upset (the case 1-bit Adam makes),
  the gap would close under momentum SGD;
- Adam's learning rate, halved: a residual released late hurts less with smaller steps;
- where the compression sits: outside the optimizer, on what the workers' models moved
  (DiLoCo's pseudo-gradient, compressed by top-k with error feedback: SparseLoCo's recipe,
  Sarfi et al. 2025), so that Adam sees each worker's own uncompressed gradient.

    python benchmarks/error_feedback.py [--seeds 0] [--from-results]

Writes benchmarks/results/error_feedback.json, .md (quality.py's table: loss against
`none` under the same optimizer and learning rate) and .png (the training-loss curves).
"""

import argparse
import json
import pathlib

import quality

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
#: (label, methods, train_one options): each group against its own `none`
GRID = (
    ("Adam 0.003", ("none", "topk+EF", "powersgd+EF"), {}),
    ("momentum SGD 0.1", ("none", "topk+EF", "powersgd+EF"), {"optimizer": "momentum"}),
    ("Adam 0.0015", ("none", "topk+EF"), {"learning_rate": 0.0015}),
    ("Adam 0.003, compressed outside the optimizer", ("SparseLoCo 4, top 10%",
                                                      "SparseLoCo 8, top 10%"), {}),
)


def measure(seeds):
    import tensorflow as tf

    import tfdist

    tf.config.threading.set_intra_op_parallelism_threads(1)  # as quality.py: one core per
    tf.config.threading.set_inter_op_parallelism_threads(2)  # replica
    strategy = tfdist.get_strategy("mirrored", logical_cpus=2)
    rows = []
    for seed in seeds:
        for _, methods, options in GRID:
            for method in methods:
                rows.append(quality.train_one(strategy, method, seed, 40, 12, **options))
                print(f"{method} {options} seed {seed}: loss {rows[-1]['loss']:.4f}",
                      flush=True)
                (RESULTS / "error_feedback.json").write_text(json.dumps(rows, indent=1))
    return rows


def lag(row, base, epoch=8):
    """Epochs `row` took to reach the training loss `base` had after `epoch`, over `epoch`
    (a step lag: 1.0 keeps up), or None if it never did."""
    target = base["loss_curve"][epoch - 1]
    reached = next((e for e, loss in enumerate(row["loss_curve"], 1) if loss <= target), None)
    return None if reached is None else reached / epoch


def lags(rows, epoch=8):
    """Markdown: each method's step lag behind `none` under the same optimizer, seed and
    learning rate."""
    base = {(quality.variant(r)[4:], r["seed"]): r for r in rows if r["method"] == "none"}
    out = [f"Steps each method needed to reach the training loss `none` had after epoch "
           f"{epoch} of 12, over {epoch} epochs' (1.00: keeps up; from the loss per epoch):", "",
           "| method | optimizer | seed | step lag |", "|---|---|---|---|"]
    for row in rows:
        key = quality.variant(row)
        mine = base.get((key[4:], row["seed"]))
        if row["method"] == "none" or mine is None:
            continue
        got = lag(row, mine, epoch)
        out.append(f"| {row['method']} | {key[4]} {key[5]:g} | {row['seed']} | "
                   + (f"{got:.2f}×" if got else "not within 12 epochs") + " |")
    return "\n".join(out) + "\n"


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        key = quality.variant(row)
        ax.plot(range(1, len(row["loss_curve"]) + 1), row["loss_curve"],
                label=f"{row['method']}, {key[4]} {key[5]:g}, seed {row['seed']}",
                linestyle="-" if key[4] == "adam" else "--")
    ax.set(xlabel="epoch (40 steps)", ylabel="training loss", yscale="log",
           title="Error-fed compressors against none, by optimizer")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--from-results", action="store_true",
                        help="only rewrite the .md and .png from the saved .json")
    args = parser.parse_args()
    rows = (json.loads((RESULTS / "error_feedback.json").read_text()) if args.from_results
            else measure(args.seeds))
    (RESULTS / "error_feedback.md").write_text(
        "# Why the error-fed compressors end higher\n\n" + quality.table(rows) + "\n"
        + lags(rows))
    plot(rows, RESULTS / "error_feedback.png")
    print(quality.table(rows), lags(rows), sep="\n")


if __name__ == "__main__":
    main()
