"""The language model's settings: the `train:` keys it shares with the UNet example (so
that every config in configs/ runs it) and its own `lm:` section."""

import dataclasses
import functools

from common.settings import TRAIN_CHECKS, checked_section, positive, source_of
from tfdist.config import checks

#: `train:` keys of the UNet example that mean nothing here (an image, its dataset).
UNET_ONLY = ("image_size", "dataset", "data_dir", "num_classes", "num_examples",
             "base_filters", "depth", "dropout")


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """`batch_size` is the global batch (of sequences); `loop`, `policy` and `backup_dir`
    as in the UNet example; `sequence_length` bytes per sequence; `width`, `layers` and
    `heads` size the transformer."""

    batch_size: int = 32
    epochs: int = 6
    steps_per_epoch: int = 80
    validation_steps: int = 8
    learning_rate: float = 0.003
    seed: int = 0
    loop: str = "fit"
    policy: str = "float32"
    backup_dir: str | None = None
    sequence_length: int = 64
    width: int = 64
    layers: int = 2
    heads: int = 2
    dropout: float = 0.0


LM_CHECKS = {
    "sequence_length": functools.partial(checks.integer, minimum=2, maximum=4096),
    "width": functools.partial(checks.integer, minimum=2, maximum=4096),
    "layers": functools.partial(checks.integer, minimum=1, maximum=64),
    "heads": positive,
    "dropout": functools.partial(checks.number, minimum=0, maximum=0.9),
}


def lm_config(config, overrides=None):
    """Validates the config's `train:` (shared keys; UNet-only keys ignored) and `lm:`
    sections, updated with `overrides`.

    Raises:
        ConfigError: naming the file, line and key.
    """
    source = source_of(config)
    values = checked_section(source, "train", dict(config.section("train") or {}),
                             TRAIN_CHECKS, overrides, ignored=UNET_ONLY)
    values.update(checked_section(source, "lm", dict(config.section("lm") or {}), LM_CHECKS,
                                  overrides))
    result = LMConfig(**values)
    if result.width % result.heads:
        raise source.error(("lm", "heads"), f"width ({result.width}) must be divisible by "
                           f"heads. Received: heads={result.heads}")
    return result
