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

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "unet_segmentation" / "train.py"


def loopback_bytes(dev_text):
    """Bytes received on `lo` (= bytes sent, on loopback) from a /proc/net/dev text."""
    for line in dev_text.splitlines():
        if line.strip().startswith("lo:"):
            return int(line.split(":", 1)[1].split()[0])
    raise RuntimeError("no loopback line in /proc/net/dev")


def run_job(config, steps, workdir, *flags, epochs=1, timeout=1800):
    """Launches every task of `config` (a path) for `epochs` x `steps` steps in a fresh
    namespace; returns (loopback bytes, the chief's metrics.json as a dict)."""
    workdir = pathlib.Path(workdir)
    out = workdir / f"out-{steps}"
    train = [sys.executable, str(TRAIN), "--config", str(config), "--output_dir", str(out),
             "--epochs", str(epochs), "--steps_per_epoch", str(steps), *map(str, flags)]
    launch = [sys.executable, "-m", "tfdist", "launch", str(config), "--", *train]
    script = (f"ip link set lo up && cat /proc/net/dev > {workdir}/before && "
              f"{shlex.join(launch)} > {workdir}/log-{steps} 2>&1; "
              f"code=$?; cat /proc/net/dev > {workdir}/after; exit $code")
    done = subprocess.run(["unshare", "-n", "sh", "-c", script], timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        log = (workdir / f"log-{steps}").read_text()[-3000:]
        raise RuntimeError(f"job failed (exit {done.returncode}):\n{log}")
    moved = (loopback_bytes((workdir / "after").read_text())
             - loopback_bytes((workdir / "before").read_text()))
    return moved, json.loads((out / "metrics.json").read_text())


def bytes_per_step(config, short, long, workdir, *flags):
    """Loopback bytes per step, free of start-up and shutdown traffic: two runs of
    `short` and `long` steps, difference / (long - short). Returns (bytes per step,
    metrics of the long run)."""
    small, _ = run_job(config, short, workdir, *flags)
    large, metrics = run_job(config, long, workdir, *flags)
    return (large - small) / (long - short), metrics
