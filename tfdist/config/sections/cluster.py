"""The cluster: section: job types to addresses or task counts, or ``slurm``."""

from tfdist import limits
from tfdist.cluster.address import Address, parse_address
from tfdist.cluster.errors import ClusterError
from tfdist.config import checks
from tfdist.config.errors import clip
from tfdist.config.schema import JOB_TYPES, ClusterConfig, SlurmClusterConfig

SLURM_KEYS = ("chief", "ps", "evaluator", "port")


def cluster(source, path, value):
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
