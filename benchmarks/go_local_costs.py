"""What going local costs: the two constants `warmup_steps: auto` predicts it with
(tfdist/local_sgd/go_local.py), measured.

The UNet on 2 workers as 2 hosts on a 20 Mbit/s `tc tbf` link (time_to_accuracy.py's
runs, 12 epochs of 40 steps), where local steps begin after auto's 20 steps of top-k + EF:
"auto, then Streaming DiLoCo 32" against plain `compression: auto` of the same seed, each
step timed on the chief. Per seed:

- the switch: the local run's time in the 80 steps after local steps begin, less the same
  80 steps four epochs later (as many validations and synchronisations), less plain auto's
  same difference: what tracing the local step, each fragment's synchronisation and the
  average before validation costs once. Against the first step's trace (as auto measured
  it, the chief's line): `SWITCH_TRACES`;
- a steady local step (the mean of steps 100 to 300, synchronisations included, each
  epoch's first step, which validates, not) against the compute time auto estimated from
  its synchronous steps: `LOCAL_OVERHEAD`.

    sudo python benchmarks/go_local_costs.py [--seeds 0 1 2]

Writes results/go_local_costs.{json,md,png}; tests/unit/project/test_benchmarks.py checks that
go_local's constants are these medians.
"""

import argparse
import datetime
import json
import re
import statistics
import tempfile

import time_to_accuracy as tta
from measure import slow_network

NAME = "go_local_costs"
RATE = tta.SLOW
PAIR = ("auto", "auto, then Streaming DiLoCo 32")
EPOCH = tta.PLANS["full"]["steps"]  # 40 steps
WINDOW, LATER, STEADY = 2 * EPOCH, 4 * EPOCH, (100, 300)  # steps


def said(lines, pattern):
    """The first number `pattern` (one group) finds in the chief's lines."""
    return next(float(m.group(1)) for line in lines for m in [re.search(pattern, line)] if m)


def excess(durations, start):
    """Seconds the WINDOW steps from `start` took over the same steps LATER on (as many
    validations and synchronisations, none of the first traces)."""
    return (sum(durations[start:start + WINDOW])
            - sum(durations[start + LATER:start + LATER + WINDOW]))


def steady_step(durations):
    """The mean step over STEADY, its synchronisations included, its validations (each
    epoch's first step) not."""
    return statistics.mean(durations[k] for k in range(*STEADY) if k % EPOCH)


def costs(synchronous, local):
    """{began, trace, switch, switch_traces, compute, local_step, local_overhead} of one
    seed from its two runs ({"durations": seconds per step, "said": the chief's lines})."""
    began = int(said(local["said"], r"warmup_steps auto at step (\d+): .*local steps begin"))
    switch = excess(local["durations"], began) - excess(synchronous["durations"], began)
    trace = said(local["said"], r"first step's trace, ([\d.]+) s")
    compute = said(local["said"], r"compute ([\d.]+) s/step")
    step = steady_step(local["durations"])
    return {"began": began, "trace": trace, "switch": switch, "switch_traces": switch / trace,
            "compute": compute, "local_step": step, "local_overhead": step / compute}


def summary(results):
    """{constant: median over seeds} and the per-seed costs."""
    per_seed = [costs(*(next(r for r in results["runs"] if r["seed"] == seed
                             and r["method"] == method) for method in PAIR))
                for seed in sorted({r["seed"] for r in results["runs"]})]
    return {"switch_traces": statistics.median(c["switch_traces"] for c in per_seed),
            "local_overhead": statistics.median(c["local_overhead"] for c in per_seed),
            "seeds": per_seed}


def markdown(results):
    from tfdist.local_sgd import go_local

    s = summary(results)
    lines = [f"# What going local costs (measured {results['measured']})", "",
             " ".join(__doc__.split("\n\n")[1].split()), "",
             "| seed | local from step | first step's trace | switch | switch / trace | "
             "auto's compute | steady local step | local step / compute |",
             "|---|---|---|---|---|---|---|---|"]
    for seed, c in zip(sorted({r["seed"] for r in results["runs"]}), s["seeds"]):
        lines.append(f"| {seed} | {c['began']} | {c['trace']:.2f} s | {c['switch']:.2f} s | "
                     f"{c['switch_traces']:.2f} | {c['compute'] * 1e3:.0f} ms | "
                     f"{c['local_step'] * 1e3:.1f} ms | {c['local_overhead']:.3f} |")
    lines += ["", f"Medians: switch / trace {s['switch_traces']:.2f} (go_local.SWITCH_TRACES "
              f"= {go_local.SWITCH_TRACES}), local step / compute {s['local_overhead']:.3f} "
              f"(go_local.LOCAL_OVERHEAD = {go_local.LOCAL_OVERHEAD})."]
    return "\n".join(lines) + "\n"


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tfdist.local_sgd import go_local

    seeds = summary(results)["seeds"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = range(len(seeds))
    ax.bar([k - 0.2 for k in x], [c["switch"] for c in seeds], 0.4, label="switch, measured")
    ax.bar([k + 0.2 for k in x], [go_local.SWITCH_TRACES * c["trace"] for c in seeds], 0.4,
           label=f"predicted: {go_local.SWITCH_TRACES} x the first step's trace")
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"seed {r}" for r in sorted({r['seed'] for r in results["runs"]})])
    ax.set_ylabel("seconds, once")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(method, seed, workdir):
    plan = tta.PLANS["full"]
    metrics = slow_network.run(method, RATE, plan["steps"], workdir, epochs=plan["epochs"],
                               seed=seed, flags=("--validation_steps", plan["validation_steps"]))
    times = [t for t, _, _ in metrics["timeline"]]
    return {"method": method, "seed": seed, "said": metrics["said"],
            "durations": [b - a for a, b in zip([0.0] + times, times)]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    path = tta.RESULTS / f"{NAME}.json"
    if not args.report_only:
        if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
            parser.error(f"--seeds: distinct counts from 0, got {args.seeds}")
        with tempfile.TemporaryDirectory(prefix="tfdist-go-local-") as workdir:
            runs = [run(method, seed, workdir) for seed in args.seeds for method in PAIR]
        path.write_text(json.dumps({"measured": datetime.date.today().isoformat(),
                                    "rate_bits": RATE, "runs": runs}, indent=1))
    tta.write_files(NAME, json.loads(path.read_text()), markdown, plot)


if __name__ == "__main__":
    main()
