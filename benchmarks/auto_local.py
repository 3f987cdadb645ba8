"""`warmup_steps: auto` against the best fixed methods, all measured the same day (issue 33,
item 2: the DiLoCo family among auto's candidates).

    sudo python benchmarks/auto_local.py [--rates 1000 20] [--seeds 0 1] [--methods M ...]
                                         [--resume]

The UNet on 2 workers as 2 hosts on a `tc tbf` link (time_to_accuracy.py's runs): fp16,
top-k + EF, PowerSGD + EF, `compression: auto` and "auto, then Streaming DiLoCo 32"
(synchronous as auto chooses until local steps are predicted to pay). The machine's speed
varies up to 3x between days, so these runs are compared only with each other. Writes
results/auto_local.json (raw) and auto_local.md: time to mean IoU 0.85 per link, what
auto chose and when local steps began, and the target (auto with local steps within 5% of
the best fixed method on each link) met or MISSED.
"""

import argparse
import datetime
import json
import re
import shutil
import statistics
import tempfile

import time_to_accuracy as tta

NAME = "auto_local"
FIXED = ["fp16", "topk+EF", "powersgd+EF"]
AUTO = "auto, then Streaming DiLoCo 32"
METHODS = [*FIXED, "auto", AUTO]
TARGET = 0.85
LIMIT = 1.25  # issue 33: the slowest link's best within this of the fastest link's best


def mean_seconds(runs, method, rate):
    """Mean seconds to mean IoU TARGET over the seeds of `method` at `rate` (None unless
    every seed reached it)."""
    times = [r[f"seconds_to_{TARGET}"] for r in runs
             if r["method"] == method and r["rate_bits"] == rate]
    return statistics.mean(times) if times and None not in times else None


def choices(run):
    """What auto chose, and the step local steps began at, from the chief's lines."""
    kept = [m.group(1) for line in run.get("said", ())
            for m in [re.search(r"(?:keeping|starting with|trying) ([\w+]+)", line)] if m]
    if not run.get("said"):
        return "its lines were not recorded"
    if not run["method"].startswith("auto, then"):
        return f"{kept[-1] if kept else '?'}"
    began, total = run.get("local_from"), len(run["epochs"]) * 40
    if began == 0:  # judged before the first step: auto's prior never ran
        return "local from step 0 (no synchronous step)"
    local = f"local from step {began}" if began is not None and began < total else "no local steps"
    return f"{kept[-1] if kept else '?'}; {local}"


def seeds_of(runs):
    """"seeds [0, 1]", or each method's seeds per link where they differ."""
    ran = {}
    for r in runs:
        ran.setdefault((r["rate_bits"], r["method"]), set()).add(r["seed"])
    if len({tuple(sorted(s)) for s in ran.values()}) <= 1:
        return f"seeds {sorted({r['seed'] for r in runs})}"
    return "each method's seeds: " + "; ".join(
        f"{rate / tta.MBIT:.0f} Mbit/s {method} {sorted(seeds)}"
        for (rate, method), seeds in sorted(ran.items(), key=lambda kv: (-kv[0][0], kv[0][1])))


def compared(results):
    """(methods, the fixed ones among them) a results file compares: its own lists (a
    benchmark built on this one, slow_link_limit.py), else this one's."""
    return results.get("methods", METHODS), results.get("fixed", FIXED)


def candidates(results):
    """The methods of auto with local steps (`warmup_steps: auto`) a results file compares."""
    return [m for m in compared(results)[0] if m.startswith("auto, then")]


def verdicts(results, candidate=AUTO):
    """[(link bits/s, {method: mean seconds to TARGET}, the best fixed method, `candidate`
    (auto with local steps, or plain auto) over it, met)] per link, fastest first."""
    runs = results["runs"]
    methods, fixed_methods = compared(results)
    out = []
    for rate in sorted({r["rate_bits"] for r in runs}, reverse=True):
        seconds = {m: mean_seconds(runs, m, rate) for m in methods}
        fixed = {m: seconds[m] for m in fixed_methods if seconds[m] is not None}
        best = min(fixed, key=fixed.get) if fixed else None
        ratio = seconds.get(candidate) / fixed[best] if best and seconds.get(candidate) else None
        out.append((rate, seconds, best, ratio, ratio is not None and ratio <= 1.05))
    return out


def steps_to_target(run, steps_per_epoch):
    """Training steps until validation (after each epoch) first reached TARGET, or None."""
    reached = [i for i, e in enumerate(run["epochs"]) if e["val_mean_iou"] >= TARGET]
    return (reached[0] + 1) * steps_per_epoch if reached else None


def slow_link_limit(results):
    """Issue 33's limit on same-day runs: the slowest link's best time to TARGET (any
    method) against the fastest link's best, as {slow, fast: (bits/s, method, seconds,
    mean steps to TARGET, mean step seconds after any switch), ratio, steps_ratio, met};
    None without two links; `steps_bound`: the ratio had the slow run cost only its steps
    over the fast run's own other seconds (first trace, validations): no warm-up, no switch
    to local steps, whatever the link."""
    runs, per_epoch = results["runs"], results["plan"]["steps"]
    rates = sorted({r["rate_bits"] for r in runs})
    if len(rates) < 2:
        return None

    def best(rate):
        seconds = {m: mean_seconds(runs, m, rate) for m in compared(results)[0]}
        method = min((m for m in seconds if seconds[m] is not None), key=seconds.get,
                     default=None)
        if method is None:
            return None
        mine = [r for r in runs if r["method"] == method and r["rate_bits"] == rate]
        steps = [steps_to_target(r, per_epoch) for r in mine]
        step = statistics.mean(r["local_seconds_per_step"] or r["seconds_per_step"]
                               for r in mine)
        return rate, method, seconds[method], statistics.mean(steps), step

    slow, fast = best(rates[0]), best(rates[-1])
    if slow is None or fast is None:
        return None
    ratio = slow[2] / fast[2]
    fixed = fast[2] - fast[3] * fast[4]  # the fast run's seconds besides its steps
    return {"slow": slow, "fast": fast, "ratio": ratio, "steps_ratio": slow[3] / fast[3],
            "steps_bound": (slow[3] * slow[4] + fixed) / fast[2], "met": ratio <= LIMIT}


def describe_limit(limit):
    """One sentence on `slow_link_limit`'s verdict."""
    (slow, s_method, s_seconds, s_steps, s_step) = limit["slow"]
    (fast, f_method, f_seconds, f_steps, f_step) = limit["fast"]
    return (f"the best at {slow / tta.MBIT:.0f} Mbit/s ({s_method}, {s_seconds:.1f} s) against "
            f"the best at {fast / tta.MBIT:.0f} Mbit/s ({f_method}, {f_seconds:.1f} s): "
            f"{limit['ratio']:.2f}× (target ≤ {LIMIT}×). It took {limit['steps_ratio']:.2f}× "
            f"the steps ({s_steps:.0f} against {f_steps:.0f}) at a step of "
            f"{s_step * 1000:.0f} ms against {f_step * 1000:.0f} ms: had it cost only "
            f"its steps over the fast run's other seconds, {limit['steps_bound']:.2f}×")


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = verdicts(results)
    methods = compared(results)[0]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        ax.bar([k + i * width for k in range(len(rows))],
               [r[1][method] or 0 for r in rows], width, label=method)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rows))])
    ax.set_xticklabels([f"{r[0] / tta.MBIT:.0f} Mbit/s" for r in rows])
    ax.set_ylabel(f"seconds to mean IoU {TARGET}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def per_method(results):
    """[(link bits/s, method, mean steps to TARGET, mean step ms after any switch, mean
    final mean IoU, mean final loss)] of the methods compared, fastest link first."""
    runs, per_epoch = results["runs"], results["plan"]["steps"]
    out = []
    for rate in sorted({r["rate_bits"] for r in runs}, reverse=True):
        for method in compared(results)[0]:
            mine = [r for r in runs if r["method"] == method and r["rate_bits"] == rate]
            if not mine:
                continue
            steps = [steps_to_target(r, per_epoch) for r in mine]
            out.append((rate, method, None if None in steps else statistics.mean(steps),
                        1000 * statistics.mean(r["local_seconds_per_step"]
                                               or r["seconds_per_step"] for r in mine),
                        statistics.mean(r["final_val_mean_iou"] for r in mine),
                        statistics.mean(r["final_loss"] for r in mine)))
    return out


def markdown(results):
    runs = results["runs"]
    methods, local = compared(results)[0], candidates(results)
    title = results.get("title", "Going local when it pays: `warmup_steps: auto`")
    lines = [f"# {title} (measured {results['measured']})",
             "", results.get("about", __doc__.split("\n\n")[2].replace("\n", " ")), "",
             "| " + " | ".join(["link", *methods, *(f"{m} vs the best fixed" for m in local)])
             + " |",
             "|---|" + "---|" * (len(methods) + len(local))]
    judged = {m: verdicts(results, m) for m in local}
    for row, (rate, seconds, *_) in enumerate(verdicts(results)):
        ran = {r["method"] for r in runs if r["rate_bits"] == rate}
        shown = [f"{s:.1f} s" if s is not None else "not reached" if m in ran else "not run"
                 for m, s in seconds.items()]
        against = [f"{ratio - 1:+.1%} ({best})" if ratio else "—"
                   for _, _, best, ratio, _ in (judged[m][row] for m in local)]
        lines.append(f"| {rate / tta.MBIT:.0f} Mbit/s | " + " | ".join(shown + against) + " |")
    lines += ["", f"Seconds of training to validation mean IoU 0.85, the mean over "
              f"{seeds_of(runs)}. Per method (means over seeds; steps until the first "
              "validation, every epoch, that reached it; the step after any switch to local "
              "steps):", "",
              "| link | method | steps to 0.85 | step | final mean IoU | final loss |",
              "|---|---|---|---|---|---|"]
    for rate, method, steps, step, iou, loss in per_method(results):
        lines.append(f"| {rate / tta.MBIT:.0f} Mbit/s | {method} | "
                     f"{'not reached' if steps is None else f'{steps:.0f}'} | {step:.1f} ms | "
                     f"{iou:.3f} | {loss:.4f} |")
    decided = [r for r in runs if r["method"] == "auto" or r["method"] in local]
    lines += ["", "What auto decided, per run:", ""] if decided else []
    for r in sorted(decided, key=lambda r: (-r["rate_bits"], r["method"], r["seed"])):
        lines.append(f"- {r['rate_bits'] / tta.MBIT:.0f} Mbit/s, {r['method']}, seed "
                     f"{r['seed']}: {choices(r)}; {r[f'seconds_to_{TARGET}']} s to "
                     f"{TARGET}, final mean IoU {r['final_val_mean_iou']:.3f}")
    lines += [""] + [f"Target: {m} within 5% of the best fixed method's time to accuracy on "
                     f"every link measured: **{'met' if all(v[-1] for v in judged[m]) else 'MISSED'}**."
                     for m in local]
    limit = slow_link_limit(results)
    if limit:
        lines += ["", f"Against the limit: {describe_limit(limit)}: "
                  f"**{'met' if limit['met'] else 'MISSED'}**."]
    return "\n".join(lines) + "\n"


def main(name=NAME, methods=METHODS, fixed=FIXED, rates=(1000, 20), about=None):
    """Runs (or, --report-only, reports) `methods` against the `fixed` ones; a benchmark
    built on this one names its own results file and says what it measures (`about`:
    {title, about}, kept in the results)."""
    parser = argparse.ArgumentParser(description=(about or {}).get("title", __doc__.split("\n")[0]))
    parser.add_argument("--rates", nargs="+", type=int, default=list(rates))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--methods", nargs="+", choices=methods, default=methods,
                        help="run only these (more seeds of some: each method's mean is over "
                             "the seeds it ran, which the report lists)")
    parser.add_argument("--resume", action="store_true", help="keep the runs already saved")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    path = tta.RESULTS / f"{name}.json"
    if not args.report_only:
        if len(set(args.methods)) != len(args.methods):
            parser.error(f"--methods: repeated {args.methods}")
        plan = dict(tta.PLANS["full"], rates=tuple(r * tta.MBIT for r in args.rates),
                    seeds=tuple(args.seeds), methods=args.methods)
        done = json.loads(path.read_text())["runs"] if args.resume and path.exists() else []
        workdir = tempfile.mkdtemp(prefix=f"tfdist-{name}-")
        try:
            results = tta.measure(plan, workdir, args.methods,
                                  tta.RESULTS / f"{name}-partial.json", done)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        results["measured"] = datetime.date.today().isoformat()
        if (methods, fixed) != (METHODS, FIXED):
            results.update(methods=list(methods), fixed=list(fixed), **(about or {}))
        path.write_text(json.dumps(results, indent=1))
        (tta.RESULTS / f"{name}-partial.json").unlink(missing_ok=True)
    tta.write_files(name, json.loads(path.read_text()), markdown, plot)


if __name__ == "__main__":
    main()
