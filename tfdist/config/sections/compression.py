"""The compression: section: the gradient compressor, its hyper-parameters and the
exchange's options (also the local_sgd section's compressions)."""

import dataclasses
import functools

from tfdist.config import checks
from tfdist.config.hyperparameters import EF21_COMPRESSORS, HYPERPARAMETERS
from tfdist.config.schema import COMPRESSORS, CompressionConfig

_count = functools.partial(checks.integer, minimum=0)

# Compressor hyper-parameters (tfdist.config.hyperparameters): key -> (compressors
# it applies to, default, check).
COMPRESSOR_PARAMS = {name: (p.compressors, p.default, p.checked)
                     for name, p in HYPERPARAMETERS.items()}
# The exchange's own options (tfdist.compression.exchange.GradientCompression).
EXCHANGE_OPTIONS = {"start_step": _count, "min_size": _count, "bucket_bytes": _count,
                    "freeze_variance": checks.boolean}
COMPRESSION_KEYS = ("name", *COMPRESSOR_PARAMS, "error_feedback", *EXCHANGE_OPTIONS)


def compression(source, path, value):
    if isinstance(value, str):
        value = {"name": value}
    checks.mapping(source, path, value, COMPRESSION_KEYS)
    name = checks.string(source, path + ("name",), value.get("name", "none"),
                         (*COMPRESSORS, "auto"))
    if name == "auto":  # tfdist.compression.auto: measures, then chooses method and options
        defaults = {f.name: f.default for f in dataclasses.fields(CompressionConfig)}
        chosen = [k for k in value if k != "name" and value[k] != defaults.get(k, ...)]
        if chosen:
            raise source.error(path + (chosen[0],), "compression: auto measures the link and "
                               "the step, then chooses the method and its options itself; "
                               f"remove {chosen[0]!r} or name a method")
        return CompressionConfig(name="auto")
    fields = {"name": name}
    for key, (applies_to, default, check) in COMPRESSOR_PARAMS.items():
        if key in value and name not in applies_to:
            raise source.error(path + (key,), f"{key!r} applies only to "
                               f"[{', '.join(applies_to)}], not to name: {name}")
        if name in applies_to:
            fields[key] = check(source, path + (key,), value.get(key, default))
    if name == "none" and value.get("error_feedback"):
        raise source.error(path + ("error_feedback",), "error feedback needs a compressor; "
                           "with name: none there is no compression error to feed back")
    if "error_feedback" in value:
        fields["error_feedback"] = _error_feedback(source, path + ("error_feedback",),
                                                   value["error_feedback"], name)
    _check_corrections(source, path, fields)
    for key, check in EXCHANGE_OPTIONS.items():
        if key in value:
            fields[key] = check(source, path + (key,), value[key])
    if "freeze_variance" in value:
        if fields["freeze_variance"] and not fields.get("start_step"):
            raise source.error(path + ("freeze_variance",), "freeze_variance keeps Adam's "
                               "second moment as it was at start_step (1-bit Adam, Tang et al. "
                               "2021): it needs a warm-up that learns it, start_step > 0. "
                               f"Received: start_step={fields.get('start_step', 0)}")
    return CompressionConfig(**fields)


def _check_corrections(source, path, fields):
    """DGC's corrections (tfdist.compression.corrections) with what each one needs."""
    if fields.get("momentum_correction") and fields.get("error_feedback") is not True:
        raise source.error(path + ("momentum_correction",), "momentum correction accumulates "
                           "the velocity in error feedback's residual (Lin et al. 2018): it "
                           "needs error_feedback: true. Received: error_feedback="
                           f"{fields.get('error_feedback', False)!r}")
    if fields.get("ratio_warmup_steps") and fields["ratio_warmup_start"] <= fields["ratio"]:
        raise source.error(path + ("ratio_warmup_start",), "the ratio warm-up falls from "
                           "ratio_warmup_start to ratio: expected a start above ratio "
                           f"({fields['ratio']!r}). Received: ratio_warmup_start="
                           f"{fields['ratio_warmup_start']!r}")


def _error_feedback(source, path, value, name):
    """true, false, or "ef21" (for the compressors of `EF21_COMPRESSORS`)."""
    if value == "ef21":
        if name not in EF21_COMPRESSORS:
            raise source.error(path, f"ef21 error feedback applies to "
                               f"[{', '.join(EF21_COMPRESSORS)}], not to name: {name}")
        return value
    if isinstance(value, str):
        raise source.error(path, f"expected true, false or 'ef21'. Received: {checks.shown(value)}")
    return checks.boolean(source, path, value)


def named_compression(source, path, value, what, examples):
    """A compression section that names its method (not auto) and starts at once."""
    chosen = compression(source, path, value)
    if chosen.name == "auto":
        raise source.error(path + ("name",), f"auto chooses a gradient compression; name the "
                           f"method of the {what} (e.g. {examples})")
    if chosen.start_step:
        raise source.error(path + ("start_step",), f"the {what} has no delayed start of its "
                           f"own (warmup_steps says when local steps begin). Received: "
                           f"start_step={chosen.start_step}")
    return chosen
