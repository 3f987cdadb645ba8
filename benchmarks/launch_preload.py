"""What `tfdist launch --preload tensorflow,keras` saves: the CPU time and wall time of a
small local job whose tasks each import TensorFlow and Keras, against the same job with
every task forked from one process that imported them once (`tfdist.launch.preload`).

The job: `tfdist launch -n N` of a script that builds a two-layer Keras model under
multi_worker_mirrored and fits 2 epochs of 4 steps — a job where the import is most of a
task's work, as in a test suite, a sweep of short runs or an elastic restart. CPU time is
the launcher's and every process it waited for (the tasks, the preloading process), from
`getrusage(RUSAGE_CHILDREN)`; the variants alternate so the machine's drift falls on both.

    python benchmarks/launch_preload.py [--repeats 3] [--workers 2 4]

Writes benchmarks/results/launch_preload.{json,md,png}.
"""

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
VARIANTS = {"exec": "", "preload": "tensorflow,keras"}
JOB = textwrap.dedent("""\
    import numpy as np
    import keras
    import tfdist

    strategy = tfdist.get_strategy("multi_worker_mirrored")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile("adam", "mse")
    x = np.random.default_rng(0).random((64, 4), dtype="float32")
    model.fit(x, x.sum(1, keepdims=True), batch_size=16, epochs=2, verbose=0)
    """)


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_job(script, workers, preload):
    """(CPU seconds, wall seconds) of one launch."""
    cpu, began = _children_cpu(), time.monotonic()
    subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", str(workers), "--preload",
                    preload, "--", sys.executable, script], check=True, capture_output=True,
                   timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return _children_cpu() - cpu, time.monotonic() - began


def measure(workers, repeats):
    found = {n: {v: {"cpu": [], "wall": []} for v in VARIANTS} for n in workers}
    with tempfile.TemporaryDirectory() as scratch:
        script = os.path.join(scratch, "job.py")
        with open(script, "w") as f:
            f.write(JOB)
        for repeat in range(repeats):
            for n in workers:
                for variant, preload in VARIANTS.items():
                    cpu, wall = run_job(script, n, preload)
                    found[n][variant]["cpu"].append(cpu)
                    found[n][variant]["wall"].append(wall)
                    print(f"repeat {repeat + 1}/{repeats}: {n} workers, {variant}: "
                          f"{cpu:.1f} CPU-s, {wall:.1f} s", flush=True)
    return found


def write(found, repeats):
    RESULTS.mkdir(exist_ok=True)
    median = {n: {v: {k: statistics.median(x) for k, x in d.items()} for v, d in per.items()}
              for n, per in found.items()}
    (RESULTS / "launch_preload.json").write_text(json.dumps(
        {"repeats": repeats, "runs": found, "median": median}, indent=2))
    lines = ["# What `tfdist launch --preload tensorflow,keras` saves", "",
             f"`benchmarks/launch_preload.py`: `tfdist launch -n N` of a two-layer Keras fit "
             f"(2 epochs of 4 steps) under multi_worker_mirrored; median of {repeats} "
             "alternating runs; CPU = the launcher and every process it waited for.", "",
             "| workers | exec: CPU-s | preload: CPU-s | CPU saved | exec: wall s | "
             "preload: wall s |", "|---|---|---|---|---|---|"]
    for n, per in median.items():
        e, p = per["exec"], per["preload"]
        lines.append(f"| {n} | {e['cpu']:.1f} | {p['cpu']:.1f} | "
                     f"{1 - p['cpu'] / e['cpu']:.0%} | {e['wall']:.1f} | {p['wall']:.1f} |")
    (RESULTS / "launch_preload.md").write_text("\n".join(lines) + "\n")
    _plot(median)


def _plot(median):
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    workers = list(median)
    for ax, key, label in ((axes[0], "cpu", "CPU seconds"), (axes[1], "wall", "wall seconds")):
        for offset, variant in ((-0.2, "exec"), (0.2, "preload")):
            ax.bar([i + offset for i in range(len(workers))],
                   [median[n][variant][key] for n in workers], width=0.4, label=variant)
        ax.set_xticks(range(len(workers)), [f"{n} workers" for n in workers])
        ax.set_ylabel(label)
    axes[0].legend()
    fig.suptitle("tfdist launch: each task importing TensorFlow vs --preload")
    fig.tight_layout()
    fig.savefig(RESULTS / "launch_preload.png", dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    found = measure(args.workers, args.repeats)
    write({str(n): v for n, v in found.items()}, args.repeats)
    print((RESULTS / "launch_preload.md").read_text())


if __name__ == "__main__":
    main()
