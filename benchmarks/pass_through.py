"""Where tfdist's pass-through step spends its milliseconds, against plain tf.distribute
(issue 33): `overhead.py --profile` on 2 workers in a private network namespace.

    sudo python benchmarks/pass_through.py [--pairs 24] [--block 16] [--name pass_through]

Writes results/NAME.json (raw) and NAME.md: the overhead (geometric mean of alternating
block pairs, 95% interval) and, from one traced block of each loop on the chief, wall ms
per step split into op ms and the rest (Python, dispatch, waiting in collectives), ops run
per step, and the op types whose time differs most.
"""

import argparse
import json
import tempfile

import report


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
    for kind in sorted(diff, key=lambda k: -abs(diff[k]))[:rows]:
        lines.append(f"| {kind} | {plain['by_type_ms'].get(kind, 0):.3f} | "
                     f"{mine['by_type_ms'].get(kind, 0):.3f} | {diff[kind]:+.3f} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=24)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--name", default="pass_through")
    parser.add_argument("--profile", action="store_true", help="also trace a block of each")
    args, flags = parser.parse_known_args()  # the rest: overhead.py's (--tfdist_loop, ...)
    with tempfile.TemporaryDirectory(prefix="tfdist-pass-through-") as workdir:
        metrics = report.measure_overhead(args.pairs, args.block, workdir, *flags,
                                          *(["--profile"] if args.profile else []))
    ratio, interval, pairs = report.overhead({"overhead": metrics})
    (report.RESULTS / f"{args.name}.json").write_text(json.dumps(metrics, indent=1))
    lines = [f"# tfdist pass-through against plain tf.distribute ({args.name})", "",
             f"overhead.py on 2 workers (one core each) in a private network namespace: "
             f"{ratio - 1:+.1%} (95% interval {interval[0] - 1:+.1%} to {interval[1] - 1:+.1%}, "
             f"{pairs} pairs of {args.block}-step blocks; overhead.py flags: "
             f"{' '.join(flags) or 'none'}).", ""]
    if args.profile:
        lines += ["One more block of each loop traced by TF's profiler on the chief "
                  "(benchmarks/op_profile.py):", "", *table(metrics["profile"])]
    (report.RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
