"""The language model's settings: the `train:` keys it shares with the UNet example (so
that every config in configs/ runs it) and its own `lm:` section."""

import dataclasses
import functools

from tfdist.config import checks
from tfdist.config.yaml_source import Source

LOOPS = ("fit", "ctl")
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
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


_positive = functools.partial(checks.integer, minimum=1)
TRAIN_CHECKS = {
    "batch_size": _positive, "epochs": _positive, "steps_per_epoch": _positive,
    "validation_steps": _positive,
    "learning_rate": functools.partial(checks.number, minimum=0, open_minimum=True),
    "seed": functools.partial(checks.integer, minimum=0),
    "loop": functools.partial(checks.string, choices=LOOPS),
    "policy": functools.partial(checks.string, choices=POLICIES),
    "backup_dir": checks.path,
}
LM_CHECKS = {
    "sequence_length": functools.partial(checks.integer, minimum=2, maximum=4096),
    "width": functools.partial(checks.integer, minimum=2, maximum=4096),
    "layers": functools.partial(checks.integer, minimum=1, maximum=64),
    "heads": _positive,
    "dropout": functools.partial(checks.number, minimum=0, maximum=0.9),
}


def lm_config(config, overrides=None):
    """Validates the config's `train:` (shared keys; UNet-only keys ignored) and `lm:`
    sections, updated with `overrides`.

    Raises:
        ConfigError: naming the file, line and key.
    """
    source = config.source or Source(config.path or "<config>", {}, {})
    train = dict(config.section("train") or {})
    lm = dict(config.section("lm") or {})
    checks.mapping(source, ("train",), train, (*TRAIN_CHECKS, *UNET_ONLY))
    checks.mapping(source, ("lm",), lm, tuple(LM_CHECKS))
    values = {k: TRAIN_CHECKS[k](source, ("train", k), v) for k, v in train.items()
              if k in TRAIN_CHECKS}
    values.update({k: LM_CHECKS[k](source, ("lm", k), v) for k, v in lm.items()})
    for key, value in (overrides or {}).items():
        if value is not None:
            checks_ = TRAIN_CHECKS if key in TRAIN_CHECKS else LM_CHECKS
            values[key] = checks_[key](source, ("train" if key in TRAIN_CHECKS else "lm", key),
                                       value)
    result = LMConfig(**values)
    if result.width % result.heads:
        raise source.error(("lm", "heads"), f"width ({result.width}) must be divisible by "
                           f"heads. Received: heads={result.heads}")
    return result
