"""The local_sgd: section: local steps between model averages, and their warm-up,
outer optimizer, fragments, overlap, compression and islands."""

import types

from tfdist import limits
from tfdist.config import checks
from tfdist.config.hyperparameters import OUTER_OPTIMIZERS
from tfdist.config.schema import CompressionConfig, LocalSGDConfig
from tfdist.config.sections.compression import compression, named_compression

LOCAL_SGD_KEYS = ("period", "warmup_steps", "average_non_trainable", "average_optimizer_state",
                  "outer", "fragments", "overlap_steps", "overlap_mix", "compression", "islands",
                  "warmup_compression", "island_steps")


def local_sgd(source, path, value):
    checks.mapping(source, path, value, LOCAL_SGD_KEYS)
    if "period" not in value:
        raise source.error(path, "missing key 'period' (local steps between model averages)")
    period = checks.integer(source, path + ("period",), value["period"], minimum=1)
    fields = {"period": period}
    if "warmup_steps" in value:
        fields["warmup_steps"] = _warmup_steps(source, path + ("warmup_steps",),
                                               value["warmup_steps"])
    _check_first_synchronisation(source, path, period, fields.get("warmup_steps", 0))
    for key in ("average_non_trainable", "average_optimizer_state"):
        if key in value:
            fields[key] = checks.boolean(source, path + (key,), value[key])
    if value.get("outer") is not None:
        fields["outer"] = _outer(source, path + ("outer",), value["outer"])
    if "fragments" in value:
        fields["fragments"] = checks.integer(source, path + ("fragments",), value["fragments"],
                                             minimum=1, maximum=period)
    if "overlap_steps" in value:
        fields["overlap_steps"] = checks.integer(source, path + ("overlap_steps",),
                                                 value["overlap_steps"], minimum=0,
                                                 maximum=period - 1)
    if "overlap_mix" in value:
        fields["overlap_mix"] = checks.number(source, path + ("overlap_mix",),
                                              value["overlap_mix"], minimum=0, maximum=1)
    if value.get("compression") is not None:
        fields["compression"] = named_compression(source, path + ("compression",),
                                                  value["compression"], "synchronisation",
                                                  "int4, int8, fp16")
    if value.get("warmup_compression") is not None or fields.get("warmup_steps") == "auto":
        fields["warmup_compression"] = _warmup_compression(source, path, value, fields)
    if value.get("islands") is not None:
        fields["islands"] = _islands(source, path + ("islands",), value["islands"])
    if value.get("island_steps") is not None:
        fields["island_steps"] = _island_steps(source, path, value, fields)
    return LocalSGDConfig(**fields)


def _check_first_synchronisation(source, path, period, warmup_steps):
    """The step of the first synchronisation (warm-up plus a period) must be one a 64-bit
    step counter reaches, or the schedule could only fail there."""
    if warmup_steps != "auto" and warmup_steps + period > limits.INT64_MAX:
        raise source.error(path + ("warmup_steps",), f"with period {period}, warmup_steps must "
                           f"be at most {limits.INT64_MAX - period}: the first synchronisation "
                           "(at warmup_steps + period) must be a step a 64-bit counter reaches. "
                           f"Received: warmup_steps={warmup_steps}")


def _warmup_steps(source, path, value):
    """Synchronous steps before the local ones: a count, or "auto" (local steps begin when
    compression: auto's measurements predict they reach accuracy sooner, if ever)."""
    if isinstance(value, str):
        if value != "auto":
            raise source.error(path, f"expected a count of steps or auto. Received: "
                                     f"{checks.shown(value)}")
        return value
    return checks.integer(source, path, value, minimum=0)


def _warmup_compression(source, path, value, fields):
    """The warm-up's gradient exchange: a named method, or auto (measured and chosen,
    `tfdist.compression.auto`); `warmup_steps: auto` decides with auto's measurements, so
    its warm-up is auto's (given or not)."""
    where = path + ("warmup_compression",)
    given = value.get("warmup_compression")
    name = given if isinstance(given, str) else (
        given.get("name") if isinstance(given, dict) else None)
    if name != "auto" and fields.get("warmup_steps") != "auto":
        chosen = named_compression(source, where, given, "warm-up's gradient exchange",
                                   "topk with error_feedback, fp16")
        if chosen.ratio_warmup_steps:  # what the averager refuses when it is built
            raise source.error(where + ("ratio_warmup_steps",), "the warm-up's exchange has "
                               "no phases of its own (no ratio warm-up); warmup_steps is its "
                               f"schedule. Received: ratio_warmup_steps="
                               f"{chosen.ratio_warmup_steps}")
        return chosen
    if given is not None:
        chosen = compression(source, where, given)
        if chosen.name != "auto":
            raise source.error(where + ("name",), "warmup_steps: auto decides from compression: "
                               "auto's measurements, so the warm-up exchanges as auto chooses; "
                               f"remove warmup_compression or write auto. Received: "
                               f"{chosen.name}")
    if "islands" in value and value["islands"] is not None:
        raise source.error(where, "auto does not yet choose the exchange between islands; "
                           "name the warm-up's method (e.g. topk with error_feedback) and "
                           "give warmup_steps a count")
    return CompressionConfig(name="auto")


def _island_steps(source, path, value, fields):
    """Local steps each island trains per period (heterogeneous islands): one count per
    island, each between 1 and the period, or "auto" (measured from each island's speed)."""
    where = path + ("island_steps",)
    steps = value["island_steps"]
    if "islands" not in fields:
        raise source.error(where, "island_steps needs islands: (one count of local steps per "
                                  "island, or auto)")
    if steps == "auto":
        return steps
    if not isinstance(steps, (list, tuple)) or not steps:
        raise checks.type_error(source, where, "auto or a list of local steps per island",
                                steps)
    if len(steps) > limits.MAX_TASKS:
        raise source.error(where, f"at most {limits.MAX_TASKS} islands; got {len(steps)}")
    counts = tuple(checks.integer(source, where + (i,), n, minimum=1, maximum=fields["period"])
                   for i, n in enumerate(steps))
    islands = fields["islands"]
    expected = islands if isinstance(islands, int) else (
        len(islands) if isinstance(islands, tuple) else None)
    if expected is not None and len(counts) != expected:
        raise source.error(where, f"one count per island: islands gives {expected}, "
                                  f"island_steps lists {len(counts)}")
    return counts


def _islands(source, path, value):
    """A count of equal islands, "host", or lists of worker indices (a partition)."""
    if isinstance(value, str):
        return checks.string(source, path, value, ("host",))
    if not isinstance(value, (list, tuple)):
        return checks.integer(source, path, value, minimum=1, maximum=limits.MAX_ISLANDS)
    if len(value) > limits.MAX_ISLANDS:
        raise source.error(path, f"at most {limits.MAX_ISLANDS} islands (one collective group "
                                 f"each); got {len(value)}")
    if not value:
        raise source.error(path, "expected a count, 'host' or lists of worker indices, "
                                 "got an empty list")
    groups, seen = [], {}
    for i, group in enumerate(value):
        if not isinstance(group, (list, tuple)) or not group:
            raise checks.type_error(source, path + (i,), "a non-empty list of worker indices",
                                    group)
        for j, index in enumerate(group):
            index = checks.integer(source, path + (i, j), index, minimum=0,
                                   maximum=limits.MAX_TASKS - 1)
            if index in seen:
                raise source.error(path + (i, j), f"worker {index} is in two islands "
                                   f"(also islands[{seen[index]}])")
            seen[index] = i
        groups.append(tuple(group))
    missing = sorted(set(range(len(seen))) - set(seen))
    if missing:
        raise source.error(path, f"islands must list every worker index 0..{len(seen) - 1} "
                                 f"(chief first, then the workers); missing: {missing[:8]}")
    return tuple(groups)


def _outer(source, path, value):
    """DiLoCo's outer optimizer: a name of `OUTER_OPTIMIZERS` or {name, **its options}."""
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise checks.type_error(source, path, "an optimizer name or a mapping with name:", value)
    if "name" not in value:
        raise source.error(path, f"missing key 'name'; valid values are "
                           f"[{', '.join(OUTER_OPTIMIZERS)}]")
    name = checks.string(source, path + ("name",), value["name"], tuple(OUTER_OPTIMIZERS))
    checks.mapping(source, path, value, ("name", *OUTER_OPTIMIZERS[name]))
    options = {}
    for key, option in value.items():
        if key == "name":
            continue
        if key in ("nesterov", "amsgrad", "centered"):
            options[key] = checks.boolean(source, path + (key,), option)
        else:
            options[key] = checks.number(source, path + (key,), option, minimum=0)
    return types.MappingProxyType({"name": name, **options})
