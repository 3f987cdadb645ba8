"""The two training examples the benchmarks time to accuracy: the UNet (mean IoU, higher
is better) and the language model (perplexity, lower is better)."""

import pathlib

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


class Workload:
    """A training example: its script, the validation metric whose `targets` time to
    accuracy is timed to (the first is the headline), and which way is better."""

    def __init__(self, key, name, script, metric, label, targets, lower):
        self.key, self.name, self.script, self.metric = key, name, script, metric
        self.label, self.targets, self.lower = label, tuple(targets), lower

    @property
    def target(self):
        return self.targets[0]

    def reached(self, value, target=None):
        target = self.target if target is None else target
        return value <= target if self.lower else value >= target

    @property
    def final_key(self):
        return f"final_{self.metric}"

    @property
    def by_epoch_key(self):
        return f"{self.metric.removeprefix('val_')}_by_epoch"

    def versus(self, value, reference):
        """`value` against `reference` as the report writes it: points of mean IoU, or
        percent of perplexity."""
        if self.lower:
            return f"{value / reference - 1:+.1%}"
        return f"{100 * (value - reference):+.1f} pts"


WORKLOADS = {
    "unet": Workload("unet", "the UNet", EXAMPLES / "unet_segmentation" / "train.py",
                     "val_mean_iou", "mean IoU", (0.85, 0.90), lower=False),
    "lm": Workload("lm", "the language model", EXAMPLES / "char_lm" / "train.py",
                   "val_perplexity", "perplexity", (11.0, 10.0), lower=True),
}
