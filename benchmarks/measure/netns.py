"""Run the UNet example on local workers inside a private network namespace and count the
bytes that cross loopback (shared by the benchmarks).

`unshare -n` (needs root) gives the job its own loopback device, so the counters of
/proc/net/dev see exactly the job's traffic: nothing else on the machine talks there.
"""

import json
import pathlib
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout
TRAIN = ROOT / "examples" / "unet_segmentation" / "train.py"


def loopback_bytes(dev_text):
    """Bytes received on `lo` (= bytes sent, on loopback) from a /proc/net/dev text."""
    for line in dev_text.splitlines():
        if line.strip().startswith("lo:"):
            return int(line.split(":", 1)[1].split()[0])
    raise RuntimeError("no loopback line in /proc/net/dev")


def run_job(config, steps, workdir, *flags, epochs=1, timeout=1800):
    """Launches every task of `config` (a path) running the UNet example for `epochs` x
    `steps` steps in a fresh namespace; returns (loopback bytes, the chief's metrics)."""
    out = pathlib.Path(workdir) / f"out-{steps}"
    train = [sys.executable, str(TRAIN), "--config", str(config), "--output_dir", str(out),
             "--epochs", str(epochs), "--steps_per_epoch", str(steps), *map(str, flags)]
    return run_in_namespace(config, train, out, workdir, timeout)


def run_in_namespace(config, command, output_dir, workdir, timeout=1800):
    """`tfdist launch config -- command` in a fresh network namespace; returns (loopback
    bytes of the whole job, the metrics.json the command wrote to `output_dir`)."""
    workdir, output_dir = pathlib.Path(workdir), pathlib.Path(output_dir)
    log = workdir / f"log-{output_dir.name}"
    launch = [sys.executable, "-m", "tfdist", "launch", str(config), "--", *map(str, command)]
    script = (f"ip link set lo up && cat /proc/net/dev > {workdir}/before && "
              f"{shlex.join(launch)} > {log} 2>&1; "
              f"code=$?; cat /proc/net/dev > {workdir}/after; exit $code")
    done = subprocess.run(["unshare", "-n", "sh", "-c", script], timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"job failed (exit {done.returncode}):\n{log.read_text()[-3000:]}")
    moved = (loopback_bytes((workdir / "after").read_text())
             - loopback_bytes((workdir / "before").read_text()))
    return moved, json.loads((output_dir / "metrics.json").read_text())


def bytes_between(timeline, first, last):
    """Loopback bytes per step between steps `first` and `last` (1-based, inclusive of
    the steps after `first`), from a job's timeline of (seconds, loss, loopback)."""
    return (timeline[last - 1][2] - timeline[first - 1][2]) / (last - first)


def bytes_per_step(config, short, long, workdir, *flags):
    """Loopback bytes per step, free of start-up and shutdown traffic: two runs of
    `short` and `long` steps, difference / (long - short). Returns (bytes per step,
    metrics of the long run)."""
    small, _ = run_job(config, short, workdir, *flags)
    large, metrics = run_job(config, long, workdir, *flags)
    return (large - small) / (long - short), metrics
