"""The rules that span sections: the cluster, compression and local SGD must fit the
strategy (what each strategy allows comes from `tfdist.capabilities`)."""

from tfdist import limits
from tfdist.capabilities import CAPABILITIES, capabilities, names_with
from tfdist.config.sections.elastic import min_workers_problem


def check_together(config, source):
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
    if config.elastic is not None:
        _check_elastic_fits(config, name, source)
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


def _check_elastic_fits(config, name, source):
    """elastic: resizes a multi_worker_mirrored job of workers (and its islands)."""
    if name != "multi_worker_mirrored":
        raise source.error(("elastic",), "resizes the collective group of "
                           "strategy multi_worker_mirrored (parameter_server already goes on "
                           "without a lost worker and uses it again when it returns). "
                           f"Received: strategy={name}")
    cluster = config.cluster
    if cluster is None or cluster.scheduler is not None:
        return
    problem = min_workers_problem(config.elastic.min_workers,
                                  len(cluster.chief) + len(cluster.worker))
    if problem:
        raise source.error(("elastic", "min_workers"), problem)


def _check_islands_fit(config, source):
    """Islands of a cluster given by counts or addresses must group its workers; on one
    machine, the replicas its strategy options name (`devices`, `logical_cpus`)."""
    islands, cluster = config.local_sgd.islands, config.cluster
    if cluster is not None and cluster.scheduler is None:
        problem = limits.islands_problem(islands, len(cluster.chief) + len(cluster.worker))
    elif cluster is None and islands != "host":
        replicas = _named_replicas(config.strategy.options)
        problem = replicas and limits.islands_problem(islands, replicas, unit="replicas")
    else:
        return  # a scheduler's tasks: checked when the job starts (tfdist exec)
    if problem:
        raise source.error(("local_sgd", "islands"), problem)


def _named_replicas(options):
    """How many replicas a one-machine strategy's options give (its `devices`, else its
    `logical_cpus`), or None where the machine decides (its GPUs)."""
    return len(options.get("devices") or ()) or options.get("logical_cpus")


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
