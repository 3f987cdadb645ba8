"""Bytes that really cross the network per training step, for each gradient compressor.

Runs the UNet example on 2 local workers (MultiWorkerMirroredStrategy, model.fit) inside
a private network namespace (`unshare -n`, needs root), so the loopback counters of
/proc/net/dev count exactly the job's traffic. Each compressor runs twice, for a short and
a long number of steps; the difference divided by the difference in steps is the bytes
per step, free of start-up and shutdown traffic. Next to it: tfdist's own `CommStats`
estimate and the compression ratio against `none`.

    python benchmarks/compression_bytes.py            # all compressors
    python benchmarks/compression_bytes.py --quick    # fewer steps
    python benchmarks/compression_bytes.py --parameter-server   # chief + 2 workers + 1 ps:
        # the casts and int8 compress the gradient push (the weight pulls stay float32)
    python benchmarks/compression_bytes.py --policy mixed_bfloat16   # the UNet's policy

Writes benchmarks/results/compression_bytes.json and .png, and prints a markdown table.
"""

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile

from measure.netns import ROOT, bytes_per_step

RESULTS = ROOT / "benchmarks" / "results"
COMPRESSORS = {  # name -> compression section (None: no compression at all)
    "none": None,
    "fp16": {"name": "fp16"},
    "bf16": {"name": "bf16"},
    "int8": {"name": "int8"},
    "qsgd": {"name": "qsgd", "levels": 15},
    "sign": {"name": "sign", "error_feedback": True, "min_size": 0},
    "topk": {"name": "topk", "ratio": 0.01, "error_feedback": True, "min_size": 0},
    "randomk": {"name": "randomk", "ratio": 0.01, "error_feedback": True, "min_size": 0},
    "powersgd": {"name": "powersgd", "rank": 4, "error_feedback": True, "min_size": 0},
}
TARGETS = {"fp16": 1.9, "bf16": 1.9, "int8": 3.5, "qsgd": 3.5, "sign": 20, "topk": 30,
           "randomk": 50, "powersgd": 15}


PS_COMPRESSORS = ("none", "fp16", "bf16", "int8")


def config_text(compression, parameter_server=False, policy="float32"):
    lines = (["cluster: {chief: 1, worker: 2, ps: 1}", "strategy: parameter_server",
              "train: {image_size: 32, batch_size: 16, loop: ctl, validation_steps: 1}"]
             if parameter_server else
             ["cluster: {worker: 2}", "strategy: {name: multi_worker_mirrored, communication: ring}",
              "train: {image_size: 32, batch_size: 32, loop: fit, validation_steps: 1, "
              f"policy: {policy}}}"])
    if compression:
        lines.append("compression: " + json.dumps(compression))
    return "\n".join(lines) + "\n"


def measure(name, short, long, parameter_server=False, policy="float32"):
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"tfdist-bench-{name}-"))
    try:
        config = workdir / "job.yaml"
        config.write_text(config_text(COMPRESSORS[name], parameter_server, policy))
        per_step, metrics = bytes_per_step(config, short, long, workdir, "--start_step", 0)
        stats, seconds = metrics.get("bytes_exchanged"), metrics["seconds_per_step"]
        estimate = stats["per_step_per_worker"] * 2 if stats else None  # both workers send
        print(f"{name:9s} {per_step / 1e3:10.1f} kB/step {seconds:6.3f} s/step", flush=True)
        return {"name": name, "loopback_bytes_per_step": per_step, "seconds_per_step": seconds,
                "commstats_bytes_per_step": estimate,
                "commstats_ratio": stats["compression_ratio"] if stats else 1.0}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def report(rows, targets):
    none = next(r for r in rows if r["name"] == "none")["loopback_bytes_per_step"]
    none_seconds = next(r for r in rows if r["name"] == "none").get("seconds_per_step")
    lines = ["| compressor | loopback kB/step (2 workers) | fewer bytes than none | target | "
             "CommStats kB/step | CommStats vs measured | s/step | step time vs none |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        r["reduction"] = none / r["loopback_bytes_per_step"]
        target = targets.get(r["name"])
        r["meets_target"] = None if target is None else r["reduction"] >= target
        estimate = r["commstats_bytes_per_step"]
        gap = "" if not estimate else f"{estimate / r['loopback_bytes_per_step'] - 1:+.0%}"
        lines.append(f"| {r['name']} | {r['loopback_bytes_per_step'] / 1e3:.1f} | "
                     f"{r['reduction']:.1f}x | {f'>= {target}x' if target else ''}"
                     f"{'' if target is None else (' met' if r['meets_target'] else ' MISSED')} | "
                     f"{'' if not estimate else f'{estimate / 1e3:.1f}'} | {gap} | "
                     f"{r['seconds_per_step']:.3f} | {r['seconds_per_step'] / none_seconds - 1:+.0%} |")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = [r["name"] for r in rows]
    ax.bar(names, [r["loopback_bytes_per_step"] / 1e3 for r in rows], color="#3c8dbc")
    ax.set_yscale("log")
    ax.set_ylabel("kB per step (loopback, 2 workers)")
    ax.set_title("UNet gradient exchange: bytes on the wire per step")
    for i, r in enumerate(rows):
        ax.text(i, r["loopback_bytes_per_step"] / 1e3, f"{r['reduction']:.0f}x",
                ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps per run")
    parser.add_argument("--only", nargs="*", default=list(COMPRESSORS), choices=list(COMPRESSORS))
    parser.add_argument("--parameter-server", action="store_true",
                        help="chief + 2 workers + 1 ps (compressors: none, fp16, bf16, int8)")
    parser.add_argument("--policy", default="float32",
                        choices=["float32", "mixed_float16", "mixed_bfloat16"],
                        help="the UNet's Keras dtype policy (results: compression_bytes_POLICY)")
    args = parser.parse_args()
    if args.parameter_server:
        args.only = [n for n in args.only if n in PS_COMPRESSORS]
    if os.geteuid() != 0 or not shutil.which("unshare"):
        sys.exit("this benchmark needs root and unshare(1) for a private network namespace")
    short, long = (5, 15) if args.quick else (10, 40)
    rows = [measure(name, short, long, args.parameter_server, args.policy)
            for name in ["none", *[n for n in args.only if n != "none"]]]
    # Targets are for the all-reduce; under parameter servers the weight pulls stay float32.
    table = report(rows, {} if args.parameter_server else TARGETS)
    stem = "compression_bytes_ps" if args.parameter_server else "compression_bytes"
    stem += "" if args.policy == "float32" else f"_{args.policy}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"steps": [short, long], "rows": rows, "machine": os.uname().machine,
         "cpus": os.cpu_count()}, indent=2))
    (RESULTS / f"{stem}.md").write_text(table + "\n")
    plot(rows, RESULTS / f"{stem}.png")
    print(table)


if __name__ == "__main__":
    main()
