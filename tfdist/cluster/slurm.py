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

from tfdist.cluster.address import check_host
from tfdist.cluster.errors import ClusterError
from tfdist.cluster.tf_config import environ_integer, environ_text
from tfdist.errors import shown
from tfdist.limits import MAX_TASKS

JOB_ORDER = ("chief", "evaluator", "ps", "worker")  # SLURM_PROCID order (SlurmClusterResolver's)
TF_CONFIG_ORDER = ("chief", "worker", "ps", "evaluator")  # the jobs' order in TF_CONFIG
MAX_HOSTS = 100_000  # a host list that expands beyond this is refused before it is built
MAX_PORT = 65535
MAX_NAME_CHARS = 253  # the longest host name

_ITEM = re.compile(r"(?:[^,\[\]]+|\[[^\[\]]*\])*")  # one host pattern, up to a top-level ','
_PART = re.compile(r"\[([^\]]*)\]|([^\[]+)")  # a bracket's ranges, or the text between
_NAME_TEXT = re.compile(r"[A-Za-z0-9._-]+")  # what a SLURM node name holds outside brackets
_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?")
_TASKS_PER_NODE = re.compile(r"([0-9]{1,9})(?:\(x([0-9]{1,9})\))?")


def expand_hostlist(text, limit=MAX_HOSTS):
    """SLURM's compressed host list as host names, in SLURM's order.

    ``"node[01-03,07],gpu3"`` -> ``["node01", "node02", "node03", "node07", "gpu3"]``;
    zero padding is kept (the width of a range's lower bound), and several bracket
    groups in one name expand as their product (``"r[1-2]n[1-2]"`` -> r1n1, r1n2, r2n1, r2n2).
    The names are counted (`count_hosts`) before any is built.

    Raises:
        ClusterError: malformed brackets or ranges, characters that are not a host name's,
            or more than `limit` names.
    """
    count_hosts(text, limit)
    hosts = [host for item in _items(text) for host in _expand_item(item)]
    for host in hosts:
        try:
            check_host(host)
        except ClusterError as e:
            raise ClusterError(f"{e}, in the SLURM host list. Received: {shown(text)}") from None
    return hosts


def count_hosts(text, limit=MAX_HOSTS):
    """How many names SLURM's compressed host list `text` stands for, computed from its
    ranges (sums within a bracket, products across brackets) without expanding any.

    Raises:
        ClusterError: as `expand_hostlist`, as soon as the count passes `limit`.
    """
    total = 0
    for item in _items(text):
        total += _item_count(item, text, limit)
        if total > limit:
            raise ClusterError(f"the SLURM host list expands to more than {limit:,} hosts. "
                               f"Received: {shown(text)}")
    return total


def _items(text):
    """The host patterns of `text`, split at commas outside brackets, one at a time."""
    if not isinstance(text, str) or not text.strip():
        raise ClusterError(f"expected a SLURM host list such as node[01-04],gpu3. "
                           f"Received: {shown(text)}")
    text, start = text.strip(), 0
    while True:
        end = _ITEM.match(text, start).end()
        if end < len(text) and text[end] != ",":
            problem = ("nested brackets" if text[end] == "[" and "]" in text[end:] else
                       "unclosed bracket" if text[end] == "[" else "unbalanced brackets")
            raise ClusterError(f"{problem} in the SLURM host list. Received: {shown(text)}")
        if end == start:
            raise ClusterError(f"empty host name in the SLURM host list. Received: {shown(text)}")
        yield text[start:end]
        if end == len(text):
            return
        start = end + 1


def _item_count(item, whole, limit):
    """How many names one pattern such as ``rack[1-2]-n[01-04]`` stands for; counting
    stops once past `limit`."""
    count, length = 1, 0
    for match in _PART.finditer(item):
        ranges, name_text = match.groups()
        if ranges is None and not _NAME_TEXT.fullmatch(name_text):
            raise ClusterError(f"SLURM node names hold letters, digits, '-', '.' and '_'. "
                               f"Received: {shown(name_text)} in {shown(whole)}")
        length += 1 if ranges is not None else len(name_text)
        if length > MAX_NAME_CHARS:
            raise ClusterError(f"the SLURM host list has a name longer than {MAX_NAME_CHARS} "
                               f"characters. Received: {shown(whole)}")
        if ranges is not None:
            count *= _range_count(ranges, whole, limit)
        if count > limit:
            break
    return count


def _range_count(ranges, whole, limit):
    """How many numbers ``"01-03,07"`` stands for (4); counting stops once past `limit`."""
    total = 0
    for low, high in _ranges(ranges, whole):
        total += int(high) - int(low) + 1
        if total > limit:
            break
    return total


def _ranges(ranges, whole):
    """(low, high) digit strings of each range in ``"01-03,07"``, one at a time."""
    for part in _split(ranges):
        match = _RANGE.fullmatch(part)
        if not match:
            raise ClusterError(f"expected numbers or ranges like 01-04 inside brackets of the "
                               f"SLURM host list. Received: [{shown(ranges)[1:-1]}] in "
                               f"{shown(whole)}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ClusterError(f"range {part} in the SLURM host list ends before it starts. "
                               f"Received: {shown(whole)}")
        yield low, high


def _split(text):
    """`text`'s comma-separated parts, one at a time (no list of them is built)."""
    start = 0
    while (end := text.find(",", start)) >= 0:
        yield text[start:end]
        start = end + 1
    yield text[start:]


def _expand_item(item):
    """One pattern (already counted) as its names."""
    choices = [[text] if text is not None else
               [f"{n:0{len(low)}d}" for low, high in _ranges(ranges, item)
                for n in range(int(low), int(high) + 1)]
               for ranges, text in (match.groups() for match in _PART.finditer(item))]
    return ["".join(names) for names in itertools.product(*choices)]


def expand_tasks_per_node(text, limit=MAX_TASKS):
    """SLURM_STEP_TASKS_PER_NODE as a list: ``"2(x3),1"`` -> [2, 2, 2, 1], counted
    (`count_tasks_per_node`) before it is built.

    Raises:
        ClusterError: not SLURM's ``N`` / ``N(xK)`` comma-separated form, or more than
            `limit` tasks.
    """
    count_tasks_per_node(text, limit)
    return [tasks for tasks, nodes in _tasks_per_node(text) for _ in range(nodes)]


def count_tasks_per_node(text, limit=MAX_TASKS):
    """(tasks, nodes) that SLURM_STEP_TASKS_PER_NODE describes, e.g. (7, 4) for
    ``2(x3),1``, computed without expanding it; see `expand_tasks_per_node`."""
    tasks = nodes = 0
    for per_node, count in _tasks_per_node(text):
        tasks, nodes = tasks + per_node * count, nodes + count
        if tasks > limit:
            raise _tasks_per_node_error(text, limit)
    return tasks, nodes


def _tasks_per_node(text):
    """(tasks, nodes) of each ``N(xK)`` part of SLURM_STEP_TASKS_PER_NODE, one at a time."""
    for part in _split(text or ""):
        match = _TASKS_PER_NODE.fullmatch(part.strip())
        if not match or int(match.group(1)) < 1 or int(match.group(2) or 1) < 1:
            raise _tasks_per_node_error(text, MAX_TASKS)
        yield int(match.group(1)), int(match.group(2) or 1)


def _tasks_per_node_error(text, limit):
    return ClusterError(f"expected SLURM_STEP_TASKS_PER_NODE like 2(x3),1 (at least 1 task "
                        f"per node, at most {limit:,} in all). "
                        f"Received: SLURM_STEP_TASKS_PER_NODE={shown(text)}")


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
    per_node = environ_text(environ, "SLURM_STEP_TASKS_PER_NODE")
    if not per_node:
        raise ClusterError("SLURM_PROCID is set but SLURM_STEP_TASKS_PER_NODE is not: this is "
                           "a batch script, not a task of an srun step; run "
                           "`srun tfdist exec CONFIG -- COMMAND` (see `tfdist sbatch`)")
    rank = environ_integer(environ, "SLURM_PROCID", MAX_TASKS)
    num_tasks = environ_integer(environ, "SLURM_NTASKS", MAX_TASKS)
    total, nodes = count_tasks_per_node(per_node)
    if total != num_tasks:
        raise ClusterError(f"SLURM_STEP_TASKS_PER_NODE adds up to {total} tasks but "
                           f"SLURM_NTASKS is {num_tasks}. Received: "
                           f"SLURM_STEP_TASKS_PER_NODE={shown(per_node)}")
    if rank >= num_tasks:
        raise ClusterError(f"SLURM_PROCID must be below SLURM_NTASKS={num_tasks}. "
                           f"Received: SLURM_PROCID={rank}")
    hosts = _hosts(environ, nodes)
    tasks_per_node = expand_tasks_per_node(per_node)
    cluster = slurm_cluster(slurm, hosts, tasks_per_node)
    _check_own_placement(environ, rank, hosts, block_placement(hosts, tasks_per_node))
    job, index = task_of_rank(task_counts(slurm, num_tasks), rank)
    return cluster, job, index


def _hosts(environ, count):
    """The step's `count` node names, from SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
    counted before they are expanded."""
    name = next((name for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
                 if environ_text(environ, name)), None)
    if name is None:
        raise ClusterError("SLURM_PROCID is set but neither SLURM_STEP_NODELIST nor "
                           "SLURM_JOB_NODELIST names the nodes. Received: "
                           f"SLURM_STEP_NODELIST={shown(environ.get('SLURM_STEP_NODELIST'))}")
    text = environ[name]
    try:
        listed = count_hosts(text)
        if listed == count:
            return expand_hostlist(text)
    except ClusterError as e:
        raise ClusterError(f"{name}: {e}") from None
    raise ClusterError(f"{name} has {listed} node(s) but SLURM_STEP_TASKS_PER_NODE describes "
                       f"{count}. Received: {name}={shown(text)}")


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
        actual = environ_text(environ, name, MAX_NAME_CHARS)
        if actual is not None and actual != value:
            raise ClusterError(
                f"SLURM task {rank} runs with {name}={shown(actual)}, but block distribution "
                f"puts it at {value!r}: tfdist derives every task's address from block "
                "distribution (SLURM's default); do not pass srun --distribution=cyclic or "
                f"arbitrary. Received: {name}={shown(actual)}")


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
