"""Where DiLoCo's outer optimizer starts to matter: final quality against the period.

DiLoCo (Douillard et al. 2023) applies the replicas' mean change since the last
synchronisation with an outer Nesterov step (learning rate 0.7, momentum 0.9); plain local
SGD (Stich 2019) just averages. Both, after the same 80 synchronous steps, train the UNet
example over the full schedule (2 workers as 2 hosts on the 1 Gbit/s link of
time_to_accuracy.py, 480 steps) at periods 8 to 128; period 32 comes from the time to
accuracy runs. Quality does not depend on the link, so this runs on the fastest.

    sudo python benchmarks/diloco_periods.py [--seeds 0 1] [--periods 8 16 64 128]

Writes benchmarks/results/diloco_periods.{json,md,png}.
"""

import argparse
import json
import shutil
import statistics
import tempfile

import time_to_accuracy
from time_to_accuracy import FAST, PLANS, RESULTS

PERIODS = (8, 16, 32, 64, 128)


def names(period):
    """(plain local SGD, DiLoCo) method names at `period` (benchmarks/measure/methods.py)."""
    return f"local SGD {period}, warm-up 80", f"DiLoCo {period}"


def table(runs):
    """{period: {method: [final mean IoU per seed], ...}} for the periods with both methods."""
    out = {}
    for period in PERIODS:
        got = {m: [r["final_val_mean_iou"] for r in runs
                   if r["method"] == m and r["rate_bits"] == FAST] for m in names(period)}
        if all(got.values()):
            out[period] = got
    return out


def markdown(runs):
    """Final mean IoU (mean over seeds) and loss per period, and DiLoCo's gain."""
    lines = ["| period | averages after warm-up | local SGD final mIoU | DiLoCo final mIoU "
             "| DiLoCo − local SGD | local SGD final loss | DiLoCo final loss | loss, DiLoCo "
             "vs local SGD |", "|---|---|---|---|---|---|---|---|"]
    loss = lambda m: statistics.mean(  # noqa: E731
        r["final_loss"] for r in runs if r["method"] == m and r["rate_bits"] == FAST)
    for period, got in table(runs).items():
        plain, diloco = (statistics.mean(got[m]) for m in names(period))
        seeds = ", ".join(f"{v:.3f}" for v in got[names(period)[1]])
        lines.append(f"| {period} | {400 // period} | {plain:.3f} | {diloco:.3f} ({seeds}) "
                     f"| {100 * (diloco - plain):+.1f} pts | {loss(names(period)[0]):.4f} "
                     f"| {loss(names(period)[1]):.4f} "
                     f"| {loss(names(period)[1]) / loss(names(period)[0]) - 1:+.0%} |")
    return "\n".join(lines) + "\n"


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table(runs)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, label in enumerate(("plain local SGD", "DiLoCo (Nesterov 0.7, 0.9)")):
        ax.plot(list(rows), [statistics.mean(got[names(p)[i]]) for p, got in rows.items()],
                marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("period (steps between synchronisations)")
    ax.set_ylabel("final validation mean IoU")
    ax.set_title("Local SGD against DiLoCo, after 80 synchronous steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--periods", nargs="+", type=int, default=[8, 16, 64, 128])
    args = parser.parse_args()
    path = RESULTS / "diloco_periods.json"
    saved = json.loads(path.read_text())["runs"] if path.exists() else []
    tta = (time_to_accuracy.saved() or {"runs": []})["runs"]
    methods = [m for p in args.periods for m in names(p)]
    done = {(r["method"], r["seed"]) for r in saved}
    workdir = tempfile.mkdtemp(prefix="tfdist-periods-")
    try:
        for seed in args.seeds:
            for method in methods:
                if (method, seed) in done:
                    continue
                saved.append(time_to_accuracy.run_one(method, FAST, seed, PLANS["full"], workdir))
                print(f"{method} seed {seed}: final mIoU {saved[-1]['final_val_mean_iou']:.3f}",
                      flush=True)
                path.write_text(json.dumps({"runs": saved}, indent=1))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    runs = saved + [r for r in tta if r["method"] in names(32)]
    (RESULTS / "diloco_periods.md").write_text(markdown(runs))
    plot(runs, RESULTS / "diloco_periods.png")
    print(markdown(runs))


if __name__ == "__main__":
    main()
