"""Where tfdist's pass-through step spends its milliseconds, against plain tf.distribute
(issue 33): overhead.py on 2 workers in a private network namespace.

    sudo python benchmarks/pass_through.py [--pairs 24] [--block 16] [--name pass_through]
        [--rungs plain,own,trainer_step,trainer_input,trainer] [--profile]

Writes results/NAME.json (raw) and NAME.md: the overhead (geometric mean of alternating
block pairs, 95% interval). With more than two `--rungs` (overhead.py's ladder from plain
tf.distribute to the Trainer), the account: what each rung adds to the step over the one
before, in wall and CPU milliseconds per step (paired blocks, 95% interval), and in graph
ops by type; and its plot (NAME.png). With --profile, from one traced block of each loop
on the chief (TF's profiler, which slows the step: for ranking only), op ms by type.
"""

import argparse
import json
import statistics
import tempfile

from measure import overhead_pairs
from measure.overhead_pairs import NAMES, difference

#: Each rung's predecessor in the account (`plain_fresh` is a side rung: a new iterator).
BEFORE = {"plain_fresh": "plain", "own": "plain", "trainer_step": "own",
          "trainer_input": "trainer_step", "trainer": "trainer_input",
          "trainer_fresh": "trainer"}
#: What each rung adds over its predecessor.
ADDS = {"plain_fresh": "a new input iterator per block (what each `fit` call starts)",
        "own": "tfdist's exchange and transactional update (DistributedOptimizer, tfdist.function)",
        "trainer_step": "the Trainer's graph (take-back of the non-trainable state, the metrics' "
                        "one all-reduce)",
        "trainer_input": "the Trainer's input (no autotuning thread, plain iterators)",
        "trainer": "Trainer.fit: its Python loop and callbacks (one fit, one input iterator)",
        "trainer_fresh": "a `fit` call per block: a new input iterator each"}
def account(metrics):
    """[(rung, predecessor, wall (mean, half), cpu (mean, half), ops added, top op types)]."""
    wall, cpu = metrics["block_median_seconds"], metrics["block_cpu_seconds_per_step"]
    ops = metrics["graph_ops"]
    rows = []
    for rung in metrics["rungs"]:
        prior = BEFORE.get(rung)
        if prior not in metrics["rungs"]:
            continue
        a, b = NAMES.get(rung, rung), NAMES.get(prior, prior)
        kinds = set(ops[a]) | set(ops[b])
        by_type = {k: ops[a].get(k, 0) - ops[b].get(k, 0) for k in kinds}
        top = sorted((k for k in by_type if by_type[k]), key=lambda k: (-abs(by_type[k]), k))[:6]
        rows.append((rung, prior, difference(wall[a], wall[b]), difference(cpu[a], cpu[b]),
                     sum(by_type.values()), [(k, by_type[k]) for k in top]))
    return rows


def account_lines(metrics):
    wall, cpu = metrics["block_median_seconds"], metrics["block_cpu_seconds_per_step"]
    lines = ["| loop | wall ms/step | CPU ms/step | graph ops |", "|---|---|---|---|"]
    for rung in metrics["rungs"]:
        name = NAMES.get(rung, rung)
        lines.append(f"| {rung} | {1000 * statistics.median(wall[name]):.1f} | "
                     f"{1000 * statistics.median(cpu[name]):.1f} | "
                     f"{sum(metrics['graph_ops'][name].values())} |")
    lines += ["", "Graph ops: the nodes of each compiled step's graph and of the functions it "
              "calls, counted once each (both branches of a `tf.cond`, of which one runs).",
              "", "| rung | adds | wall ms/step (95% interval) | CPU ms/step (95% interval) | "
              "graph ops | the op types added most |", "|---|---|---|---|---|---|"]
    for rung, prior, (w, wh), (c, ch), ops, top in account(metrics):
        kinds = ", ".join(f"{k} {n:+d}" for k, n in top)
        lines.append(f"| {prior} → {rung} | {ADDS[rung]} | {w:+.2f} (±{wh:.2f}) | "
                     f"{c:+.2f} (±{ch:.2f}) | {ops:+d} | {kinds} |")
    if "trainer_host_seconds_per_step" in metrics:
        host = metrics["trainer_host_seconds_per_step"]
        lines += ["", f"Inside Trainer.fit, the host's time around each compiled step (the "
                  f"median step's wall time minus the median call's: reading the batch, "
                  f"the Python loop, callbacks): {1000 * statistics.median(host):.2f} ms."]
    return lines


def plot(metrics, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = account(metrics)
    fig, ax = plt.subplots(figsize=(7, 3.2))  # wall time: a new iterator's CPU (~30 ms of
    ax.barh(range(len(rows)), [r[2][0] for r in rows], 0.6,  # background threads) is in the
            xerr=[r[2][1] for r in rows], capsize=3)         # table
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r[1]} → {r[0]}" for r in rows], fontsize=8)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlabel("wall ms per step added (95% interval)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(profile, rows=12):
    plain, mine = profile["plain tf.distribute"], profile["tfdist"]
    lines = ["| per step | plain tf.distribute | tfdist | difference |", "|---|---|---|---|"]
    for key, label in (("wall_ms", "wall ms"), ("op_ms", "op ms (summed over threads)"),
                       ("ops", "ops run")):
        lines.append(f"| {label} | {plain[key]:.2f} | {mine[key]:.2f} | "
                     f"{mine[key] - plain[key]:+.2f} |")
    rest = [p["wall_ms"] - p["op_ms"] for p in (plain, mine)]
    lines.append(f"| wall − op ms | {rest[0]:.2f} | {rest[1]:.2f} | {rest[1] - rest[0]:+.2f} |")
    kinds = set(plain["by_type_ms"]) | set(mine["by_type_ms"])
    diff = {k: mine["by_type_ms"].get(k, 0) - plain["by_type_ms"].get(k, 0) for k in kinds}
    lines += ["", "| op type | plain ms/step | tfdist ms/step | difference |", "|---|---|---|---|"]
    for kind in sorted(diff, key=lambda k: (-abs(diff[k]), k))[:rows]:
        lines.append(f"| {kind} | {plain['by_type_ms'].get(kind, 0):.3f} | "
                     f"{mine['by_type_ms'].get(kind, 0):.3f} | {diff[kind]:+.3f} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=24)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--name", default="pass_through")
    parser.add_argument("--profile", action="store_true", help="also trace a block of each")
    parser.add_argument("--rewrite", action="store_true",
                        help="rewrite NAME.md and NAME.png from NAME.json (no measurement)")
    args, flags = parser.parse_known_args()  # the rest: overhead.py's (--rungs, ...)
    raw = overhead_pairs.RESULTS / f"{args.name}.json"
    if args.rewrite:
        metrics = json.loads(raw.read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="tfdist-pass-through-") as workdir:
            metrics = overhead_pairs.measure_overhead(args.pairs, args.block, workdir, *flags,
                                              *(["--profile"] if args.profile else []))
        metrics["overhead_flags"] = flags
        raw.write_text(json.dumps(metrics, indent=1))
    write(args.name, metrics)


def write(name, metrics):
    """results/NAME.md (and NAME.png for a ladder) from overhead.py's metrics."""
    ratio, interval, pairs = overhead_pairs.overhead({"overhead": metrics})
    flags = metrics.get("overhead_flags", [])
    lines = [f"# tfdist pass-through against plain tf.distribute ({name})", "",
             *([metrics["note"], ""] if "note" in metrics else []),
             f"overhead.py on 2 workers (one core each) in a private network namespace: "
             f"{ratio - 1:+.1%} (95% interval {interval[0] - 1:+.1%} to {interval[1] - 1:+.1%}, "
             f"{pairs} pairs of {metrics['block_steps']}-step blocks; overhead.py flags: "
             f"{' '.join(flags) or 'none'}).", ""]
    ratio, interval, pairs = overhead_pairs.fresh_overhead({"overhead": metrics})
    if ratio is not None and interval is not None:
        who = ("`Trainer.fit` called per block" if "trainer_fresh" in metrics.get("rungs", []) else
               "tfdist")
        lines += [f"With a new input iterator each block on both sides ({who}, against plain "
                  f"tf.distribute's loop starting one each block, as the tutorial's loop does "
                  f"each epoch): {ratio - 1:+.1%} (95% interval {interval[0] - 1:+.1%} to "
                  f"{interval[1] - 1:+.1%}).", ""]
    if len(metrics.get("rungs", [])) > 2:
        lines += ["Where the milliseconds go: each loop of overhead.py's ladder adds one part "
                  "of tfdist to the one before, in the same processes, in turns "
                  "(CPU time leaves out waiting for the other worker).", "",
                  *account_lines(metrics), ""]
        plot(metrics, overhead_pairs.RESULTS / f"{name}.png")
    if "profile" in metrics:
        lines += ["One more block of each loop traced by TF's profiler on the chief "
                  "(benchmarks/measure/op_profile.py):", "", *table(metrics["profile"])]
    (overhead_pairs.RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
