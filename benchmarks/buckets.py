"""Do gradient buckets overlap the exchange with the backward pass? Step time of `none`
on the UNet example, 2 workers as 2 hosts on a capped link (measure/slow_network.py), with
one fused buffer against buckets of several sizes, in alternating repeats.

    sudo python benchmarks/buckets.py [--rate 100] [--repeats 3] [--steps 40] [--trace]

--trace also profiles one step with one buffer and with the default buckets on each host
(bucket_trace.py): when the backward pass ends and when each all-reduce runs.
Writes benchmarks/results/buckets.json, .md and .png.
"""

import sys

import argparse
import json
import shutil
import statistics
import tempfile

from measure import slow_network
from measure.methods import ONE_CORE
from measure.netns import ROOT
from tfdist.step.buckets import DEFAULT_BUCKET_BYTES

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


def trace(rate_bits, size):
    """The chief's trace of one step (bucket_trace.py) with buckets of `size` bytes."""
    workdir = tempfile.mkdtemp(prefix="tfdist-bucket-trace-")
    try:
        return slow_network.run("none", rate_bits, 1, workdir, tag=f"-trace-{size}", script=lambda c, o: [
            *ONE_CORE, sys.executable, ROOT / "benchmarks" / "bucket_trace.py", "--config", c,
            "--output_dir", o, "--bucket_bytes", size])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def trace_lines(traces):
    lines = ["", "Traced (TF's profiler, one step on the chief, ms; bucket_trace.py): the "
             "backward pass, the gradient all-reduces, how long before the backward pass ends "
             "the first one starts (the overlap) and how long after it the last one ends.", "",
             "| exchange | backward pass | gradient all-reduces | first starts before the "
             "backward ends by | last ends after the backward by |", "|---|---|---|---|---|"]
    for t in traces:
        name = "one buffer" if t["bucket_bytes"] == 0 else f"{t['bucket_bytes'] // 1024} KiB buckets"
        lines.append(f"| {name} | {t['backward_ms']:.1f} | {len(t['collectives'])} | "
                     f"{t['first_collective_before_backward_end_ms']:.1f} | "
                     f"{t['last_collective_end_after_backward_end_ms']:.1f} |")
    return lines


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
    parser.add_argument("--trace", action="store_true", help="also trace one step of each")
    parser.add_argument("--trace-only", action="store_true", help="only the traces")
    args = parser.parse_args()
    rate = int(args.rate * 1e6)
    old = json.loads((RESULTS / "buckets.json").read_text()) if args.trace_only else None
    rows = old["rows"] if old else measure(rate, args.repeats, args.steps)
    traces = ([trace(rate, size) for size in (0, DEFAULT_BUCKET_BYTES)]
              if args.trace or args.trace_only else [])
    result = {"rate_bits": rate, "steps": old["steps"] if old else args.steps, "rows": rows,
              "summary": summary(rows), "traces": traces}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "buckets.json").write_text(json.dumps(result, indent=1))
    repeats = len({r["repeat"] for r in rows})
    lines = [f"`none` on the UNet, 2 hosts at {args.rate:.0f} Mbit/s, {result['steps']} steps, "
             f"{repeats} alternating repeats: wall seconds per step after the first 10.", "",
             "| bucket | median s/step | min | max | vs one buffer |", "|---|---|---|---|---|"]
    for r in result["summary"]:
        name = "one buffer" if r["bucket_bytes"] == 0 else f"{r['bucket_bytes'] // 1024} KiB"
        lines.append(f"| {name} | {r['median']:.3f} | {r['min']:.3f} | {r['max']:.3f} | "
                     f"{r['vs_one_buffer']:+.1%} |")
    lines += trace_lines(traces) if traces else []
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
