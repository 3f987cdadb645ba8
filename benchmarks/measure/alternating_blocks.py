"""Side-by-side step timings: variants trained in alternating blocks of steps in the same
worker processes (this 2-core machine's run-to-run spread cancels), launched with
`tfdist launch`, one core each; shared by `guard_cost.py` and `row_weights_cost.py`."""

import json
import pathlib
import subprocess
import sys
import tempfile
import time

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1]  # the benchmark programs' folder
RESULTS = BENCHMARKS / "results"


def timed_blocks(variants, pairs, block):
    """{name: [median step seconds of each measured block]}: `variants` maps a name to a
    function running one step (and waiting for it); each is run once untimed (traced),
    then `pairs` rounds of one `block`-step block per variant."""
    import numpy as np

    def one_block(step):
        seconds = []
        for _ in range(block):
            began = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - began)
        return float(np.median(seconds))

    for step in variants.values():
        one_block(step)
    blocks = {name: [] for name in variants}
    for _ in range(pairs):
        for name, step in variants.items():
            blocks[name].append(one_block(step))
    return blocks


def launch_workers(script, workers, *flags):
    """Runs `script --worker --out FILE FLAGS` on `workers` local workers (multi_worker_
    mirrored, one core each) and returns what the chief wrote to FILE (JSON)."""
    with tempfile.TemporaryDirectory() as tmp:
        config, out = pathlib.Path(tmp, "job.yaml"), pathlib.Path(tmp, "blocks.json")
        config.write_text(f"cluster: {{worker: {workers}}}\nstrategy: multi_worker_mirrored\n")
        one_core = ["env", "TF_NUM_INTRAOP_THREADS=1", "TF_NUM_INTEROP_THREADS=2"]
        subprocess.run([sys.executable, "-m", "tfdist", "launch", str(config), "--",
                        *one_core, sys.executable, str(script), "--worker", "--out", str(out),
                        *map(str, flags)], check=True, cwd=BENCHMARKS)
        return json.loads(out.read_text())


def plot_blocks(blocks, title, stem):
    """results/`stem`.png: each variant's block medians, pair by pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name, values in blocks.items():
        ax.plot(range(1, len(values) + 1), [v * 1e3 for v in values], "o-", label=name)
    ax.set_xlabel("block pair")
    ax.set_ylabel("median step time (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    fig.savefig(RESULTS / f"{stem}.png", dpi=120)


def main(doc, worker, drive, add_arguments=lambda parser: None):
    """The command line of such a benchmark: `--pairs`, `--block` and the script's own
    arguments (`add_arguments`); `worker(args)` in each launched worker, else `drive(args)`."""
    import argparse
    import os

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    add_arguments(parser)
    parser.add_argument("--pairs", type=int, default=6, help="measured blocks per variant")
    parser.add_argument("--block", type=int, default=8, help="steps per block")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        sys.path.insert(0, str(BENCHMARKS))
        worker(args)
    else:
        drive(args)
