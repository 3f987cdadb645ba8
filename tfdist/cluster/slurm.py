"""A task's place in the cluster from what SLURM gives each task of an `srun` step.

A config with ``cluster: {slurm: {chief: 1, ps: 0, evaluator: 0, port: 2222}}`` runs one
TF task per SLURM task. Tasks are numbered by SLURM_PROCID with the job names in
alphabetical order, as TensorFlow's `SlurmClusterResolver` numbers them: first the
`chief`, then the `evaluator`, then the `ps` tasks, then the workers (all the tasks left
over, so they come last). Task i's host is the node it runs on, assuming
SLURM's default block distribution (each node's slots filled in order; the task's own
SLURM_NODEID, SLURMD_NODENAME and SLURM_LOCALID must agree), and its port is
``port + its local index on that node``, so tasks sharing a node never collide.

Environment read (set by srun in every task): SLURM_PROCID, SLURM_NTASKS,
SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) as a compressed host list, and
SLURM_STEP_TASKS_PER_NODE (``2(x3),1``). TensorFlow's `SlurmClusterResolver` reads the
same variables and gives the same cluster, except that it sorts the node names (so
``node9,node10`` puts node10 first, while SLURM places ranks in list order) and checks
nothing; this module adds the config's chief/ps/evaluator counts and clear errors.
"""

import itertools
import re

from tfdist.cluster.errors import ClusterError

JOB_ORDER = ("chief", "evaluator", "ps", "worker")  # SLURM_PROCID order (SlurmClusterResolver's)
TF_CONFIG_ORDER = ("chief", "worker", "ps", "evaluator")  # the jobs' order in TF_CONFIG
MAX_HOSTS = 100_000  # a host list that expands beyond this is refused before it is built
MAX_PORT = 65535

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_TASKS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def expand_hostlist(text):
    """SLURM's compressed host list as host names, in SLURM's order.

    ``"node[01-03,07],gpu3"`` -> ``["node01", "node02", "node03", "node07", "gpu3"]``;
    zero padding is kept (the width of a range's lower bound), and several bracket
    groups in one name expand as their product (``"r[1-2]n[1-2]"`` -> r1n1, r1n2, r2n1, r2n2).

    Raises:
        ClusterError: malformed brackets or ranges, or more than `MAX_HOSTS` names.
    """
    if not isinstance(text, str) or not text.strip():
        raise ClusterError(f"expected a SLURM host list such as node[01-04],gpu3. "
                           f"Received: {text!r}")
    hosts = []
    for item in _split_top_level(text.strip(), text):
        hosts.extend(_expand_item(item, text, MAX_HOSTS - len(hosts)))
    return hosts


def _split_top_level(text, whole):
    """Splits at commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ClusterError(f"unbalanced or nested brackets in the SLURM host list. "
                               f"Received: {whole!r}")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ClusterError(f"unclosed bracket in the SLURM host list. Received: {whole!r}")
    items.append(text[start:])
    if any(not item for item in items):
        raise ClusterError(f"empty host name in the SLURM host list. Received: {whole!r}")
    return items


def _expand_item(item, whole, budget):
    """One host pattern, e.g. ``rack[1-2]-n[01-04]``, as its names."""
    parts = re.split(r"\[([^\]]*)\]", item)  # text, range list, text, range list, ..., text
    choices = [[part] if i % 2 == 0 else _numbers(part, whole) for i, part in enumerate(parts)]
    count = 1
    for options in choices:
        count *= len(options)
    if count > budget:
        raise ClusterError(f"the SLURM host list expands to more than {MAX_HOSTS:,} hosts. "
                           f"Received: {whole[:200]!r}")
    return ["".join(names) for names in itertools.product(*choices)]


def _numbers(ranges, whole):
    """``"01-03,07"`` -> ["01", "02", "03", "07"], zero padding kept."""
    numbers = []
    for part in ranges.split(","):
        match = _RANGE.fullmatch(part)
        if not match:
            raise ClusterError(f"expected numbers or ranges like 01-04 inside brackets of the "
                               f"SLURM host list. Received: [{ranges}] in {whole!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ClusterError(f"range {part} in the SLURM host list ends before it starts. "
                               f"Received: {whole!r}")
        if int(high) - int(low) >= MAX_HOSTS:
            raise ClusterError(f"the SLURM host list expands to more than {MAX_HOSTS:,} hosts. "
                               f"Received: {whole[:200]!r}")
        numbers.extend(f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1))
    return numbers


def expand_tasks_per_node(text):
    """SLURM_STEP_TASKS_PER_NODE as a list: ``"2(x3),1"`` -> [2, 2, 2, 1].

    Raises:
        ClusterError: not SLURM's ``N`` / ``N(xK)`` comma-separated form.
    """
    counts = []
    for part in (text or "").split(","):
        match = _TASKS_PER_NODE.fullmatch(part.strip())
        if not match or int(match.group(2) or 1) > MAX_HOSTS - len(counts):
            raise ClusterError("expected SLURM_STEP_TASKS_PER_NODE like 2(x3),1. "
                               f"Received: {text!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def task_counts(slurm, num_tasks):
    """{job: count} for `num_tasks` SLURM tasks under a `SlurmClusterConfig`: chief, ps and
    evaluator as configured, every other task a worker (at least one).

    Raises:
        ClusterError: fewer tasks than the config's chief, ps and evaluator plus one worker.
    """
    fixed = {"chief": slurm.chief, "ps": slurm.ps, "evaluator": slurm.evaluator}
    workers = num_tasks - sum(fixed.values())
    if workers < 1:
        raise ClusterError(
            f"cluster: slurm: needs {sum(fixed.values()) + 1} SLURM tasks or more "
            f"({slurm.chief} chief, {slurm.ps} ps, {slurm.evaluator} evaluator and at least "
            f"one worker), but the step has {num_tasks}; raise srun -n / --ntasks. "
            f"Received: SLURM_NTASKS={num_tasks}")
    return {job: {"worker": workers, **fixed}[job] for job in JOB_ORDER}


def task_of_rank(counts, rank):
    """(job, index) of SLURM task `rank`, numbering tasks in `JOB_ORDER`."""
    for job in JOB_ORDER:
        if rank < counts[job]:
            return job, rank
        rank -= counts[job]
    raise ClusterError(f"task {rank} is beyond the cluster {counts}")


def block_placement(hosts, tasks_per_node):
    """[(host, local index)] of every task under block distribution: each node's slots
    are filled in order before the next node's.

    Raises:
        ClusterError: the host list and the tasks-per-node list disagree in length.
    """
    if len(hosts) != len(tasks_per_node):
        raise ClusterError(f"SLURM's node list has {len(hosts)} node(s) but "
                           f"SLURM_STEP_TASKS_PER_NODE describes {len(tasks_per_node)}. "
                           f"Received: nodes={hosts[:20]}, tasks per node={tasks_per_node[:20]}")
    return [(host, local) for host, n in zip(hosts, tasks_per_node) for local in range(n)]


def slurm_cluster(slurm, hosts, tasks_per_node):
    """{job: ["host:port"]} of the whole step; see the module docstring for the layout.

    Raises:
        ClusterError: too few tasks for the config, or a port beyond 65535.
    """
    placement = block_placement(hosts, tasks_per_node)
    counts = task_counts(slurm, len(placement))
    cluster = {job: [] for job in TF_CONFIG_ORDER if counts[job]}
    for rank, (host, local) in enumerate(placement):
        if slurm.port + local > MAX_PORT:
            raise ClusterError(f"cluster: slurm: port {slurm.port} + {local} (the task's index "
                               f"on node {host}) is beyond {MAX_PORT}; lower the port")
        cluster[task_of_rank(counts, rank)[0]].append(f"{host}:{slurm.port + local}")
    return cluster


def scheduled_task(config, environ):
    """({job: ["host:port"]}, job, index) of this SLURM task, or None outside SLURM.

    Args:
        config: a `Config` whose cluster is ``slurm:``.
        environ: the task's environment (SLURM_* variables, see the module docstring).

    Returns:
        None when SLURM_PROCID is unset (not a SLURM task).

    Raises:
        ClusterError: a config without ``cluster: slurm``, a batch script rather than an
            srun step, SLURM variables that are malformed or disagree with each other.
    """
    if "SLURM_PROCID" not in environ:
        return None
    slurm = _slurm_section(config)
    if not environ.get("SLURM_STEP_TASKS_PER_NODE"):
        raise ClusterError("SLURM_PROCID is set but SLURM_STEP_TASKS_PER_NODE is not: this is "
                           "a batch script, not a task of an srun step; run "
                           "`srun tfdist exec CONFIG -- COMMAND` (see `tfdist sbatch`)")
    rank = _integer(environ, "SLURM_PROCID")
    num_tasks = _integer(environ, "SLURM_NTASKS")
    nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if not nodes:
        raise ClusterError("SLURM_PROCID is set but neither SLURM_STEP_NODELIST nor "
                           "SLURM_JOB_NODELIST names the nodes. Received: "
                           f"SLURM_STEP_NODELIST={environ.get('SLURM_STEP_NODELIST')!r}")
    hosts = expand_hostlist(nodes)
    tasks_per_node = expand_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    if sum(tasks_per_node) != num_tasks:
        raise ClusterError(f"SLURM_STEP_TASKS_PER_NODE adds up to {sum(tasks_per_node)} tasks "
                           f"but SLURM_NTASKS is {num_tasks}. Received: "
                           f"SLURM_STEP_TASKS_PER_NODE={environ['SLURM_STEP_TASKS_PER_NODE']!r}")
    if rank >= num_tasks:
        raise ClusterError(f"SLURM_PROCID must be below SLURM_NTASKS={num_tasks}. "
                           f"Received: SLURM_PROCID={rank}")
    cluster = slurm_cluster(slurm, hosts, tasks_per_node)
    _check_own_placement(environ, rank, hosts, block_placement(hosts, tasks_per_node))
    job, index = task_of_rank(task_counts(slurm, num_tasks), rank)
    return cluster, job, index


def _slurm_section(config):
    cluster = config.cluster
    if getattr(cluster, "scheduler", None) != "slurm":
        name = config.path or "the config"
        raise ClusterError(f"this is a SLURM task (SLURM_PROCID is set), but {name} does not "
                           "say `cluster: {slurm: {...}}`, so tfdist cannot tell which SLURM "
                           "task is which TF task; see `tfdist sbatch`")
    return cluster


def _check_own_placement(environ, rank, hosts, placement):
    """This task's own SLURM_NODEID / SLURMD_NODENAME / SLURM_LOCALID must be where block
    distribution puts task `rank`; otherwise the other tasks' addresses would be wrong."""
    host, local = placement[rank]
    expected = {"SLURM_NODEID": str(hosts.index(host)), "SLURMD_NODENAME": host,
                "SLURM_LOCALID": str(local)}
    for name, value in expected.items():
        if name in environ and environ[name] != value:
            raise ClusterError(
                f"SLURM task {rank} runs with {name}={environ[name]!r}, but block distribution "
                f"puts it at {value!r}: tfdist derives every task's address from block "
                "distribution (SLURM's default); do not pass srun --distribution=cyclic or "
                f"arbitrary. Received: {name}={environ[name]!r}")


def _integer(environ, name):
    text = environ.get(name)
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise ClusterError(f"expected {name} to be a whole number, as srun sets it. "
                           f"Received: {name}={text!r}")
    return int(text)


def describe_slurm(slurm):
    """One line for `tfdist validate`: what a ``cluster: slurm`` config will run."""
    fixed = [f"{job}×{getattr(slurm, job)}" for job in ("chief", "ps", "evaluator")
             if getattr(slurm, job)]
    return (f"tasks from SLURM ({', '.join(fixed + ['worker×the rest'])}, at least "
            f"{slurm.minimum_tasks}; ports {slurm.port}+ per node)")


def served_until_chief_exits(argv, python="python"):
    """A server task's argv under SLURM: `argv` run by `tfdist.cluster.server_watch`, so
    that it ends when the chief is done and the srun step can end."""
    return [python, "-m", "tfdist.cluster.server_watch", "--", *argv]
