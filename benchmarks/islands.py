"""DiLoCo across islands, on the language model (examples/char_lm), on an emulated topology:
2 islands x 2 workers. Each island is a network namespace (its two workers talk over its
own free link); the islands are joined by a veth pair capped by `tc tbf`
(measure/slow_network.py).

Methods: flat synchronous training, flat top-k + EF, flat DiLoCo (every worker its own
DiLoCo worker), island DiLoCo and island Streaming DiLoCo (`islands: host`). For each:
time to a target validation perplexity, final perplexity, and the bytes that crossed the
slow link per training step (the veth counters of both namespaces). Needs root.

A slowed island: the same job with each island's workers in a cgroup of one CPU, then
with the second island's cut to half a CPU (`--slowed`), first with equal local steps,
then with `island_steps` giving the slowed island half of each period's, then with
`island_steps: auto` (measured): the first island's step rate in its local steps once
every function is traced (epochs 3 to 6), against the unslowed run's.

    python benchmarks/islands.py [--rates 20000000] [--seeds 0 1] [--out benchmarks/results]
"""

import argparse
import contextlib
import datetime
import json
import math
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from measure.slow_network import HOSTS, NAMESPACES, capped_link  # noqa: E402
from measure.workloads import WORKLOADS  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
PORTS = (23456, 23457)
ONE_CORE = ["env", "TF_NUM_INTRAOP_THREADS=1", "TF_NUM_INTEROP_THREADS=1"]
NESTEROV = {"name": "nesterov", "learning_rate": 0.7, "momentum": 0.9}
DILOCO = {"period": 32, "warmup_steps": 32, "outer": NESTEROV}
STREAMING = {**DILOCO, "fragments": 4, "overlap_steps": 2, "overlap_mix": 0.5,
             "compression": {"name": "int4", "min_size": 0}}
TOPK = {"name": "topk", "ratio": 0.01, "error_feedback": True, "min_size": 0}
MEAN = {"name": "sgd", "learning_rate": 1.0}  # the outer step is the islands' mean change
METHODS = {
    "flat synchronous": {},
    "flat top-k + EF": {"compression": {"name": "topk", "ratio": 0.01, "error_feedback": True,
                                        "min_size": 0}},
    "flat DiLoCo": {"local_sgd": DILOCO},
    "island DiLoCo": {"local_sgd": {**DILOCO, "islands": "host"}},
    "island Streaming DiLoCo": {"local_sgd": {**STREAMING, "islands": "host"}},
    # the warm-up's 32 synchronous steps were most of its time and bytes: compress them
    "island Streaming DiLoCo, top-k warm-up": {"local_sgd": {
        **STREAMING, "islands": "host", "warmup_compression": TOPK}},
    # outer Nesterov (0.7, 0.9) ends 16% above synchronous training in 480 steps (its
    # momentum is still building: 14 outer steps); the plain mean of the islands does not
    "island Streaming DiLoCo (outer: mean), top-k warm-up": {"local_sgd": {
        **STREAMING, "outer": MEAN, "islands": "host", "warmup_compression": TOPK}},
    # each fragment's send, exchange and apply is a function traced when the local phase
    # starts (12 with 4 fragments): most of the time it lost to synchronous training was
    # that tracing, not steps; 2 fragments trace half as many (measured 11-28)
    "island Streaming DiLoCo (outer: mean, 2 fragments), top-k warm-up": {"local_sgd": {
        **STREAMING, "fragments": 2, "outer": MEAN, "islands": "host",
        "warmup_compression": TOPK}},
}
FREE = 10_000_000_000  # "every link free": a 10 Gbit/s cap that nothing reaches
TARGET_PERPLEXITY = WORKLOADS["lm"].target
SCHEDULE = {"epochs": 12, "steps_per_epoch": 40, "validation_steps": 8, "batch_size": 32}


# the UNet's synchronous training at 20 Mbit/s (~1.2 s/step, ~10 min a run) is measured by
# benchmarks/time_to_accuracy.py; here its bytes are the free link's (the same payload)
METHODS_OF = {"lm": list(METHODS), "unet": [m for m in METHODS if m != "flat synchronous"]}
RESULTS_OF = {"lm": "islands", "unet": "islands_unet"}


SLOWED = "island Streaming DiLoCo, top-k warm-up"  # the method the slowed island runs
SLOWED_SCHEDULE = {**SCHEDULE, "epochs": 6}
#: Epochs the slowed island's step rate leaves out: the warm-up's, and the one whose
#: steps trace the fragments' functions (each island once; the slowed one at half speed).
SLOWED_SKIP = 2
CGROUPS = pathlib.Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller


def config_text(method, schedule=SCHEDULE, island_steps=None):
    workers = [f"{host}:{port}" for host in HOSTS for port in PORTS]
    sections = {"cluster": {"worker": workers},
                "strategy": {"name": "multi_worker_mirrored", "communication": "ring"},
                **METHODS[method], "train": schedule}
    if island_steps is not None:
        sections["local_sgd"] = {**sections["local_sgd"], "island_steps": island_steps}
    return yaml.safe_dump(sections, sort_keys=False)


@contextlib.contextmanager
def cpu_limits(cores):
    """A cgroup per island (cgroup v1 `cpu`), island i limited to `cores[i]` CPUs; yields
    each one's `cgroup.procs`."""
    groups = [CGROUPS / f"tfdist-island{i}" for i in range(len(cores))]
    try:
        for group, count in zip(groups, cores):
            group.mkdir(exist_ok=True)
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(int(count * 100_000)))
        yield [group / "cgroup.procs" for group in groups]
    finally:
        for group in groups:
            with contextlib.suppress(OSError):
                group.rmdir()


def veth_bytes(namespace, device):
    """Bytes received on `device` inside `namespace` (/proc/net/dev)."""
    text = subprocess.run(["ip", "netns", "exec", namespace, "cat", "/proc/net/dev"],
                          capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        if line.strip().startswith(f"{device}:"):
            return int(line.split(":", 1)[1].split()[0])
    raise RuntimeError(f"no {device} in {namespace}")


def slow_link_bytes():
    return sum(veth_bytes(ns, f"tfdist-v{i}") for i, ns in enumerate(NAMESPACES))


def run(method, rate, seed, workdir, timeout=3600, cgroups=None, schedule=SCHEDULE, tag="",
        island_steps=None, workload=WORKLOADS["lm"]):
    """One run of `workload` on the topology (each island's tasks in `cgroups[island]`, if
    given); returns its row."""
    workdir = pathlib.Path(workdir)
    slug = f"{method.replace(' ', '_').replace('+', '').replace(',', '')}-{rate}-{seed}{tag}"
    config, out = workdir / f"{slug}.yaml", workdir / f"out-{slug}"
    config.write_text(config_text(method, schedule, island_steps))
    train = [*ONE_CORE, sys.executable, str(workload.script), "--config", str(config), "--output_dir",
             str(out), "--seed", str(seed)]
    with capped_link(rate):
        before = slow_link_bytes()
        tasks = []
        for island, ns in enumerate(NAMESPACES):
            for local in range(len(PORTS)):
                index = island * len(PORTS) + local
                log = open(workdir / f"log-{slug}-{index}", "w")
                command = ["ip", "netns", "exec", ns, sys.executable, "-m", "tfdist", "launch",
                           str(config), "--task", f"worker:{index}", "--", *train]
                if cgroups is not None:  # joins its island's cgroup, then becomes the task
                    command = ["sh", "-c", 'echo $$ > "$0" && exec "$@"',
                               str(cgroups[island]), *command]
                tasks.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        try:
            codes = [t.wait(timeout) for t in tasks]
        finally:
            for t in tasks:
                t.kill()
        crossed = slow_link_bytes() - before
    chief_log = (workdir / f"log-{slug}-0").read_text()
    if any(codes):
        raise RuntimeError(f"{method} at {rate} bit/s failed ({codes}):\n" + chief_log[-3000:])
    metrics = json.loads((out / "metrics.json").read_text())
    epochs = metrics["epochs"]
    steps = schedule["epochs"] * schedule["steps_per_epoch"]
    reached = next((e["train_seconds"] for e in epochs
                    if workload.reached(e[workload.metric])), None)
    return {"method": method, "rate_bits": rate, "seed": seed,
            "measured": datetime.date.today().isoformat(), "seconds_to_target": reached,
            workload.final_key: epochs[-1][workload.metric],
            "train_seconds": epochs[-1]["train_seconds"],
            "seconds_per_step": metrics["seconds_per_step"],
            "measured_island_steps": measured_island_steps(chief_log),
            "slow_link_bytes_per_step": crossed / steps,
            "local_seconds_per_step": local_seconds_per_step(
                epochs, schedule, SLOWED_SKIP if schedule is SLOWED_SCHEDULE else 1),
            workload.by_epoch_key: [(e["train_seconds"], e[workload.metric]) for e in epochs]}


def measured_island_steps(log):
    """[[local step, counts], ...] that `island_steps: auto` decided (the chief's lines)."""
    found = re.findall(r"island_steps from local step (\d+): (\[[\d, ]+\])", log)
    return [[int(step), json.loads(counts)] for step, counts in found]


def local_seconds_per_step(epochs, schedule, skip=1):
    """The chief's training seconds per step in the epochs after the first `skip` (the
    first: the synchronous warm-up's)."""
    seconds = [e["train_seconds"] for e in epochs]
    return ((seconds[-1] - seconds[skip - 1])
            / ((len(seconds) - skip) * schedule["steps_per_epoch"]))


def slowed(rate, seed, workdir, slow_steps, previous=()):
    """The first island's local step rate with the second at one CPU, then at half (equal
    local steps), then at half training `slow_steps` of each period's calls
    (`island_steps`), then at half with `island_steps: auto`. The equal-steps rows of
    `previous` (same link and seed) are kept, and its rows of other counts follow."""
    rows = []
    period = METHODS[SLOWED]["local_sgd"]["period"]
    for cores, steps in (((1.0, 1.0), None), ((1.0, 0.5), None),
                         ((1.0, 0.5), [period, slow_steps]), ((1.0, 0.5), "auto")):
        kept = [r for r in previous if r["island_cpus"] == list(cores) and steps is None
                and r.get("island_steps") is None and (r["rate_bits"], r["seed"]) == (rate, seed)]
        if kept:
            rows.append(kept[0])
            continue
        with cpu_limits(cores) as cgroups:
            row = run(SLOWED, rate, seed, workdir, cgroups=cgroups, schedule=SLOWED_SCHEDULE,
                      tag=f"-cpus{cores[1]}-{steps if steps == 'auto' else 'heterogeneous' if steps else 'equal'}",
                      island_steps=steps)
        rows.append({**row, "island_cpus": list(cores), "island_steps": steps})
        print(f"    island CPUs {cores}, island_steps {steps}: "
              f"{row['local_seconds_per_step']:.3f} s/step on the first island", flush=True)
    return rows + [r for r in previous
                   if r.get("island_steps") not in (None, [period, slow_steps], "auto")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", type=int, nargs="+", default=[20_000_000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="lm",
                        help="the language model (the issue's targets) or the UNet")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="default: every method (the UNet: all but synchronous training "
                             "at the slow rate, measured by time_to_accuracy.py)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--report-only", action="store_true",
                        help="write the report from the saved results, run nothing")
    parser.add_argument("--slowed", action="store_true",
                        help="measure only the slowed island (and write the report)")
    parser.add_argument("--slow-steps", type=int, default=DILOCO["period"] // 2,
                        help="local steps per period of the slowed island (--slowed)")
    parser.add_argument("--fresh", action="store_true",
                        help="--slowed: measure the equal-steps runs again too")
    parser.add_argument("--again", action="store_true",
                        help="measure --methods again (their saved rows are replaced)")
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]
    args.methods = args.methods or METHODS_OF[workload.key]
    results_path = pathlib.Path(args.out) / f"{RESULTS_OF[workload.key]}.json"
    slowed_path = results_path.parent / "islands_slowed.json"
    if args.slowed:
        with tempfile.TemporaryDirectory() as workdir:
            previous = ([] if args.fresh or not slowed_path.exists()
                        else json.loads(slowed_path.read_text()))
            rows = slowed(args.rates[0], args.seeds[0], workdir, args.slow_steps, previous)
            slowed_path.write_text(json.dumps(rows, indent=1))
        args.report_only = True
    rows = json.loads(results_path.read_text()) if results_path.exists() else []
    if args.again:
        rows = [r for r in rows if r["method"] not in args.methods or r["rate_bits"] == FREE]
    done = {(r["method"], r["rate_bits"], r["seed"]) for r in rows}
    plan = [("flat synchronous", FREE, s) for s in args.seeds]
    plan += [(m, r, s) for r in args.rates for m in args.methods for s in args.seeds]
    if args.report_only:
        plan = []
    with tempfile.TemporaryDirectory() as workdir:
        for i, (method, rate, seed) in enumerate(plan):
            if (method, rate, seed) in done:
                continue
            print(f"[{i + 1}/{len(plan)}] {method} at {rate / 1e6:g} Mbit/s, seed {seed}",
                  flush=True)
            row = run(method, rate, seed, workdir, workload=workload)
            print(f"    to {workload.label} {workload.target}: {row['seconds_to_target']} s, "
                  f"final {row[workload.final_key]:.3f}, slow link "
                  f"{row['slow_link_bytes_per_step'] / 1e3:.1f} kB/step", flush=True)
            rows.append(row)
            results_path.write_text(json.dumps(rows, indent=1))
    if workload is WORKLOADS["lm"]:
        text = report(rows, json.loads(slowed_path.read_text()) if slowed_path.exists() else [])
        intro = __doc__.split(chr(10) * 2)[1]
    else:
        text = unet_report(rows, workload)
        intro = UNET_INTRO
    (results_path.parent / f"{RESULTS_OF[workload.key]}.md").write_text(
        f"# DiLoCo across islands: {workload.name} (benchmarks/islands.py)\n\n{intro}"
        f"\n\n{text}\n")
    plot(rows, results_path.parent / f"{RESULTS_OF[workload.key]}.png", workload)
    print(text)


def plot(rows, path, workload):
    """The validation metric against training seconds, one line per method and link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        if row["seed"] != 0:
            continue
        link = "free" if row["rate_bits"] == FREE else f"{row['rate_bits'] / 1e6:g} Mbit/s"
        seconds, values = zip(*row[workload.by_epoch_key])
        ax.plot(seconds, values, marker=".", label=f"{row['method']} ({link})")
    ax.axhline(workload.target, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="training seconds (validation excluded)",
           ylabel=f"validation {workload.label}",
           title=f"{workload.name.capitalize()}, 2 islands x 2 workers (seed 0)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


UNET_INTRO = ("The same topology and methods on the UNet example (its demo schedule: 480 "
              "steps of 32 samples, 8 validation steps per epoch): time to validation mean "
              "IoU 0.85. Synchronous training at 20 Mbit/s is in time_to_accuracy.py's table "
              "(2 workers); its bytes per step here are the free link's run's (the same "
              "payload).")


def _mean(rows):
    import statistics

    def mean(method, rate, key):
        values = [r[key] for r in rows if r["method"] == method and r["rate_bits"] == rate]
        values = [v for v in values if v is not None]
        return statistics.mean(values) if values else None

    return mean


def table(rows, workload):
    """The markdown table of every method and link measured, by the day it was measured
    (this machine's speed varies by up to 3x from day to day: compare within a day)."""
    lines = [f"| method | link | measured | seconds to {workload.label} {workload.target} | "
             f"final {workload.label} | s/step | slow-link kB/step |",
             "|---|---|---|---|---|---|---|"]
    for day in dict.fromkeys(r.get("measured") for r in rows):
        lines += _table_rows([r for r in rows if r.get("measured") == day], workload, day)
    return lines


def _table_rows(rows, workload, day):
    mean = _mean(rows)
    lines = []
    for method, rate in dict.fromkeys((r["method"], r["rate_bits"]) for r in rows):
        link = "free" if rate == FREE else f"{rate / 1e6:g} Mbit/s"
        to = mean(method, rate, "seconds_to_target")
        runs = [r for r in rows if r["method"] == method and r["rate_bits"] == rate]
        reached = sum(r["seconds_to_target"] is not None for r in runs)
        to = "not reached" if to is None else f"{to:.1f}" + (
            f" ({reached} of {len(runs)} seeds)" if reached < len(runs) else "")
        lines.append(f"| {method} | {link} | {day or 'before 11-28'} | {to} | "
                     f"{mean(method, rate, workload.final_key):.3f} | "
                     f"{mean(method, rate, 'seconds_per_step'):.3f} | "
                     f"{mean(method, rate, 'slow_link_bytes_per_step') / 1e3:.1f} |")
    return lines


def unet_report(rows, workload):
    """The UNet's table, and its island methods against synchronous training on free
    links (time to mean IoU 0.85, final mean IoU, bytes per step)."""
    mean = _mean(rows)
    lines = table(rows, workload)
    free = mean("flat synchronous", FREE, "seconds_to_target")
    free_final = mean("flat synchronous", FREE, workload.final_key)
    sync_bytes = mean("flat synchronous", FREE, "slow_link_bytes_per_step")
    notes = []
    for method in [m for m in METHODS_OF[workload.key] if m.startswith("island")]:
        to = mean(method, 20_000_000, "seconds_to_target")
        final = mean(method, 20_000_000, workload.final_key)
        sent = mean(method, 20_000_000, "slow_link_bytes_per_step")
        if None in (free, final, sent):
            continue
        time = f"{to / free:.2f}x the time" if to is not None else "not reached"
        notes.append(f"- {method} at 20 Mbit/s: {time} of synchronous training on free "
                     f"links, final mean IoU {final:.3f} against {free_final:.3f}, "
                     f"{sync_bytes / sent:.0f}x fewer bytes across the slow link per step")
    return "\n".join(lines + [""] + notes)


def measured_text(decided):
    """`island_steps: auto`'s decisions, in a few words."""
    if not decided:
        return ""
    (step, counts), rest = decided[0], decided[1:]
    later = f"; {len(rest)} change(s) later, the last {rest[-1][1]}" if rest else ""
    return f", measured: {counts} from local step {step}{later}"


def report(rows, slowed_rows=()):
    """The markdown table and the issue's targets, met or MISSED."""
    mean = _mean(rows)
    lines = table(rows, WORKLOADS["lm"])
    islands = [m for m in METHODS if m.startswith("island Streaming")
               and mean(m, 20_000_000, "final_val_perplexity") is not None]

    def same_day(method):
        """`mean` over `method`'s runs and the synchronous ones of the same day(s)."""
        days = {r.get("measured") for r in rows if r["method"] == method}
        return _mean([r for r in rows if r.get("measured") in days])

    def time_ratio(method):  # inf unless every seed reached the target
        runs = [r for r in rows if r["method"] == method and r["rate_bits"] == 20_000_000]
        free = same_day(method)("flat synchronous", FREE, "seconds_to_target")
        if free is None or any(r["seconds_to_target"] is None for r in runs):
            return math.inf
        return mean(method, 20_000_000, "seconds_to_target") / free

    best = min(islands, key=time_ratio)
    free = same_day(best)("flat synchronous", FREE, "seconds_to_target")
    free_final = same_day(best)("flat synchronous", FREE, "final_val_perplexity")
    streaming = mean(best, 20_000_000, "seconds_to_target")
    final = mean(best, 20_000_000, "final_val_perplexity")
    sync_bytes = mean("flat synchronous", 20_000_000, "slow_link_bytes_per_step")
    fewest = min(islands, key=lambda m: mean(m, 20_000_000, "slow_link_bytes_per_step"))
    island_bytes = mean(fewest, 20_000_000, "slow_link_bytes_per_step")
    targets = []
    streaming_runs = [r for r in rows if r["method"] == best and r["rate_bits"] == 20_000_000]
    if any(r["seconds_to_target"] is None for r in streaming_runs):
        streaming = None
        targets.append(f"- {best} at 20 Mbit/s: not every seed reached "
                       f"perplexity {TARGET_PERPLEXITY}: MISSED")
    if None not in (free, streaming):
        ok = streaming <= 1.3 * free and final <= 1.02 * free_final
        targets.append(f"- {best} at 20 Mbit/s: {streaming:.1f} s to perplexity "
                       f"{TARGET_PERPLEXITY} against {free:.1f} s synchronous on free links "
                       f"the same day "
                       f"({streaming / free:.2f}x, target <= 1.3x), final {final:.2f} against "
                       f"{free_final:.2f} (target within 2%): {'met' if ok else 'MISSED'}")
    if None not in (sync_bytes, island_bytes):
        ratio = sync_bytes / island_bytes
        targets.append(f"- Slow-link bytes per step ({fewest}): {ratio:.0f}x fewer than flat "
                       f"synchronous "
                       f"(target >= 100x): {'met' if ratio >= 100 else 'MISSED'}")
    if len(slowed_rows) >= 3:
        half = [DILOCO["period"], DILOCO["period"] // 2]  # the slowed island's speed's share
        main = next((r for r in slowed_rows[2:] if r["island_steps"] == "auto"),
                    next((r for r in slowed_rows[2:] if r["island_steps"] == half),
                         slowed_rows[2]))
        base, equal, heterogeneous = (r["local_seconds_per_step"]
                                      for r in (*slowed_rows[:2], main))
        cost = 1 - base / heterogeneous
        steps = main["island_steps"]
        others = "".join(f"; `{r['island_steps']}`: {1 - base / r['local_seconds_per_step']:.0%}"
                         for r in slowed_rows[2:] if r is not main)
        how = ", its speed's share" if steps == half else measured_text(
            main.get("measured_island_steps") or [])
        targets.append(f"- A slowed island (half a CPU against one, {SLOWED} at "
                       f"{slowed_rows[0]['rate_bits'] / 1e6:g} Mbit/s, `island_steps: "
                       f"{steps}`{how})"
                       f" costs the other {cost:.0%} of its local "
                       f"step rate ({base:.3f} -> {heterogeneous:.3f} s/step; with equal local "
                       f"steps {equal:.3f}, {1 - base / equal:.0%}{others}; target <= 10%): "
                       f"{'met' if cost <= 0.10 else 'MISSED'}")
    else:
        targets.append("- A slowed island costing the other <= 10% of its step rate: not "
                       "measured (`--slowed`): MISSED")
    return "\n".join(lines + [""] + targets)


if __name__ == "__main__":
    main()
