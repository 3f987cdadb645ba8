"""YAML → frozen `Config`, with every problem a located `ConfigError`."""

import dataclasses
import difflib
import functools
import types

from tfdist.cluster.address import Address, parse_address
from tfdist.cluster.errors import ClusterError
from tfdist import limits
from tfdist.config import checks
from tfdist.config.errors import clip
from tfdist.config.schema import (COMPRESSORS, JOB_TYPES, STRATEGIES, ClusterConfig,
                                  CompressionConfig, Config, LocalSGDConfig, SlurmClusterConfig,
                                  StrategyConfig)
from tfdist.config.hyperparameters import EF21_COMPRESSORS, HYPERPARAMETERS, OUTER_OPTIMIZERS
from tfdist.config.yaml_source import Source, read_yaml
from tfdist.capabilities import CAPABILITIES, capabilities, names_with

SECTIONS = ("cluster", "strategy", "compression", "local_sgd")

_positive_int = functools.partial(checks.integer, minimum=1)
_count = functools.partial(checks.integer, minimum=0)
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



# Compressor hyper-parameters (tfdist.config.hyperparameters): key -> (compressors
# it applies to, default, check).
COMPRESSOR_PARAMS = {name: (p.compressors, p.default, p.checked)
                     for name, p in HYPERPARAMETERS.items()}
# The exchange's own options (tfdist.compression.exchange.GradientCompression).
EXCHANGE_OPTIONS = {"start_step": _count, "min_size": _count, "bucket_bytes": _count,
                    "freeze_variance": checks.boolean}
COMPRESSION_KEYS = ("name", *COMPRESSOR_PARAMS, "error_feedback", *EXCHANGE_OPTIONS)
LOCAL_SGD_KEYS = ("period", "warmup_steps", "average_non_trainable", "average_optimizer_state",
                  "outer", "fragments", "overlap_steps", "overlap_mix", "compression", "islands",
                  "warmup_compression", "island_steps")


def load_config(path):
    """Reads and validates a tfdist config file.

    Args:
        path: a YAML file (str or os.PathLike) with any of the sections cluster,
            strategy, compression, local_sgd, plus the application's own sections.

    Returns:
        A frozen `Config`; a section left out is None.

    Raises:
        ConfigError: anything wrong with the file, naming file, line, key and expectation,
            in one printable line; also a file beyond `tfdist.limits` (size,
            values with aliases expanded, nesting, number length, tasks), refused
            before the work it would cost.
    """
    data, source = read_yaml(path)
    return build_config(data, source)


def config_from_dict(data, name="<dict>"):
    """Validates an in-memory config (same rules as a file, without line numbers)."""
    return build_config(data, Source(name, {}, {}))


def strategy_from_dict(value, name="<dict>"):
    """Validates a strategy section on its own (name or mapping) into a `StrategyConfig`."""
    return _strategy(Source(name, {}, {}), ("strategy",), value)


def compression_from_dict(value, name="<dict>", *, source=None):
    """Validates a compression section on its own into a `CompressionConfig`; `source`
    (e.g. `Source.of_call`) says where its values came from."""
    if source is None:
        return _compression(Source(name, {}, {}), ("compression",), value)
    return _compression(source, (), value)


def local_sgd_from_dict(value, *, source):
    """Validates a local_sgd section on its own (e.g. a constructor's arguments, with
    `Source.of_call`) into a `LocalSGDConfig`."""
    return _local_sgd(source, (), value)


def check_arguments(call, declared, **values):
    """Python arguments of `call`, each checked by the loader's check `declared[name]`:
    refused exactly when the same value in a config file is. Returns them, converted."""
    source = Source.of_call(call)
    return {name: declared[name](source, (name,), value) for name, value in values.items()}


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
        cluster=get("cluster", _cluster),
        strategy=get("strategy", _strategy),
        compression=get("compression", _compression),
        local_sgd=get("local_sgd", _local_sgd),
        app=_freeze_app(source, {k: v for k, v in data.items() if k not in SECTIONS}),
        path=source.file,
        source=source,
    )
    _check_together(config, source)
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


def _cluster(source, path, value):
    if value == "slurm" or (isinstance(value, dict) and "slurm" in value):
        return _slurm_cluster(source, path, value)
    if isinstance(value, dict) and "master" in value:
        raise source.error(path + ("master",), "TensorFlow 2 rejects the job name 'master' "
                           "(Kubeflow's Master replica); use 'chief' for the coordinating task")
    checks.mapping(source, path, value, JOB_TYPES, "job types to addresses")
    jobs = {job: _job(source, path + (job,), job, spec) for job, spec in value.items()}
    cluster = ClusterConfig(**jobs)
    total = sum(len(addresses) for addresses in jobs.values())
    if total > limits.MAX_TASKS:
        raise _too_many_tasks(source, path, f"{total:,} tasks")
    if not cluster.tasks():
        raise source.error(path, "the cluster has no tasks; give at least one worker")
    seen = {}
    for job, index in cluster.tasks():
        address = cluster.jobs()[job][index]
        if address.port is None:
            continue
        if address.key() in seen:
            raise source.error(path + (job, index), f"duplicate address {address} "
                               f"(also {seen[address.key()]}); every task needs its own port")
        seen[address.key()] = f"{job}:{index}"
    return cluster


SLURM_KEYS = ("chief", "ps", "evaluator", "port")


def _slurm_cluster(source, path, value):
    """``cluster: slurm`` or ``cluster: {slurm: {chief, ps, evaluator, port}}``."""
    if isinstance(value, dict) and len(value) > 1:
        other = next(key for key in value if key != "slurm")
        raise source.error(path + (other,), "cluster: slurm: takes its tasks from SLURM (every "
                           "task not a chief, ps or evaluator is a worker); list no jobs "
                           f"beside it. Received: {checks.shown(other)}")
    spec = {} if value == "slurm" or value["slurm"] is None else value["slurm"]
    path = path + ("slurm",)
    if isinstance(spec, dict) and "worker" in spec:
        raise source.error(path + ("worker",), "under cluster: slurm: every SLURM task not a "
                           "chief, ps or evaluator is a worker; choose their number with "
                           "srun -n / tfdist sbatch --ntasks. "
                           f"Received: worker={checks.shown(spec['worker'])}")
    checks.mapping(source, path, spec, SLURM_KEYS, "chief, ps, evaluator and port")
    get = lambda key, default, low, high: checks.integer(  # noqa: E731
        source, path + (key,), spec.get(key, default), minimum=low, maximum=high)
    return SlurmClusterConfig(chief=get("chief", 0, 0, 1), ps=get("ps", 0, 0, limits.MAX_TASKS),
                              evaluator=get("evaluator", 0, 0, 1),
                              port=get("port", 2222, 1, 65535))


def _too_many_tasks(source, path, received):
    return source.error(path, f"expected at most {limits.MAX_TASKS:,} tasks in the whole "
                              f"cluster (tfdist.limits.MAX_TASKS). Received: {received}")


def _job(source, path, job, spec):
    limit = 1 if job in ("chief", "evaluator") else None
    if isinstance(spec, int) and not isinstance(spec, bool):
        if limit is None and spec > limits.MAX_TASKS:
            raise _too_many_tasks(source, path, f"{job}={checks.shown(spec)}")
        count = checks.integer(source, path, spec, minimum=0, maximum=limit)
        return tuple(Address("localhost") for _ in range(count))
    if not isinstance(spec, list):
        raise checks.type_error(source, path, 'a list of "host:port" strings or a task count', spec)
    if len(spec) > limits.MAX_TASKS:
        raise _too_many_tasks(source, path, f"{len(spec):,} addresses for {job}")
    if limit is not None and len(spec) > limit:
        raise source.error(path, f"at most one {job} task is allowed; TF_CONFIG accepts a "
                                 f"single {job}. Received: {len(spec)} addresses")
    addresses = []
    for i, item in enumerate(spec):
        if not isinstance(item, str):
            raise checks.type_error(source, path + (i,), 'a "host:port" string', item)
        try:
            addresses.append(parse_address(item))
        except ClusterError as e:
            raise source.error(path + (i,), f"{clip(str(e), 300)}. "
                                            f"Received: {checks.shown(item)}") from None
    return tuple(addresses)


def _strategy(source, path, value):
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


def _compression(source, path, value):
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


def _local_sgd(source, path, value):
    checks.mapping(source, path, value, LOCAL_SGD_KEYS)
    if "period" not in value:
        raise source.error(path, "missing key 'period' (local steps between model averages)")
    period = checks.integer(source, path + ("period",), value["period"], minimum=1)
    fields = {"period": period}
    if "warmup_steps" in value:
        fields["warmup_steps"] = _warmup_steps(source, path + ("warmup_steps",),
                                               value["warmup_steps"])
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
        fields["compression"] = _named_compression(source, path + ("compression",),
                                                   value["compression"], "synchronisation",
                                                   "int4, int8, fp16")
    if value.get("warmup_compression") is not None or fields.get("warmup_steps") == "auto":
        fields["warmup_compression"] = _warmup_compression(source, path, value, fields)
    if value.get("islands") is not None:
        fields["islands"] = _islands(source, path + ("islands",), value["islands"])
    if value.get("island_steps") is not None:
        fields["island_steps"] = _island_steps(source, path, value, fields)
    return LocalSGDConfig(**fields)


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
        compression = _named_compression(source, where, given, "warm-up's gradient exchange",
                                         "topk with error_feedback, fp16")
        if compression.ratio_warmup_steps:  # what the averager refuses when it is built
            raise source.error(where + ("ratio_warmup_steps",), "the warm-up's exchange has "
                               "no phases of its own (no ratio warm-up); warmup_steps is its "
                               f"schedule. Received: ratio_warmup_steps="
                               f"{compression.ratio_warmup_steps}")
        return compression
    if given is not None:
        compression = _compression(source, where, given)
        if compression.name != "auto":
            raise source.error(where + ("name",), "warmup_steps: auto decides from compression: "
                               "auto's measurements, so the warm-up exchanges as auto chooses; "
                               f"remove warmup_compression or write auto. Received: "
                               f"{compression.name}")
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


def _named_compression(source, path, value, what, examples):
    """A compression section that names its method (not auto) and starts at once."""
    compression = _compression(source, path, value)
    if compression.name == "auto":
        raise source.error(path + ("name",), f"auto chooses a gradient compression; name the "
                           f"method of the {what} (e.g. {examples})")
    if compression.start_step:
        raise source.error(path + ("start_step",), f"the {what} has no delayed start of its "
                           f"own (warmup_steps says when local steps begin). Received: "
                           f"start_step={compression.start_step}")
    return compression


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


def _check_together(config, source):
    """Rules that span sections: the cluster must fit the strategy, and so on.

    What each strategy allows comes from `tfdist.capabilities`.
    """
    name = config.strategy.name if config.strategy else None
    with_ps = tuple(n for n, row in CAPABILITIES.items() if "ps" in row.required_jobs)
    if config.cluster is not None and config.cluster.ps and name not in with_ps:
        where = ("cluster", *filter(None, [config.cluster.scheduler]), "ps")
        raise source.error(where, f"ps tasks need strategy name: {_either(with_ps)}. "
                           f"Received: strategy={name}")
    if config.local_sgd is not None and config.local_sgd.compression and config.compression:
        raise source.error(("local_sgd", "compression"), "the synchronisation's compression "
                           "is given twice: here and in the top-level compression: section "
                           "(which, with local_sgd, compresses the same); keep one")
    if config.local_sgd is not None and getattr(config.compression, "name", None) == "auto":
        raise source.error(("compression", "name"), "with local_sgd: the compression section "
                           "compresses the model averages, which auto does not choose for; "
                           "name a method (e.g. fp16)")
    if name is None:
        return
    allowed = capabilities(name)
    _check_cluster_fits(config.cluster, allowed, source)
    if config.compression is not None:
        _check_compression_fits(config.compression, allowed, source)
    if config.local_sgd is not None and not allowed.local_sgd:
        raise source.error(("local_sgd",), f"local SGD needs replicas that hold their own "
                           f"weights: [{', '.join(names_with('local_sgd'))}]. Received: "
                           f"strategy={name}")
    if config.local_sgd is not None and config.local_sgd.islands is not None:
        _check_islands_fit(config, source)
    if config.local_sgd is not None and getattr(config.local_sgd, "island_steps", None) \
            is not None and not allowed.multi_worker:
        raise source.error(("local_sgd", "island_steps"), "island_steps needs islands of "
                           "workers (a multi-worker job): a machine's replicas share one loop "
                           f"and train at one pace. Received: strategy={name}")


def _check_islands_fit(config, source):
    """Islands of a cluster given by counts or addresses: they must group its workers."""
    islands, cluster = config.local_sgd.islands, config.cluster
    if cluster is None or cluster.scheduler is not None:
        return  # one machine's replicas, or a scheduler's: checked when the job starts
    problem = limits.islands_problem(islands, len(cluster.chief) + len(cluster.worker))
    if problem:
        raise source.error(("local_sgd", "islands"), problem)


# Why a strategy that requires a job type needs it, for messages.
_JOB_ROLES = {"worker": "to run the training steps", "ps": "to hold the variables",
              "chief": "the coordinator that runs your script"}


def _check_cluster_fits(cluster, allowed, source):
    name = allowed.name
    if cluster is None:
        if allowed.required_jobs:
            raise source.error(("strategy", "name"), f"{name} needs a cluster: section with "
                               f"{_tasks_of(allowed.required_jobs)} tasks")
        return
    if cluster.scheduler is not None:
        return _check_scheduled_cluster_fits(cluster, allowed, source)
    for job in allowed.required_jobs:
        if not getattr(cluster, job):
            raise source.error(("cluster",), f"{name} needs at least one {job} task "
                               f"({_JOB_ROLES.get(job, 'for this strategy')}). Received: no {job}")
    if not allowed.multi_worker and cluster.num_training_tasks > 1:
        raise source.error(("strategy", "name"), f"{name} trains on one machine, but the "
                           f"cluster lists {cluster.num_training_tasks} chief/worker tasks; "
                           f"use {_either(names_with('multi_worker'))}")


def _check_scheduled_cluster_fits(cluster, allowed, source):
    """A scheduler's cluster (slurm): workers are its remaining tasks, so at least one."""
    name = allowed.name
    if not allowed.multi_worker:
        raise source.error(("strategy", "name"), f"{name} trains on one machine, but cluster: "
                           f"{cluster.scheduler} runs one TF task per task of the SLURM step; "
                           f"use {_either(names_with('multi_worker'))}")
    for job in allowed.required_jobs:
        if job != "worker" and not getattr(cluster, job):
            raise source.error(("cluster", cluster.scheduler, job), f"{name} needs a {job} "
                               f"task ({_JOB_ROLES.get(job, 'for this strategy')}). "
                               f"Received: {job}=0")


def _check_compression_fits(compression, allowed, source):
    name = allowed.name
    if not allowed.allows_compressor(compression.name):
        if not allowed.push_compression:
            raise source.error(("compression", "name"), f"compression needs gradients that "
                               f"cross between replicas; under {name} nothing is exchanged. "
                               f"Use one of [{', '.join(_compressing())}]")
        raise source.error(("compression", "name"), f"under {name} only "
                           f"[{', '.join(allowed.push_compression)}] compress the gradient push. "
                           f"Received: name={compression.name!r}")
    for key in ("error_feedback", "start_step"):
        if not allowed.allows_compression_options(**{key: getattr(compression, key)}):
            raise source.error(("compression", key), f"under {name} the gradient push takes "
                               "no error feedback or delayed start (start_step). Received: "
                               f"{key}={getattr(compression, key)!r}")


def _compressing():
    """The strategies under which some compressor applies."""
    return tuple(dict.fromkeys(names_with("compression") + names_with("push_compression")))


def _either(names):
    return " or ".join(names)


def _tasks_of(jobs):
    return ", ".join(jobs[:-1]) + f" and {jobs[-1]}" if len(jobs) > 1 else jobs[0]


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
