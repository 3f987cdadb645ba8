"""What the chief writes: metrics.json, a prediction grid, training curves and each
worker's step-time breakdown (PNG)."""

import json
import os
import re

import numpy as np
import tensorflow as tf

PALETTE = np.array([[20, 20, 20], [230, 80, 60], [60, 170, 230], [250, 210, 60],
                    [120, 220, 120], [200, 120, 230]], dtype=np.uint8)


def colour_mask(mask):
    return PALETTE[np.asarray(mask) % len(PALETTE)]


def prediction_grid(images, masks, predictions, path):
    """Rows of input | true mask | predicted mask, written as a PNG."""
    rows = [np.concatenate([(np.clip(img, 0, 1) * 255).astype(np.uint8), colour_mask(true),
                            colour_mask(pred)], axis=1)
            for img, true, pred in zip(images, masks, predictions)]
    grid = np.concatenate(rows, axis=0)
    scale = max(1, 384 // grid.shape[1])  # small images are enlarged to be seen
    grid = np.kron(grid, np.ones((scale, scale, 1), np.uint8))
    tf.io.write_file(path, tf.io.encode_png(grid))


def training_curves(history, path):
    """Loss, pixel accuracy and mean IoU per epoch (training and validation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ("loss", "pixel_accuracy", "mean_iou")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    epochs = np.arange(1, len(history["loss"]) + 1)
    for ax, name in zip(axes, names):
        ax.plot(epochs, history[name], marker="o", label="train")
        if f"val_{name}" in history:
            ax.plot(epochs, history[f"val_{name}"], marker="o", label="validation")
        ax.set_title(name.replace("_", " "))
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: The parts of a step in tfdist.callbacks.StepTimes' logs, stacked in this order.
PARTS = ("compute", "exchange", "wait")


def step_times(history):
    """Each worker's seconds per step computing, in the exchange and waiting, in the last
    epoch that measured them (tfdist.callbacks.StepTimes' logs), and the straggler:
    {"workers": [index], "compute_s": [...], "exchange_s": [...], "wait_s": [...],
    "straggler": index, "straggler_wait_share": fraction}; None when not measured (one
    machine, parameter servers, only local SGD steps)."""
    workers = sorted(int(m.group(1)) for m in map(
        re.compile(r"worker_(\d+)/step_compute_s$").match, history) if m)
    if not workers or "straggler" not in history:
        return None
    return {"workers": workers,
            **{f"{part}_s": [float(history[f"worker_{i}/step_{part}_s"][-1]) for i in workers]
               for part in PARTS},
            "straggler": int(history["straggler"][-1]),
            "straggler_wait_share": float(history["straggler_wait_share"][-1])}


def step_times_figure(times):
    """A stacked bar per worker of `step_times`' figures, the straggler marked; returns the
    matplotlib Figure (its axes' containers are the three parts' bars, in `PARTS` order)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.6 * len(times["workers"]) + 4, 3.5))
    ax = fig.add_subplot()
    x, bottom = np.arange(len(times["workers"])), np.zeros(len(times["workers"]))
    for part in PARTS:
        ax.bar(x, times[f"{part}_s"], bottom=bottom, label=part, width=0.6)
        bottom = bottom + times[f"{part}_s"]
    slow = times["workers"].index(times["straggler"])
    ax.annotate(f"straggler\nothers wait {times['straggler_wait_share']:.0%}",
                (x[slow], bottom[slow]), xytext=(0, 4), textcoords="offset points",
                ha="center", va="bottom", color="firebrick")
    ax.set_xticks(x, [f"worker {i}" for i in times["workers"]])
    ax.set_ylim(0, 1.3 * max(bottom.max(), 1e-9))
    ax.set_ylabel("seconds per step")
    ax.set_title("step time per worker, last epoch")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")  # off the bars
    fig.tight_layout()
    return fig


def step_times_chart(history, path):
    """Writes `step_times_figure` of `history` to `path`; False (nothing written) when the
    history has no step times."""
    times = step_times(history)
    if times is not None:
        step_times_figure(times).savefig(path, dpi=100)
    return times is not None


def write_metrics(history, extra, path):
    """Final and per-epoch values, plus run facts (`extra`), as JSON."""
    final = {k: v[-1] for k, v in history.items()}
    with open(path, "w") as f:
        json.dump({"final": final, "per_epoch": history, **extra}, f, indent=2)


#: Said once, before any training, when the curves cannot be drawn.
NO_PLOTS = ("matplotlib is not installed: curves.png and step_times.png will not be written "
            "(pip install 'tfdist[plots]' to draw them); metrics.json and predictions.png will")


def can_plot():
    """Whether matplotlib is importable (the `plots` extra)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def write_all(output_dir, model, validation, history, extra):
    """Writes the outputs (the curves and step times only if matplotlib is there, the step
    times only if measured); returns their paths."""
    os.makedirs(output_dir, exist_ok=True)
    images, masks = validation
    predictions = np.argmax(model(images, training=False), axis=-1)
    paths = {name: os.path.join(output_dir, name)
             for name in ("metrics.json", "predictions.png", "curves.png", "step_times.png")}
    write_metrics(history, {**extra, "step_times": step_times(history)}, paths["metrics.json"])
    prediction_grid(images, masks, predictions, paths["predictions.png"])
    if can_plot():
        training_curves(history, paths["curves.png"])
    if not (can_plot() and step_times_chart(history, paths["step_times.png"])):
        del paths["step_times.png"]
    if not can_plot():
        del paths["curves.png"]
    return paths
