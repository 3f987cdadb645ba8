"""A real slow network: two workers as two hosts, each in its own network namespace,
joined by a veth link whose bandwidth `tc` caps (token bucket filter, both directions).

Each worker is started with `tfdist launch --task worker:i` inside its namespace, as on
a real cluster with fixed addresses (10.77.0.1 and 10.77.0.2, the project's own test
hosts; nothing leaves the machine). Needs root, `ip` and `tc`.
"""

import contextlib
import pathlib
import subprocess
import sys

from .methods import command, job_config

HOSTS = ("10.77.0.1", "10.77.0.2")
NAMESPACES = ("tfdist-slow0", "tfdist-slow1")
WARMUP = 2


def _ip(*args):
    subprocess.run(["ip", *args], check=True)


@contextlib.contextmanager
def capped_link(rate_bits):
    """Two namespaces joined by a veth pair capped at `rate_bits` per second each way."""
    teardown()
    burst = max(4, rate_bits // 250 // 8 // 1024)  # at least one timer tick of data, in kB
    try:
        for ns in NAMESPACES:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", "tfdist-v0", "type", "veth", "peer", "name", "tfdist-v1")
        for i, (ns, host) in enumerate(zip(NAMESPACES, HOSTS)):
            _ip("link", "set", f"tfdist-v{i}", "netns", ns)
            _ip("-n", ns, "addr", "add", f"{host}/24", "dev", f"tfdist-v{i}")
            _ip("-n", ns, "link", "set", f"tfdist-v{i}", "up")
            subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", f"tfdist-v{i}", "root", "tbf",
                            "rate", f"{rate_bits}bit", "burst", f"{burst}kb", "latency", "50ms"],
                           check=True)
        yield
    finally:
        teardown()


def teardown():
    for ns in NAMESPACES:
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def run(method, rate_bits, steps, workdir, timeout=1800, epochs=1, seed=0, warmup=WARMUP,
        flags=(), extra="", tag="", script=None, train=None):
    """Trains `method` for `epochs` x `steps` steps across the capped link (extra `flags`
    for the UNet example); returns the chief's metrics (seconds_per_step, timeline of
    (seconds, loss, bytes received), epochs: training seconds and validation metrics).
    `extra` is appended to the job's config (e.g. a compression section); `tag` names it;
    `script(config, output_dir)` gives another command for every task; `train` another
    example's script (the language model's) run the same way."""
    slug = method.replace(" ", "_").replace("+", "_").replace(".", "") + tag
    workdir = pathlib.Path(workdir)
    config = workdir / f"slow-{slug}-{rate_bits}.yaml"
    config.write_text(job_config(method, 2, warmup, hosts=HOSTS) + extra)
    out = workdir / f"slow-out-{slug}-{rate_bits}-{seed}"
    with capped_link(rate_bits):
        tasks = [subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "tfdist", "launch", str(config),
             "--task", f"worker:{i}", "--",
             *map(str, script(config, out) if script else
                  command(method, config, out, steps, epochs, seed, train=train)),
             *map(str, flags)],
            stdout=open(workdir / f"slow-log-{slug}-{i}", "w"), stderr=subprocess.STDOUT)
            for i, ns in enumerate(NAMESPACES)]
        try:
            codes = [t.wait(timeout) for t in tasks]
        finally:
            for t in tasks:
                t.kill()
    if any(codes):
        log = (workdir / f"slow-log-{slug}-0").read_text()[-2000:]
        raise RuntimeError(f"{method} over {rate_bits} bit/s failed ({codes}):\n{log}")
    import json

    metrics = json.loads((out / "metrics.json").read_text())
    said = (workdir / f"slow-log-{slug}-0").read_text().splitlines()
    metrics["said"] = [line.partition("] ")[2] for line in said  # the chief's own lines
                       if line.partition("] ")[2].startswith("tfdist ")]
    return metrics
