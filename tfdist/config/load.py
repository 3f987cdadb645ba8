"""YAML → frozen `Config`, with every problem a located `ConfigError`."""

import difflib
import types

from tfdist import limits
from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.config.schema import Config
from tfdist.config.sections.cluster import SLURM_KEYS, cluster
from tfdist.config.sections.compression import (COMPRESSION_KEYS, COMPRESSOR_PARAMS,
                                                EXCHANGE_OPTIONS, compression)
from tfdist.config.sections.elastic import ELASTIC_KEYS, elastic
from tfdist.config.sections.local_sgd import LOCAL_SGD_KEYS, local_sgd
from tfdist.config.sections.strategy import STRATEGY_OPTIONS, strategy
from tfdist.config.together import check_together
from tfdist.config.yaml_source import Source, read_yaml

# Re-exported: the names callers and tests take from here.
__all__ = ["COMPRESSION_KEYS", "COMPRESSOR_PARAMS", "ELASTIC_KEYS", "EXCHANGE_OPTIONS",
           "LOCAL_SGD_KEYS",
           "SECTIONS", "SLURM_KEYS", "STRATEGY_OPTIONS", "build_config", "check_arguments",
           "compression_from_dict", "config_from_dict", "load_config", "local_sgd_from_dict",
           "strategy_from_dict"]

SECTIONS = ("cluster", "strategy", "compression", "local_sgd", "elastic")


def load_config(path):
    """Reads and validates a tfdist config file.

    Args:
        path: a YAML file (str or os.PathLike) with any of the sections cluster,
            strategy, compression, local_sgd, elastic, plus the application's own
            sections.

    Returns:
        A frozen `Config`; a section left out is None.

    Raises:
        ConfigError: anything wrong with the file, naming file, line, key and expectation,
            in one printable line; also a file beyond `tfdist.limits` (size,
            values with aliases expanded, nesting, number length, tasks), refused
            before the work it would cost.

    Examples:
        >>> path = tmp / "job.yaml"
        >>> _ = path.write_text("{cluster: {worker: 2}, strategy: multi_worker_mirrored, "
        ...                     "compression: {name: topk, ratio: 0.01}}")
        >>> config = tfdist.load_config(path)
        >>> config.strategy.name, config.cluster.num_training_tasks
        ('multi_worker_mirrored', 2)
        >>> config.compression.name, config.compression.ratio, config.compression.min_size
        ('topk', 0.01, 1024)
        >>> _ = path.write_text("compresion: topk")
        >>> tfdist.load_config(path)
        Traceback (most recent call last):
        tfdist.config.errors.ConfigError: ...job.yaml:1: compresion: unknown section 'compresion'; did you mean 'compression'? ...
    """
    data, source = read_yaml(path)
    return build_config(data, source)


def config_from_dict(data, name="<dict>"):
    """Validates an in-memory config (same rules as a file, without line numbers)."""
    return build_config(data, Source(name, {}, {}))


def strategy_from_dict(value, name="<dict>"):
    """Validates a strategy section on its own (name or mapping) into a `StrategyConfig`."""
    return strategy(Source(name, {}, {}), ("strategy",), value)


def compression_from_dict(value, name="<dict>", *, source=None):
    """Validates a compression section on its own into a `CompressionConfig`; `source`
    (e.g. `Source.of_call`) says where its values came from."""
    if source is None:
        return compression(Source(name, {}, {}), ("compression",), value)
    return compression(source, (), value)


def local_sgd_from_dict(value, *, source):
    """Validates a local_sgd section on its own (e.g. a constructor's arguments, with
    `Source.of_call`) into a `LocalSGDConfig`."""
    return local_sgd(source, (), value)


def build_config(data, source):
    """Validates parsed YAML `data` located by `source` into a `Config`."""
    if not isinstance(data, dict):
        raise checks.type_error(source, (), "a mapping of sections such as cluster:, strategy:", data)
    for key in data:
        if not isinstance(key, str):
            raise source.error((), "top-level keys must be strings. "
                                   f"Received: key {checks.shown(key)}")
        _check_not_a_misspelled_section(source, key)
    get = lambda name, build: None if data.get(name) is None else build(source, (name,), data[name])
    config = Config(
        cluster=get("cluster", cluster),
        strategy=get("strategy", strategy),
        compression=get("compression", compression),
        local_sgd=get("local_sgd", local_sgd),
        elastic=get("elastic", elastic),
        app=_freeze_app(source, {k: v for k, v in data.items() if k not in SECTIONS}),
        path=source.file,
        source=source,
    )
    check_together(config, source)
    return config


def _check_not_a_misspelled_section(source, key):
    if key in SECTIONS:
        return
    normal = key.lower().replace("-", "_")
    close = difflib.get_close_matches(normal, SECTIONS, n=1, cutoff=0.8)
    if close:
        raise source.error((key,), f"unknown section {checks.shown(key)}; "
                                   f"did you mean {close[0]!r}? "
                                   f"(tfdist's sections are [{', '.join(SECTIONS)}]; "
                                   "other names are left to the application)")


def _freeze_app(source, app):
    """The application's sections, deep-frozen within MAX_DEPTH and MAX_VALUES (a value
    reached twice, as through a YAML alias, counts twice; one that contains itself never
    ends and is refused)."""
    budget = [limits.MAX_VALUES]
    return types.MappingProxyType(
        {key: _freeze(source, (key,), value, 1, budget) for key, value in app.items()})


def _freeze(source, path, value, depth, budget):
    """Read-only mappings and tuples all the way down."""
    budget[0] -= 1
    if budget[0] < 0 or depth > limits.MAX_DEPTH:
        raise source.error(path, f"expected at most {limits.MAX_DEPTH} levels and "
                                 f"{limits.MAX_VALUES:,} values, counting every repetition "
                                 "(tfdist.limits); a structure that contains itself "
                                 "never ends")
    if isinstance(value, dict):
        return types.MappingProxyType(
            {k: _freeze(source, path, v, depth + 1, budget) for k, v in value.items()})
    if isinstance(value, (list, tuple)):  # a tuple: a pair of YAML's !!pairs
        return tuple(_freeze(source, path, v, depth + 1, budget) for v in value)
    if isinstance(value, set):  # YAML's !!set
        return frozenset(value)
    return value
