"""Whole-run bytes of the shipped DiLoCo configs against synchronous training.

Each run is a config of configs/ as a user runs it (`tfdist launch config -- python
examples/unet_segmentation/train.py --config config`: 2 local workers, 6 epochs of 80
steps, validation after each) inside a private network namespace, so the loopback
counters hold every byte the job moved: start-up, the synchronous warm-up, local steps,
synchronisations, validation. Beside the shipped file, each DiLoCo config runs with each
warm-up exchange of `WARMUPS` (its `local_sgd.warmup_compression`), so the shipped choice
is the one measured best: the fewest bytes at a final mean IoU within 1.5 points of
synchronous training's.

    sudo python benchmarks/shipped_configs.py [--seeds 0 1] [--warmups none topk+EF]

Writes benchmarks/results/shipped_configs.{json,md,png}. Needs root (`unshare -n`).
"""

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

import yaml

from measure.methods import ONE_CORE
from measure.netns import ROOT, TRAIN, run_in_namespace

RESULTS = ROOT / "benchmarks" / "results"
CONFIGS = ROOT / "configs"
SYNCHRONOUS = "unet_multi_worker_mirrored.yaml"
DILOCO = ("unet_diloco.yaml", "unet_streaming_diloco.yaml")
EF = {"error_feedback": True, "min_size": 0}
#: The warm-up's gradient exchange each DiLoCo config is measured with (None: uncompressed).
WARMUPS = {
    "none": None,
    "topk+EF": {"name": "topk", "ratio": 0.01, **EF},
    "sign+EF": {"name": "sign", **EF},
}
TARGET_FEWER = 20  # x fewer whole-run bytes than synchronous (issue 33)
TARGET_POINTS = 1.5  # final mean IoU within this many points of synchronous


def shipped_warmup(name):
    """The WARMUPS key of config `name`'s warm-up exchange as shipped ("none" for
    synchronous training, "other" when it is none of them)."""
    section = (yaml.safe_load((CONFIGS / name).read_text()).get("local_sgd") or {}).get(
        "warmup_compression")
    return next((k for k, v in WARMUPS.items() if v == section), "other")


def variant(name, warmup, workdir):
    """The path of config `name` with the warm-up exchange `warmup` (a WARMUPS key): the
    shipped file itself when that is its own."""
    if warmup == shipped_warmup(name):
        return CONFIGS / name
    sections = yaml.safe_load((CONFIGS / name).read_text())
    sections["local_sgd"].pop("warmup_compression", None)
    if WARMUPS[warmup] is not None:
        sections["local_sgd"]["warmup_compression"] = WARMUPS[warmup]
    path = workdir / f"{name.removesuffix('.yaml')}-warmup-{warmup.replace('+', '')}.yaml"
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


def run(name, warmup, seed, workdir):
    """One whole run of config `name` with warm-up exchange `warmup`."""
    config = variant(name, warmup, workdir)
    out = workdir / f"out-{config.stem}-{seed}"
    command = [*ONE_CORE, sys.executable, str(TRAIN), "--config", str(config),
               "--output_dir", str(out), "--seed", str(seed)]
    moved, metrics = run_in_namespace(config, command, out, workdir)
    return {"config": name, "warmup": warmup, "seed": seed, "bytes": moved,
            "final_val_mean_iou": metrics["epochs"][-1]["val_mean_iou"],
            "final_loss": metrics["epochs"][-1]["loss"], "steps": metrics["steps"],
            "train_seconds": metrics["epochs"][-1]["train_seconds"]}


def summary(rows):
    """One row per (config, warm-up): mean bytes and final mean IoU over seeds, the bytes
    against synchronous training's, and whether both targets hold."""
    groups = {}
    for r in rows:
        groups.setdefault((r["config"], r["warmup"]), []).append(r)
    mean = lambda runs, key: statistics.mean(r[key] for r in runs)  # noqa: E731
    sync = groups.get((SYNCHRONOUS, "none"))
    out = []
    for (config, warmup), runs in groups.items():
        row = {"config": config, "warmup": warmup, "seeds": len(runs),
               "megabytes": mean(runs, "bytes") / 1e6,
               "final_val_mean_iou": mean(runs, "final_val_mean_iou"),
               "final_loss": mean(runs, "final_loss")}
        if sync:
            row["fewer"] = mean(sync, "bytes") / mean(runs, "bytes")
            row["points"] = 100 * (row["final_val_mean_iou"] - mean(sync, "final_val_mean_iou"))
            row["met"] = row["fewer"] >= TARGET_FEWER and row["points"] >= -TARGET_POINTS
        out.append(row)
    return out


def best(rows, config):
    """The warm-up exchange of `config` with the fewest bytes among those meeting the
    quality target (None when none does)."""
    measured = [r for r in summary(rows) if r["config"] == config
                and r.get("points", -99) >= -TARGET_POINTS]
    return min(measured, key=lambda r: r["megabytes"])["warmup"] if measured else None


def markdown(rows):
    lines = ["| config | warm-up exchange | seeds | whole-run MB | fewer than synchronous "
             "| final mean IoU | vs synchronous | final loss |", "|---|---|---|---|---|---|---|---|"]
    for r in summary(rows):
        lines.append(f"| {r['config']} | {r['warmup']} | {r['seeds']} | {r['megabytes']:.0f} "
                     f"| {r.get('fewer', 0):.1f}x | {r['final_val_mean_iou']:.3f} "
                     f"| {r.get('points', 0):+.1f} pts | {r['final_loss']:.4f} |")
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for r in summary(rows):
        if r["config"] in DILOCO and r["warmup"] == shipped_warmup(r["config"]) and "fewer" in r:
            lines.append(f"| {r['config']} as shipped ({r['warmup']} warm-up): whole-run bytes >= {TARGET_FEWER}x fewer "
                         f"than synchronous, final mean IoU within {TARGET_POINTS} points "
                         f"| {r['fewer']:.1f}x, {r['points']:+.1f} pts "
                         f"| {'yes' if r['met'] else '**MISSED**'} |")
    for config in DILOCO:
        choice = best(rows, config)
        if choice is not None:
            lines.append(f"| {config}: the best warm-up exchange measured | {choice} | |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in summary(rows):
        ax.scatter(r["megabytes"], r["final_val_mean_iou"])
        ax.annotate(f"{r['config'].removeprefix('unet_').removesuffix('.yaml')}, {r['warmup']}",
                    (r["megabytes"], r["final_val_mean_iou"]), fontsize=7)
    ax.set_xscale("log")
    ax.set(xlabel="whole-run bytes on loopback, MB (2 workers)",
           ylabel="final validation mean IoU", title="Shipped configs: bytes and quality")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--warmups", nargs="+", choices=list(WARMUPS), default=list(WARMUPS))
    parser.add_argument("--report-only", action="store_true", help="rewrite .md and .png only")
    args = parser.parse_args()
    path = RESULTS / "shipped_configs.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    done = {(r["config"], r["warmup"], r["seed"]) for r in rows}
    plan = [(SYNCHRONOUS, "none")] + [(c, shipped_warmup(c)) for c in DILOCO]
    plan += [(c, w) for c in DILOCO for w in args.warmups if w != shipped_warmup(c)]
    with tempfile.TemporaryDirectory() as workdir:
        for seed in [] if args.report_only else args.seeds:
            for config, warmup in plan:
                if (config, warmup, seed) in done:
                    continue
                row = run(config, warmup, seed, pathlib.Path(workdir))
                print(f"{config} (warm-up {row['warmup']}) seed {seed}: "
                      f"{row['bytes'] / 1e6:.0f} MB, final mean IoU "
                      f"{row['final_val_mean_iou']:.3f}", flush=True)
                rows.append(row)
                path.write_text(json.dumps(rows, indent=1))
    text = markdown(rows)
    (RESULTS / "shipped_configs.md").write_text(
        "# Whole-run bytes of the shipped DiLoCo configs (benchmarks/shipped_configs.py)\n\n"
        + text)
    plot(rows, RESULTS / "shipped_configs.png")
    print(text)


if __name__ == "__main__":
    main()
