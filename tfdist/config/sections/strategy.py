"""The strategy: section: a strategy name, or a mapping of its name and options."""

import functools
import types

from tfdist import limits
from tfdist.config import checks
from tfdist.config.schema import STRATEGIES, StrategyConfig

_positive_int = functools.partial(checks.integer, minimum=1)
STRATEGY_OPTIONS = {
    "mirrored": {
        "devices": checks.string_list,
        "cross_device_ops": functools.partial(
            checks.string, choices=("auto", "nccl", "hierarchical_copy", "reduce_to_one")),
        "logical_cpus": functools.partial(checks.integer, minimum=1,
                                          maximum=limits.MAX_LOGICAL_CPUS),
    },
    "multi_worker_mirrored": {
        "communication": functools.partial(checks.string, choices=("auto", "ring", "nccl")),
        "timeout_seconds": functools.partial(checks.number, minimum=0, open_minimum=True),
    },
    "central_storage": {
        "devices": checks.string_list,
        "parameter_device": checks.string,
        "logical_cpus": functools.partial(checks.integer, minimum=1,
                                          maximum=limits.MAX_LOGICAL_CPUS),
    },
    "parameter_server": {"max_shards": _positive_int, "min_shard_bytes": _positive_int},
    "one_device": {"device": checks.string},
    "default": {},
}


def strategy(source, path, value):
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise checks.type_error(source, path, "a strategy name or a mapping with name:", value)
    if "name" not in value:
        raise source.error(path, f"missing key 'name'; valid values are [{', '.join(STRATEGIES)}]")
    name = checks.string(source, path + ("name",), value["name"], STRATEGIES)
    allowed = STRATEGY_OPTIONS[name]
    checks.mapping(source, path, value, ("name", *allowed))
    options = {key: allowed[key](source, path + (key,), v)
               for key, v in value.items() if key != "name"}
    return StrategyConfig(name, types.MappingProxyType(options))
