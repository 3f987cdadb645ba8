"""Do gradient buckets overlap the exchange with the backward pass? Step time of `none`
on the UNet example, 2 workers as 2 hosts on a capped link (slow_network.py), with one
fused buffer against buckets of several sizes, in alternating repeats.

    sudo python benchmarks/buckets.py [--rate 100] [--repeats 3] [--steps 40]

Writes benchmarks/results/buckets.json, .md and .png.
"""

import argparse
import json
import shutil
import statistics
import tempfile

import slow_network
from netns import ROOT

RESULTS = ROOT / "benchmarks" / "results"
SIZES = (0, 1 << 17, 1 << 19, 1 << 20)  # bytes per bucket; 0: one fused buffer


def measure(rate_bits, repeats, steps):
    rows = []
    workdir = tempfile.mkdtemp(prefix="tfdist-buckets-")
    try:
        for repeat in range(repeats):
            for size in SIZES if repeat % 2 == 0 else reversed(SIZES):
                metrics = slow_network.run(
                    "none", rate_bits, steps, workdir, tag=f"-{size}",
                    extra=f"compression: {{name: none, bucket_bytes: {size}, min_size: 1024}}\n")
                rows.append({"bucket_bytes": size, "repeat": repeat,
                             "seconds_per_step": metrics["seconds_per_step"]})
                print(f"{rate_bits / 1e6:.0f} Mbit/s bucket {size:>8} B repeat {repeat}: "
                      f"{metrics['seconds_per_step']:.3f} s/step", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def summary(rows):
    one = statistics.median(r["seconds_per_step"] for r in rows if r["bucket_bytes"] == 0)
    out = []
    for size in SIZES:
        times = [r["seconds_per_step"] for r in rows if r["bucket_bytes"] == size]
        out.append({"bucket_bytes": size, "median": statistics.median(times),
                    "min": min(times), "max": max(times),
                    "vs_one_buffer": statistics.median(times) / one - 1})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=100, help="link speed, Mbit/s")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    rate = int(args.rate * 1e6)
    rows = measure(rate, args.repeats, args.steps)
    result = {"rate_bits": rate, "steps": args.steps, "rows": rows, "summary": summary(rows)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "buckets.json").write_text(json.dumps(result, indent=1))
    lines = [f"`none` on the UNet, 2 hosts at {args.rate:.0f} Mbit/s, {args.steps} steps, "
             f"{args.repeats} alternating repeats: wall seconds per step after the first 10.", "",
             "| bucket | median s/step | min | max | vs one buffer |", "|---|---|---|---|---|"]
    for r in result["summary"]:
        name = "one buffer" if r["bucket_bytes"] == 0 else f"{r['bucket_bytes'] // 1024} KiB"
        lines.append(f"| {name} | {r['median']:.3f} | {r['min']:.3f} | {r['max']:.3f} | "
                     f"{r['vs_one_buffer']:+.1%} |")
    (RESULTS / "buckets.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    names = ["one" if r["bucket_bytes"] == 0 else f"{r['bucket_bytes'] // 1024} KiB"
             for r in result["summary"]]
    ax.bar(names, [r["median"] for r in result["summary"]], color="#3c8dbc",
           yerr=[[r["median"] - r["min"] for r in result["summary"]],
                 [r["max"] - r["median"] for r in result["summary"]]])
    ax.set_ylabel("seconds per step (median, min-max)")
    ax.set_title(f"none at {args.rate:.0f} Mbit/s: one buffer against buckets")
    fig.tight_layout()
    fig.savefig(RESULTS / "buckets.png", dpi=100)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
