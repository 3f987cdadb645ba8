"""The application's `train:` section of the config file, validated like tfdist's own."""

import dataclasses
import functools

from common.settings import TRAIN_CHECKS, checked_section, positive, source_of
from tfdist.config import checks

DATASETS = ("synthetic", "oxford_pet", "folder")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of the UNet example (`train:` section).

    `batch_size` is the global batch, split across all replicas of all workers;
    `loop` is "fit" (Keras `model.fit`) or "ctl" (`tfdist.Trainer`); `policy` is the
    Keras dtype policy (mixed_float16 adds dynamic loss scaling; the logits stay float32);
    `backup_dir` (shared by every worker) turns on `tfdist.callbacks.BackupAndRestore`: a
    SIGTERM to any task saves every worker after one agreed step and exits 143, and the
    relaunched job resumes there.
    """

    image_size: int = 32
    batch_size: int = 32
    epochs: int = 6
    steps_per_epoch: int = 80
    validation_steps: int = 8
    learning_rate: float = 0.003
    seed: int = 0
    loop: str = "fit"
    dataset: str = "synthetic"
    data_dir: str | None = None
    num_classes: int | None = None
    num_examples: int = 4096
    base_filters: int = 16
    depth: int = 3
    dropout: float = 0.1
    policy: str = "float32"
    backup_dir: str | None = None


#: The UNet's own `train:` keys beside the shared ones.
UNET_CHECKS = {
    "image_size": functools.partial(checks.integer, minimum=8),
    "dataset": functools.partial(checks.string, choices=DATASETS),
    "data_dir": checks.path,
    "num_classes": functools.partial(checks.integer, minimum=2),
    "num_examples": positive,
    "base_filters": positive,
    "depth": positive,
    "dropout": functools.partial(checks.number, minimum=0, maximum=0.9),
}
_CHECKS = {**TRAIN_CHECKS, **UNET_CHECKS}


def train_config(config, overrides=None):
    """Validates `config.section("train")` updated with `overrides` (e.g. from flags).

    Raises:
        ConfigError: naming the file, line and key, as for tfdist's own sections.
    """
    source = source_of(config)
    train = TrainConfig(**checked_section(source, "train", dict(config.section("train") or {}),
                                          _CHECKS, overrides))
    if train.dataset != "synthetic" and not train.data_dir:
        raise source.error(("train", "dataset"), f"dataset: {train.dataset} needs train.data_dir")
    if train.dataset == "folder" and not train.num_classes:
        raise source.error(("train", "dataset"), "dataset: folder needs train.num_classes")
    if train.image_size % 2 ** train.depth:
        raise source.error(("train", "image_size"), f"must be divisible by 2**depth="
                           f"{2 ** train.depth}. Received: image_size={train.image_size}")
    return train
