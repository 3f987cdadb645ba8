"""Time to accuracy on a real capped link: what a user on a slow network buys.

Each run trains the UNet example (or the language model, `--workload lm`) on 2 workers as 2 hosts (network namespaces joined by a
veth pair capped by `tc tbf`, measure/slow_network.py) over the full schedule, validating after
every epoch. Per method, link speed and seed it records the training seconds (every step
and all that runs between steps — averages, phase switches, tracing — validation left
out) at which validation mean IoU (perplexity) first reaches each target, its final value, the
wall seconds per step and the bytes this worker received per step on the link.

    sudo python benchmarks/time_to_accuracy.py [--quick] [--methods none topk+EF ...]
        [--rates 100 20] [--seeds 0 1] [--resume] [--workload lm]

Runs are saved as they finish (time_to_accuracy-partial.json); --resume skips those done
(in the partial file, else in the last results).

Writes benchmarks/results/time_to_accuracy.json (raw) and .md (the table); report.py
puts both at the head of docs/benchmarks.md. The language model's: time_to_accuracy_lm.*
(every method on one link, 100 Mbit/s, 2 seeds).
"""

import argparse
import json
import re
import shutil
import statistics
import tempfile
import time

from measure import slow_network
from measure.methods import METHODS
from measure.netns import ROOT
from measure.workloads import WORKLOADS

RESULTS = ROOT / "benchmarks" / "results"
UNET = WORKLOADS["unet"]
TARGETS = UNET.targets
MBIT = 1_000_000
ALL_METHODS = ["none", "fp16", "bf16", "int8", "qsgd", "sign+EF", "topk+EF", "randomk+EF",
               "powersgd+EF", "local SGD 8", "topk+DGC", "topk+EF21", "sign+EF21",
               "topk+EF from 80", "sign+EF from 80", "topk+EF from 80, frozen v",
               "sign+EF from 80, frozen v", "powersgd+EF from 80, frozen v", "auto",
               "local SGD 32, warm-up 80", "DiLoCo 32", "Streaming DiLoCo 32",
               "Streaming DiLoCo 32, warm-up 20", "powersgd+EF rank 6", "topk+EF 4%"]
PLANS = {
    # The demo's schedule (480 steps of 32 samples) in epochs of 40 steps, 8 validation steps.
    # the fastest link first: its runs alone give every method's quality at convergence
    "full": {"rates": (1000 * MBIT, 100 * MBIT, 20 * MBIT), "seeds": (0, 1, 2),
             "epochs": 12, "steps": 40, "validation_steps": 8, "methods": ALL_METHODS},
    "quick": {"rates": (100 * MBIT,), "seeds": (0,), "epochs": 6, "steps": 40,
              "validation_steps": 4, "methods": ["none", "topk+EF"]},
    # the language model: 12 epochs of 40 steps of 32 sequences (islands.py's schedule)
    "lm": {"rates": (100 * MBIT,), "seeds": (0, 1), "epochs": 12, "steps": 40,
           "validation_steps": 8, "methods": ALL_METHODS, "workload": "lm"},
}
LOCAL_SGD_WARMUP = 240  # post-local SGD: synchronous for the first half (benchmarks/local_sgd.py)


def workload_of(results):
    return WORKLOADS[results.get("workload", "unet")]


def time_to(epochs, target, workload=UNET):
    """Training seconds at the first validation reaching `target`, else None."""
    return next((e["train_seconds"] for e in epochs
                 if workload.reached(e[workload.metric], target)), None)


def bytes_per_step(timeline, skip=10):
    """Bytes received per step after the first `skip` steps, from (seconds, loss, bytes)."""
    if len(timeline) <= skip or timeline[skip - 1][2] is None or timeline[-1][2] is None:
        return None
    return (timeline[-1][2] - timeline[skip - 1][2]) / (len(timeline) - skip)


def training_spans(timeline, column, skip, steps_per_epoch):
    """Differences of `column` (0: seconds, 2: bytes) between consecutive steps after the
    first `skip`, everything between two steps of an epoch included (averages, exchanges),
    the span into each epoch's first step (which holds validation, and the model average a
    local-SGD method's validation needs) left out."""
    values = [row[column] for row in timeline]
    return [values[k] - values[k - 1] for k in range(max(skip, 1), len(values))
            if k % steps_per_epoch and values[k] is not None and values[k - 1] is not None]


def seconds_per_step_after(timeline, skip, steps_per_epoch):
    """Mean wall seconds of a training step after the first `skip` (`training_spans`): a
    local-SGD method's step after its synchronous warm-up."""
    spans = training_spans(timeline, 0, skip, steps_per_epoch)
    return sum(spans) / len(spans) if spans else None


def training_bytes_per_step(timeline, skip, steps_per_epoch):
    """Mean bytes received in a training step after the first `skip` (`training_spans`)."""
    spans = training_spans(timeline, 2, skip, steps_per_epoch)
    return sum(spans) / len(spans) if spans else None


def peak_bytes_per_step(timeline, skip=10):
    """The most bytes received in one step after the first `skip` steps."""
    received = [b for _, _, b in timeline[skip - 1:]]
    if len(received) < 2 or None in received:
        return None
    return max(b - a for a, b in zip(received, received[1:]))


def run_one(method, rate, seed, plan, workdir):
    """One training run across the capped link; returns its row."""
    warmup = LOCAL_SGD_WARMUP * plan["epochs"] * plan["steps"] // 480
    workload = WORKLOADS[plan.get("workload", "unet")]
    metrics = slow_network.run(method, rate, plan["steps"], workdir, epochs=plan["epochs"],
                               seed=seed, warmup=warmup, train=workload.script,
                               flags=("--validation_steps", plan["validation_steps"]))
    warmup = local_warmup(method, warmup, metrics.get("said", ()),
                          plan["epochs"] * plan["steps"])
    epochs = [{"train_seconds": e["train_seconds"], "wall_seconds": e["wall_seconds"],
               workload.metric: e[workload.metric], "loss": e["loss"]}
              for e in metrics["epochs"]]
    return {"method": method, "rate_bits": rate, "seed": seed, "epochs": epochs,
            "said": metrics.get("said", []), "local_from": warmup,
            "seconds_per_step": metrics["seconds_per_step"],
            "bytes_per_step": bytes_per_step(metrics["timeline"]),
            # after a local-SGD method's synchronous warm-up (+10 steps): what it sends then
            "local_bytes_per_step": bytes_per_step(metrics["timeline"], warmup + 10),
            "training_bytes_per_step": training_bytes_per_step(
                metrics["timeline"], warmup + 10, plan["steps"]),
            "peak_bytes_per_step": peak_bytes_per_step(metrics["timeline"],
                                                       warmup + 10),
            "local_seconds_per_step": seconds_per_step_after(
                metrics["timeline"], warmup + 10, plan["steps"]),
            workload.final_key: epochs[-1][workload.metric], "final_loss": epochs[-1]["loss"],
            "train_seconds": epochs[-1]["train_seconds"],
            "wall_seconds": metrics["wall_time_seconds"],
            **{f"seconds_to_{t}": time_to(epochs, t, workload) for t in workload.targets}}


def local_warmup(method, default, said=(), steps=0):
    """The synchronous steps a local-SGD method starts with (0 for the others); with
    `warmup_steps: auto`, the step the chief `said` local steps began at (`steps`, the
    whole run, if they never did)."""
    local = (METHODS[method] or {}).get("local_sgd")
    warmup = 0 if local is None else local.get("warmup_steps", default)
    if warmup != "auto":
        return warmup
    began = [re.search(r"warmup_steps auto at step (\d+): .*local steps begin", line)
             for line in said]
    return next((int(m.group(1)) for m in began if m), steps)


def summary(rows, workload=UNET):
    """One row per (method, link): medians over seeds, and how many seeds reached each
    target (a median over seeds that did not all reach it is not given)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["method"], r["rate_bits"]), []).append(r)
    out = []
    for (method, rate), runs in groups.items():
        finals = [r[workload.final_key] for r in runs]
        row = {"method": method, "rate_bits": rate, "seeds": len(runs),
               workload.final_key: statistics.mean(finals),
               f"{workload.final_key}_spread": max(finals) - min(finals),
               "final_loss": statistics.mean(r["final_loss"] for r in runs),
               "seconds_per_step": statistics.median(r["seconds_per_step"] for r in runs),
               "bytes_per_step": statistics.median(r["bytes_per_step"] or 0 for r in runs),
               "timing_disturbed": any(r.get("timing_disturbed") for r in runs)}
        for t in workload.targets:
            times = [r[f"seconds_to_{t}"] for r in runs]
            reached = [s for s in times if s is not None]
            row[f"reached_{t}"] = len(reached)
            row[f"seconds_to_{t}"] = statistics.median(reached) if len(reached) == len(runs) else None
        out.append(row)
    return out


def quality(rows, workload=UNET):
    """{method: (mean final metric, spread, mean final loss, seeds)}: per seed the mean
    over its links (the link changes the time, not the arithmetic, except for auto, whose
    choice follows the link), then the mean over seeds, so each seed weighs the same."""
    per_seed = {}
    for r in rows:
        per_seed.setdefault(r["method"], {}).setdefault(r["seed"], []).append(r)
    out = {}
    for method, seeds in per_seed.items():
        ious = [statistics.mean(r[workload.final_key] for r in rs) for rs in seeds.values()]
        losses = [statistics.mean(r["final_loss"] for r in rs) for rs in seeds.values()]
        out[method] = (statistics.mean(ious), max(ious) - min(ious), statistics.mean(losses),
                       len(seeds))
    return out


def paired(rows, key):
    """{method: (its mean `key`, none's mean `key`)} over the seeds both ran (each seed's
    value the mean over its links), so that a seed only one of them ran weighs on neither."""
    values = {}
    for r in rows:
        values.setdefault(r["method"], {}).setdefault(r["seed"], []).append(r[key])
    none = {seed: statistics.mean(v) for seed, v in values.pop("none", {}).items()}
    out = {}
    for method, seeds in values.items():
        common = sorted(set(seeds) & set(none))
        if common:
            out[method] = (statistics.mean(statistics.mean(seeds[s]) for s in common),
                           statistics.mean(none[s] for s in common))
    return out


def loss_gaps(rows):
    """{method: final loss / none's - 1}, on the seeds both ran (`paired`)."""
    return {m: mine / none - 1 for m, (mine, none) in paired(rows, "final_loss").items()}


def against_none(rows, workload=UNET):
    """{method: (times fewer bytes per step than none, final loss / none's - 1)}: the bytes
    are each method's median over its links (the kB/step column), the loss `loss_gaps`'."""
    cell = {}
    for r in summary(rows, workload):
        cell.setdefault(r["method"], []).append(r["bytes_per_step"])
    gaps = loss_gaps(rows)
    if "none" not in cell:
        return {}
    bytes0 = statistics.median(cell["none"])
    return {m: (bytes0 / statistics.median(b) if statistics.median(b) else float("inf"),
                gaps[m]) for m, b in cell.items() if m in gaps}


def markdown(results):
    """One row per method: quality at convergence (every run), then per link the median
    training seconds to each target and the seconds per step."""
    workload = workload_of(results)
    rows = summary(results["runs"], workload)
    rates = sorted({r["rate_bits"] for r in rows}, reverse=True)
    cell = {(r["method"], r["rate_bits"]): r for r in rows}
    scores = quality(results["runs"], workload)
    methods = sorted(scores, key=lambda m: (m != "none", ALL_METHODS.index(m)
                                            if m in ALL_METHODS else len(ALL_METHODS), m))
    label = "mIoU" if workload is UNET else workload.label
    header = ["method", f"final {label} (spread, seeds)", "vs none (same seeds)",
              "loss vs none (same seeds)", "kB/step"]
    first, second = workload.targets
    for rate in rates:
        header += [f"{rate / MBIT:.0f} Mbit/s: s to {first}", f"s to {second}", "s/step"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    gaps, final = loss_gaps(results["runs"]), paired(results["runs"], workload.final_key)
    for m in methods:
        iou, spread, _, n = scores[m]
        kb = statistics.median(cell[m, r]["bytes_per_step"] for r in rates if (m, r) in cell)
        cells = [m, f"{iou:.3f} ({spread:.3f}, {n})",
                 workload.versus(*final[m]) if m in final else "",
                 f"{gaps[m]:+.0%}" if m in gaps else "",
                 f"{kb / 1e3:.0f}"]
        for rate in rates:
            r = cell.get((m, rate))
            if r is None:
                cells += ["not run", "", ""]
                continue
            mark = " *" if r["timing_disturbed"] else ""
            for t in workload.targets:
                s = r[f"seconds_to_{t}"]
                cells.append(f"{s:.0f}{mark}" if s is not None
                             else f"{r[f'reached_{t}']}/{r['seeds']} seeds")
            cells.append(f"{r['seconds_per_step']:.3f}{mark}")
        lines.append("| " + " | ".join(cells) + " |")
    if any(r["timing_disturbed"] for r in rows):
        lines += ["", "\\* timed while another benchmark shared the 2 cores: the quality "
                  "stands (the arithmetic does not depend on timing), the times are upper bounds."]
    diloco = diloco_markdown(results["runs"]) if workload is UNET else []
    return "\n".join(lines + diloco) + "\n"


DILOCO = ("local SGD 32, warm-up 80", "DiLoCo 32", "Streaming DiLoCo 32")
FAST, SLOW = 1000 * MBIT, 20 * MBIT


def diloco_criteria(runs):
    """Issue 17's targets from the runs: {name: (measured text, met)}; empty without
    DiLoCo runs. Medians over seeds per link; quality as in `quality`, against none on
    the same seeds (`paired`)."""
    have = {(r["method"], r["rate_bits"]) for r in runs}
    if ("DiLoCo 32", FAST) not in have or ("none", FAST) not in have:
        return {}
    med = lambda m, rate, key: statistics.median(  # noqa: E731
        r[key] for r in runs if (r["method"], r["rate_bits"]) == (m, rate)
        and r.get(key) is not None)
    scores = quality(runs)
    out = {}
    d_iou, none_iou = paired(runs, UNET.final_key)["DiLoCo 32"]
    out["DiLoCo 32: final mean IoU within 1 point of synchronous"] = (
        f"{100 * (d_iou - none_iou):+.1f} pts", d_iou - none_iou >= -0.01)
    if "local SGD 32, warm-up 80" in scores:
        gain = d_iou - scores["local SGD 32, warm-up 80"][0]
        out["DiLoCo 32: at least 2 points above plain local SGD 32"] = (
            f"{100 * gain:+.1f} pts", gain >= 0.02)
    synchronous = med("none", FAST, "bytes_per_step")
    everything = synchronous / med("DiLoCo 32", FAST, "local_bytes_per_step")
    if all(r.get("training_bytes_per_step") for r in runs
           if (r["method"], r["rate_bits"]) == ("DiLoCo 32", FAST)):
        fewer = synchronous / med("DiLoCo 32", FAST, "training_bytes_per_step")
        out["DiLoCo 32: >= 30x fewer bytes per training step than synchronous (after the "
            "warm-up)"] = (f"{fewer:.0f}x ({everything:.0f}x counting the averages "
                           "validation forces)", fewer >= 30)
    else:
        out["DiLoCo 32: >= 30x fewer bytes per step than synchronous (after the warm-up)"] = (
            f"{everything:.0f}x", everything >= 30)
    if ("Streaming DiLoCo 32", FAST) in have:
        peak = (med("Streaming DiLoCo 32", FAST, "peak_bytes_per_step")
                / med("DiLoCo 32", FAST, "peak_bytes_per_step"))
        out["Streaming (4 fragments): peak bytes of a step <= 1/4 of DiLoCo's"] = (
            f"{peak:.3f}", peak <= 0.25)
    if ("Streaming DiLoCo 32", SLOW) in have:
        step = ("local_seconds_per_step" if all(  # after the warm-up, where recorded
            r.get("local_seconds_per_step") for r in runs
            if r["method"] == "Streaming DiLoCo 32") else "seconds_per_step")
        slow = (med("Streaming DiLoCo 32", SLOW, step) / med("Streaming DiLoCo 32", FAST, step))
        out["Streaming: s/step after the warm-up at 20 Mbit/s within 10% of 1 Gbit/s"] = (
            f"{slow - 1:+.0%}", slow <= 1.10)
        compressors = [m for m, rate in have if rate == SLOW and m != "none"
                       and not m.startswith(("local SGD", "DiLoCo", "Streaming"))]
        best = min(compressors, key=lambda m: med(m, SLOW, "seconds_to_0.85") or 1e9)
        for streaming in sorted(m for m, rate in have
                                if rate == SLOW and m.startswith("Streaming DiLoCo 32")):
            times = {m: med(m, SLOW, "seconds_to_0.85") for m in (streaming, "none", best)}
            out[f"{streaming}: s to 0.85 at 20 Mbit/s against none and the best compressor "
                f"({best})"] = (", ".join(f"{m} {t:.0f}" for m, t in times.items()),
                                times[streaming] < min(times["none"], times[best]))
    return out


def diloco_markdown(runs):
    """The DiLoCo section of the report: the methods' bytes and issue 17's targets."""
    criteria = diloco_criteria(runs)
    if not criteria:
        return []
    lines = ["", "### DiLoCo (issue 17)", "",
             "Period 32 after 80 synchronous steps, 2 seeds; bytes received by one worker "
             "per step after the warm-up at 1 Gbit/s (medians over seeds): in training steps, "
             "in all steps (with the validation after each epoch of 40 steps, and the model "
             "average it needs when the replicas differ), and in the busiest step.", "",
             "| method | kB per training step | kB per step, validation included "
             "| peak kB in a step |", "|---|---|---|---|"]
    kilobytes = lambda mine, key: (  # noqa: E731
        f"{statistics.median(r[key] for r in mine) / 1e3:.1f}"
        if all(r.get(key) for r in mine) else "—")
    for m in ("none", *DILOCO):
        mine = [r for r in runs if (r["method"], r["rate_bits"]) == (m, FAST)]
        if not mine:
            continue
        every = "local_bytes_per_step" if m != "none" else "bytes_per_step"
        lines.append(f"| {m} | {kilobytes(mine, 'training_bytes_per_step')} "
                     f"| {kilobytes(mine, every)} | {kilobytes(mine, 'peak_bytes_per_step')} |")
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {name} | {text} | {'yes' if met else 'no'} |"
              for name, (text, met) in criteria.items()]
    return lines


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workload = workload_of(results)
    rows = summary(results["runs"], workload)
    first = f"seconds_to_{workload.target}"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in dict.fromkeys(r["method"] for r in rows):
        points = sorted((r["rate_bits"] / MBIT, r[first]) for r in rows
                        if r["method"] == method and r[first] is not None)
        if points:
            ax.plot(*zip(*points), marker="o", label=method)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link speed, Mbit/s (2 hosts, tc tbf)")
    ax.set_ylabel(f"training seconds to validation {workload.label} {workload.target}")
    ax.set_title("Time to accuracy against link speed (median of seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def measure(plan, workdir, methods=None, partial=None, done=(), again=False):
    """Every (link, method, seed) run of `plan` not in `done` (runs of an earlier call);
    saved to `partial` as they come. Seed by seed, so that a run cut short still holds
    every method on every link. A run of `done` marked `timing_disturbed` (timed while
    something else shared the CPU), or of `methods` if `again`, is run again and
    replaced."""
    results = {"plan": {k: v for k, v in plan.items() if k != "methods"}, "runs": list(done),
               "workload": plan.get("workload", "unet")}
    workload = workload_of(results)
    key = lambda r: (r["method"], r["rate_bits"], r["seed"])  # noqa: E731
    finished = {key(r) for r in done if not r.get("timing_disturbed")
                and not (again and r["method"] in (methods or ()))}
    for seed in plan["seeds"]:
        for rate in plan["rates"]:
            for method in methods or plan["methods"]:
                if (method, rate, seed) in finished:
                    continue
                r = run_one(method, rate, seed, plan, workdir)
                results["runs"] = [o for o in results["runs"] if key(o) != key(r)] + [r]
                print(f"{rate / MBIT:6.0f} Mbit/s {method:14s} seed {seed}: "
                      f"{r['seconds_per_step']:.3f} s/step, to {workload.target}: "
                      f"{r[f'seconds_to_{workload.target}']}, final {workload.label} "
                      f"{r[workload.final_key]:.3f}", flush=True)
                if partial:
                    partial.write_text(json.dumps(results))
    return results


def stem(workload="unet"):
    """The results' file name, without suffix, of `workload`'s runs."""
    return "time_to_accuracy" + ("" if workload == "unet" else f"_{workload}")


def saved(workload="unet"):
    """The last full run's results (time_to_accuracy.json, else the partial file of a run
    cut short, marked `partial`), or None."""
    for name, partial in ((f"{stem(workload)}.json", False),
                          (f"{stem(workload)}-partial.json", True)):
        if (RESULTS / name).exists():
            return {**json.loads((RESULTS / name).read_text()), "partial": partial}
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one link, two methods, one seed")
    parser.add_argument("--methods", nargs="+", help="a subset of the plan's methods")
    parser.add_argument("--rates", nargs="+", type=int, help="link speeds in Mbit/s")
    parser.add_argument("--seeds", nargs="+", type=int, help="a subset of the plan's seeds")
    parser.add_argument("--resume", action="store_true", help="keep the runs already saved")
    parser.add_argument("--again", action="store_true",
                        help="with --resume: run --methods again (after a change to them), "
                             "keeping every other run")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="unet",
                        help="the UNet (every link) or the language model (100 Mbit/s)")
    parser.add_argument("--from-results", action="store_true",
                        help="only rewrite the .md and .png from the saved .json")
    args = parser.parse_args()
    if args.again and not (args.resume and args.methods):
        parser.error("--again runs --methods again among the saved runs: give --resume and "
                     "--methods")
    if args.from_results:
        return write_report(json.loads((RESULTS / f"{stem(args.workload)}.json").read_text()))
    mode = "lm" if args.workload == "lm" else "quick" if args.quick else "full"
    plan = dict(PLANS[mode], **{k: v for k, v in (
        ("rates", args.rates and tuple(r * MBIT for r in args.rates)),
        ("seeds", args.seeds and tuple(args.seeds))) if v})
    workdir, started = tempfile.mkdtemp(prefix="tfdist-tta-"), time.monotonic()
    RESULTS.mkdir(parents=True, exist_ok=True)
    partial = RESULTS / f"{stem(args.workload)}-partial.json"
    done = (saved(args.workload) or {"runs": []})["runs"] if args.resume else []
    try:
        results = measure(plan, workdir, args.methods, partial, done, args.again)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["mode"], results["minutes"] = mode, round((time.monotonic() - started) / 60, 1)
    (RESULTS / f"{stem(args.workload)}.json").write_text(json.dumps(results, indent=1))
    partial.unlink(missing_ok=True)
    write_report(results)


def write_report(results):
    """time_to_accuracy[_lm].md and .png from `results`; prints the table."""
    write_files(stem(results.get("workload", "unet")), results, markdown, plot)


def write_files(name, results, markdown, plot):
    """results/`name`.md (`markdown(results)`) and .png (`plot(results, path)`) of a
    benchmark's results; prints the markdown."""
    text = markdown(results)
    (RESULTS / f"{name}.md").write_text(text)
    plot(results, RESULTS / f"{name}.png")
    print(text)


if __name__ == "__main__":
    main()
