"""Compression from a name, a config section or an object."""

from tfdist.compression.auto import AutoCompression
from tfdist.compression.compressors import compressor_by_name
from tfdist.compression.exchange import GradientCompression
from tfdist.config import checks
from tfdist.config.errors import ConfigError
from tfdist.config.checks import check_arguments
from tfdist.config.load import compression_from_dict
from tfdist.config.yaml_source import Source
from tfdist.config.schema import CompressionConfig


def build(compression="none", **options):
    """A `GradientCompression` hook from a name, a `CompressionConfig`, a config section
    (dict) or a hook (returned as is); "auto" gives an `AutoCompression` hook, which
    measures the link and the step and chooses (`tfdist.compression.auto`).

    Options override the config: ratio, rank, levels, block_size, error_feedback (true,
    false or "ef21"), start_step, min_size, bucket_bytes, seed, freeze_variance (1-bit
    Adam: Adam's second moment frozen from start_step on), and the corrections
    momentum_correction, local_clip_norm, ratio_warmup_steps, ratio_warmup_start
    (`tfdist.compression.corrections`). Unknown names and out-of-range values raise
    `ConfigError`.

    Examples:
        >>> hook = tfdist.compression.build("topk", ratio=0.01, error_feedback=True)
        >>> hook.compressor
        TopK()
        >>> tfdist.compression.build({"name": "powersgd", "rank": 0})
        Traceback (most recent call last):
        tfdist.config.errors.ConfigError: compression.build(): rank: expected a value >= 1. Received: rank=0
    """
    if isinstance(compression, (GradientCompression, AutoCompression)):
        return compression
    seed = options.pop("seed", 0)
    section = _as_dict(compression, options)  # a CompressionConfig too: it may be hand-made
    seed = section.pop("seed", seed)  # a saved hook's config (`get_config`) has one
    spec = compression_from_dict(section, source=Source.of_call("compression.build"))
    seed = check_arguments("compression.build", {"seed": checks.integer}, seed=seed)["seed"]
    if spec.name == "auto":
        return AutoCompression(seed=seed)
    compressor = compressor_by_name(spec.name, ratio=spec.ratio, rank=spec.rank,
                                    levels=spec.levels, block_size=spec.block_size,
                                    error_feedback=spec.error_feedback)
    corrections = {k: getattr(spec, k) for k in ("momentum_correction", "local_clip_norm",
                                                 "ratio_warmup_steps", "ratio_warmup_start")
                   if getattr(spec, k) is not None}
    return GradientCompression(compressor, error_feedback=spec.error_feedback,
                               start_step=spec.start_step, min_size=spec.min_size, seed=seed,
                               bucket_bytes=spec.bucket_bytes,
                               freeze_variance=spec.freeze_variance, **corrections)


def _as_dict(compression, options):
    """A compression section (dict) from a name, a config or a section, with `options`."""
    if isinstance(compression, CompressionConfig):
        compression = {k: v for k, v in vars(compression).items() if v is not None}
    if isinstance(compression, str):
        compression = {"name": compression}
    if not isinstance(compression, dict):
        raise ConfigError("expected a compression name, a mapping, a CompressionConfig or a "
                          f"compression hook. Received: {checks.shown(compression)}",
                          file="compression.build()")
    return {**compression, **options}
