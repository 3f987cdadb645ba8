"""The application's `train:` section of the config file, validated like tfdist's own."""

import dataclasses
import functools

from tfdist.config import checks
from tfdist.config.yaml_source import Source

LOOPS = ("fit", "ctl")
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
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


_positive = functools.partial(checks.integer, minimum=1)
_CHECKS = {
    "image_size": functools.partial(checks.integer, minimum=8),
    "batch_size": _positive,
    "epochs": _positive,
    "steps_per_epoch": _positive,
    "validation_steps": _positive,
    "learning_rate": functools.partial(checks.number, minimum=0, open_minimum=True),
    "seed": functools.partial(checks.integer, minimum=0),
    "loop": functools.partial(checks.string, choices=LOOPS),
    "dataset": functools.partial(checks.string, choices=DATASETS),
    "data_dir": checks.path,
    "num_classes": functools.partial(checks.integer, minimum=2),
    "num_examples": _positive,
    "base_filters": _positive,
    "depth": _positive,
    "dropout": functools.partial(checks.number, minimum=0, maximum=0.9),
    "policy": functools.partial(checks.string, choices=POLICIES),
    "backup_dir": checks.path,
}


def train_config(config, overrides=None):
    """Validates `config.section("train")` updated with `overrides` (e.g. from flags).

    Raises:
        ConfigError: naming the file, line and key, as for tfdist's own sections.
    """
    source = config.source or Source(config.path or "<config>", {}, {})
    section = dict(config.section("train") or {})
    checks.mapping(source, ("train",), section, tuple(_CHECKS))
    section.update({k: v for k, v in (overrides or {}).items() if v is not None})
    values = {k: _CHECKS[k](source, ("train", k), v) for k, v in section.items()}
    train = TrainConfig(**values)
    if train.dataset != "synthetic" and not train.data_dir:
        raise source.error(("train", "dataset"), f"dataset: {train.dataset} needs train.data_dir")
    if train.dataset == "folder" and not train.num_classes:
        raise source.error(("train", "dataset"), "dataset: folder needs train.num_classes")
    if train.image_size % 2 ** train.depth:
        raise source.error(("train", "image_size"), f"must be divisible by 2**depth="
                           f"{2 ** train.depth}. Received: image_size={train.image_size}")
    return train
