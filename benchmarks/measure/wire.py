"""Bytes on the wire and step time of each method, on N local workers in a private network
namespace (loopback counters read by the chief after every step)."""

import pathlib

from . import analytic
from .methods import command, job_config
from .netns import bytes_between, run_in_namespace

WARMUP = 2  # local SGD's synchronous steps; compression starts at step 0


def measure(method, workers, window, workdir):
    """One run of `method`: bytes per step over `window` steps after the warm-up and the
    first traced steps, next to the analytic figure and tfdist's CommStats."""
    slug = method.replace(" ", "_").replace("+", "_").replace(".", "")
    workdir = pathlib.Path(workdir)
    config = workdir / f"{slug}-{workers}.yaml"
    config.write_text(job_config(method, workers, WARMUP))
    out = workdir / f"out-{slug}-{workers}"
    first = WARMUP + 2
    _, metrics = run_in_namespace(
        config, command(method, config, out, first + window, workers=workers), out, workdir)
    measured = bytes_between(metrics["timeline"], first, first + window)
    stats = metrics.get("bytes_exchanged") or {}
    return {"method": method, "workers": workers, "bytes_per_step": measured,
            "seconds_per_step": metrics["seconds_per_step"],
            "commstats_bytes_per_step": (stats["per_step_per_worker"] * workers
                                         if stats.get("per_step_per_worker") else None),
            "shapes": metrics.get("weight_shapes")}


def add_analytic(rows):
    """Adds each row's analytic bytes (all workers together), from the model's shapes."""
    shapes = next(r["shapes"] for r in rows if r.get("shapes"))
    for row in rows:
        row["analytic_bytes_per_step"] = row["workers"] * analytic.bytes_per_worker(
            row["method"], shapes, row["workers"])
    return shapes
