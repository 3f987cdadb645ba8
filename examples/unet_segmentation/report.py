"""What the chief writes: metrics.json, a prediction grid and training curves (PNG)."""

import json
import os

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


def write_metrics(history, extra, path):
    """Final and per-epoch values, plus run facts (`extra`), as JSON."""
    final = {k: v[-1] for k, v in history.items()}
    with open(path, "w") as f:
        json.dump({"final": final, "per_epoch": history, **extra}, f, indent=2)


#: Said once, before any training, when the curves cannot be drawn.
NO_PLOTS = ("matplotlib is not installed: curves.png will not be written (pip install "
            "'tfdist[plots]' to draw it); metrics.json and predictions.png will")


def can_plot():
    """Whether matplotlib is importable (the `plots` extra)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def write_all(output_dir, model, validation, history, extra):
    """Writes the three outputs (the curves only if matplotlib is there); returns their
    paths."""
    os.makedirs(output_dir, exist_ok=True)
    images, masks = validation
    predictions = np.argmax(model(images, training=False), axis=-1)
    paths = {name: os.path.join(output_dir, name)
             for name in ("metrics.json", "predictions.png", "curves.png")}
    write_metrics(history, extra, paths["metrics.json"])
    prediction_grid(images, masks, predictions, paths["predictions.png"])
    if can_plot():
        training_curves(history, paths["curves.png"])
    else:
        del paths["curves.png"]
    return paths
