"""What the step-time breakdown costs (issue 58): the step clock and the callbacks that
report it, each against the same loop without it, on 2 workers in a private network
namespace (overhead.py's alternating blocks in the same 2 processes).

    sudo python benchmarks/step_times_cost.py [--pairs 160] [--block 16]
        [--rungs own,own_unclocked,trainer,trainer_logged] [--rewrite]

The comparisons (each where both of its rungs ran):

  - the step clock (`tfdist.step.step_clock`, built for every routed optimizer under a
    multi-worker mirrored strategy of several workers: two `tf.timestamp`s, a few assigns,
    2 float32 per worker on the verdict's all-reduce): `own` against `own_unclocked`
    (and `trainer_step` against `trainer_step_unclocked`), the median step of each block;
  - `tfdist.callbacks.StepTimes()` and `tfdist.callbacks.TensorBoard(log_dir)` in
    `Trainer.fit`: `trainer_logged` against `trainer`, epochs of one fit, each epoch's wall
    time per step (its begin and end hooks included) and its median step (the batch hooks).

Per comparison: the added ms per step (mean of paired block differences) and % of the
base's step (geometric mean of the paired ratios), each with its 95% interval (Student's
t), and whether the interval's high end is within 1% of the step. Writes
results/step_times_cost.json (raw), .md and .png.
"""

import argparse
import datetime
import json
import math
import statistics
import tempfile

from measure import overhead_pairs
from measure.overhead_pairs import NAMES, difference

NAME = "step_times_cost"
RUNGS = "own,own_unclocked,trainer,trainer_logged"
LIMIT = 0.01  # issue 58: within the pass-through's 1%
#: (key, what is compared, the rung without it, the rung with it, the block figure).
COMPARISONS = (
    ("clock", "the step clock, in tfdist's step (`tfdist.function`)", "own_unclocked", "own",
     "block_median_seconds"),
    ("clock_trainer", "the step clock, in the Trainer's compiled step",
     "trainer_step_unclocked", "trainer_step", "block_median_seconds"),
    ("callbacks", "StepTimes + TensorBoard in Trainer.fit (epoch wall time per step)",
     "trainer", "trainer_logged", "block_epoch_seconds_per_step"),
    ("callbacks_batches", "StepTimes + TensorBoard in Trainer.fit, their batch hooks only "
     "(median step)", "trainer", "trainer_logged", "block_median_seconds"),
)


def ratio_interval(after, before):
    """Geometric mean of the paired ratios after/before and its 95% interval (Student's t
    on the logs): (ratio, (low, high))."""
    logs = [math.log(a / b) for a, b in zip(after, before)]
    mean, n = statistics.mean(logs), len(logs)
    half = overhead_pairs.t_quantile(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def comparisons(metrics):
    """[{key, what, without, with, figure, base_ms, ms, ms_half, ratio, interval, within}]
    for each of `COMPARISONS` whose rungs and figures `metrics` (overhead.py's) holds."""
    rows = []
    for key, what, without, with_, figure in COMPARISONS:
        blocks = metrics.get(figure, {})
        a, b = NAMES.get(with_, with_), NAMES.get(without, without)
        if a not in blocks or b not in blocks:
            continue
        ms, half = difference(blocks[a], blocks[b])
        ratio, interval = ratio_interval(blocks[a], blocks[b])
        rows.append({"key": key, "what": what, "without": without, "with": with_,
                     "figure": figure, "base_ms": 1000 * statistics.median(blocks[b]),
                     "ms": ms, "ms_half": half, "ratio": ratio, "interval": interval,
                     "within": interval[1] - 1 <= LIMIT})
    return rows


def both(rows):
    """The clock's and the callbacks' (epoch wall) costs added: (ms, 95% half-width of the
    sum of two independent estimates, share of the Trainer's step), or None."""
    found = {r["key"]: r for r in rows}
    if "clock" not in found or "callbacks" not in found:
        return None
    clock, callbacks = found["clock"], found["callbacks"]
    ms = clock["ms"] + callbacks["ms"]
    return ms, math.hypot(clock["ms_half"], callbacks["ms_half"]), ms / callbacks["base_ms"]


def added_ops(metrics, without, with_):
    """(graph ops `with_`'s step has more than `without`'s, [(op type, count)] of the
    differences)."""
    ops = metrics["graph_ops"]
    a, b = ops[NAMES.get(with_, with_)], ops[NAMES.get(without, without)]
    by_type = {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}
    return sum(by_type.values()), sorted(((k, n) for k, n in by_type.items() if n),
                                         key=lambda kn: (-abs(kn[1]), kn[0]))


def markdown(metrics):
    rows = comparisons(metrics)
    pairs = len(next(iter(metrics["block_median_seconds"].values())))
    lines = [f"# What the step-time breakdown costs ({NAME})", "",
             f"Measured on {metrics.get('measured', 'an earlier day')}: overhead.py on 2 workers "
             f"(one core each) in a private network namespace, {pairs} rounds of "
             f"{metrics['block_steps']}-step blocks, each loop once a round in turns "
             f"(`--rungs {','.join(metrics['rungs'])}`). The step clock is off in a rung "
             "`*_unclocked` only: that optimizer's pipeline holds a clock whose build makes "
             "nothing (`overhead.Unclocked`), in the benchmark process only. The callbacks "
             "are on in `trainer_logged`'s epochs of the Trainer's one fit and off in "
             "`trainer`'s (`overhead.Gate`), so both kinds of epochs share one Trainer and "
             "one input iterator.", "",
             "| what it costs | without → with | base ms/step | added ms/step (95% interval) | "
             f"added % (95% interval) | within {LIMIT:.0%} |", "|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["interval"]
        lines.append(f"| {r['what']} | {r['without']} → {r['with']} | {r['base_ms']:.1f} | "
                     f"{r['ms']:+.2f} (±{r['ms_half']:.2f}) | {r['ratio'] - 1:+.2%} "
                     f"({low - 1:+.2%} to {high - 1:+.2%}) | "
                     f"{'yes' if r['within'] else '**no**'} |")
    lines += ["", f"Within {LIMIT:.0%}: the 95% interval's high end at most {LIMIT:.0%} of "
              "the step without it."]
    cpu = metrics.get("block_cpu_seconds_per_step", {})
    shown = [(r, difference(*(cpu[NAMES.get(k, k)] for k in (r["with"], r["without"]))))
             for r in rows if r["figure"] == "block_median_seconds"
             and {NAMES.get(k, k) for k in (r["with"], r["without"])} <= set(cpu)]
    if shown:
        lines += ["", "CPU time per step (the process's, which leaves out waiting for the "
                  "other worker; the whole block's, epoch ends included): " + "; ".join(
                      f"{r['without']} → {r['with']} {ms:+.2f} ms (±{half:.2f})"
                      for r, (ms, half) in shown) + "."]
    total = both(rows)
    if total is not None:
        ms, half, share = total
        lines += ["", f"The clock and the callbacks together (the two estimates added; their "
                  f"intervals combined as independent): {ms:+.2f} ms per step (±{half:.2f}), "
                  f"{share:+.2%} of the Trainer's step."]
    found = {r["key"]: r for r in rows}
    if "callbacks" in found:
        epoch, half = (metrics["block_steps"] * found["callbacks"][k] for k in ("ms", "ms_half"))
        lines += ["", f"Per epoch, the callbacks add {epoch:+.1f} ms (±{half:.1f}) to a "
                  f"{metrics['block_steps']}-step epoch; what they do at an epoch's ends "
                  "(reading the clock's totals, writing the scalars) weighs less per step in "
                  "longer epochs."]
    for key in ("clock", "clock_trainer"):
        if key in found:
            r = found[key]
            count, kinds = added_ops(metrics, r["without"], r["with"])
            lines += ["", f"Graph ops the clock adds to `{r['with']}`'s step: {count:+d} ("
                      + ", ".join(f"{k} {n:+d}" for k, n in kinds[:8]) + ")."]
    rung = {name: r for r, name in NAMES.items()}
    active = metrics.get("clock_active", {})
    if active:
        lines += ["", "Step clock active, per routed loop (checked after the run): " + ", ".join(
            f"{rung.get(name, name)} {'yes' if on else 'no'}" for name, on in active.items())
            + "."]
    keys = metrics.get("epoch_log_keys", {})
    if keys:
        lines += ["", "StepTimes' figures in the last epoch's logs: " + ", ".join(
            f"{rung.get(name, name)} {sum('step_' in k for k in got)}"
            for name, got in keys.items()) + f"; TensorBoard event files the chief wrote: "
            f"{len(metrics.get('tensorboard_files', []))}."]
    return lines


def plot(metrics, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = comparisons(metrics)
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(rows) + 1.4))
    middle = [100 * (r["ratio"] - 1) for r in rows]
    errors = [[m - 100 * (r["interval"][0] - 1) for m, r in zip(middle, rows)],
              [100 * (r["interval"][1] - 1) - m for m, r in zip(middle, rows)]]
    ax.barh(range(len(rows)), middle, 0.6, xerr=errors, capsize=3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r['without']} → {r['with']}\n(" + (
        "epoch wall" if r["figure"] == "block_epoch_seconds_per_step" else "median step") + ")"
        for r in rows], fontsize=8)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.axvline(100 * LIMIT, color="red", linewidth=0.8, linestyle="--", label=f"{LIMIT:.0%}")
    ax.invert_yaxis()
    ax.set_xlabel("step time added, % (95% interval)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(metrics):
    """results/step_times_cost.md and .png from overhead.py's metrics."""
    lines = markdown(metrics)
    (overhead_pairs.RESULTS / f"{NAME}.md").write_text("\n".join(lines) + "\n")
    plot(metrics, overhead_pairs.RESULTS / f"{NAME}.png")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=160, help="rounds (blocks per loop)")
    parser.add_argument("--block", type=int, default=16, help="steps per block (and epoch)")
    parser.add_argument("--rungs", default=RUNGS, help="overhead.py's loops to run")
    parser.add_argument("--rewrite", action="store_true",
                        help="rewrite the .md and .png from the .json (no measurement)")
    args = parser.parse_args()
    raw = overhead_pairs.RESULTS / f"{NAME}.json"
    if args.rewrite:
        metrics = json.loads(raw.read_text())
    else:
        if args.pairs < 2 or args.block < 1:
            parser.error(f"--pairs must be at least 2 and --block at least 1. "
                         f"Received: pairs={args.pairs}, block={args.block}")
        with tempfile.TemporaryDirectory(prefix="tfdist-step-times-cost-") as workdir:
            metrics = overhead_pairs.measure_overhead(args.pairs, args.block, workdir,
                                              "--rungs", args.rungs)
        metrics["measured"] = datetime.date.today().isoformat()
        metrics["comparisons"] = comparisons(metrics)
        raw.write_text(json.dumps(metrics, indent=1))
    write(metrics)


if __name__ == "__main__":
    main()
