"""A task's TF_CONFIG from what its scheduler gives it, then the command its role runs.

`tfdist exec CONFIG -- COMMAND` is the entry point of every task that a scheduler, not
`tfdist launch`, starts: a pod of Kubeflow Trainer v2 (JobSet), a step of SLURM (`srun`)
or a replica of a Vertex AI custom job (CLUSTER_SPEC).
Each scheduler module turns its environment into (cluster, task type, index); this module
sets TF_CONFIG from it and replaces itself with the task's command. Every variable is
read bounded (`tfdist.cluster.tf_config.environ_text`), a TF_CONFIG too large for Linux to
pass is refused before the exec, and a command that cannot be run is a `CommandError`.
"""

import errno
import os
import sys

from tfdist import limits
from tfdist.cluster import jobset, slurm
from tfdist.cluster.errors import ClusterError
from tfdist.cluster.roles import runs_server, task_argv
from tfdist.cluster.tf_config import (MAX_ENV_STRING_BYTES, environ_text, has_tf_config,
                                      read_tf_config, tf_config_json)
from tfdist.cluster.vertex import POOL_JOBS
from tfdist.errors import shown

NOT_FOUND, NOT_EXECUTABLE, OTHER_FAILURE = 127, 126, 2  # exit codes: a shell's, and else 2
_NOT_FOUND = (errno.ENOENT, errno.ENOTDIR)
_NOT_EXECUTABLE = (errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ETXTBSY)


class CommandError(OSError):
    """The task's command could not be run; `exit_code` says why as a shell would: 127
    not found, 126 not executable, else 2. An `OSError`, not a `TfdistError` (whose exit
    code is always 2)."""

    def __init__(self, message, exit_code=OTHER_FAILURE):
        super().__init__(message)
        self.exit_code = exit_code


def scheduled_task(config, environ):
    """({job: ["host:port"]}, task type, index) of this task, from its scheduler.

    Raises:
        ClusterError: no scheduler's environment found, or one that disagrees with `config`.
    """
    for scheduled in (jobset.scheduled_task, slurm.scheduled_task, vertex_task):
        task = scheduled(config, environ)
        if task is not None:
            return task
    raise ClusterError("tfdist exec runs a task started by a scheduler, but found neither a "
                       "JobSet pod (JOBSET_NAME) nor a SLURM step (SLURM_PROCID) nor a Vertex "
                       "AI replica (CLUSTER_SPEC) in the environment; on this machine use "
                       "`tfdist launch`")


def vertex_task(config, environ):
    """({job: ["host:port"]}, job, index) of a Vertex AI replica from its CLUSTER_SPEC
    (`tfdist.cluster.vertex`), or None without one or with a TF_CONFIG, which wins.

    Raises:
        ClusterError: a blank or malformed CLUSTER_SPEC, or one whose task is not in its
            cluster.
    """
    if has_tf_config(environ) or "CLUSTER_SPEC" not in environ:
        return None
    raw = environ_text(environ, "CLUSTER_SPEC")
    if not raw.strip():
        raise ClusterError("CLUSTER_SPEC is set but blank, so this Vertex AI replica's cluster "
                           f"is unknown. Received: CLUSTER_SPEC={shown(raw)}")
    parsed = read_tf_config(environ)
    cluster, job, index = parsed["cluster"], parsed["task"]["type"], parsed["task"]["index"]
    if index >= len(cluster.get(job, ())):
        pool = {job: pool for pool, job in POOL_JOBS.items()}[job]
        raise ClusterError(f"CLUSTER_SPEC's task {pool}:{index} is not in its cluster, which "
                           f"has {len(cluster.get(job, ()))} {pool} address(es). "
                           f"Received: CLUSTER_SPEC={shown(raw)}")
    return cluster, job, index


def exec_task(config, command, environ=None):
    """Sets TF_CONFIG for this scheduled task and execs its command (does not return).

    Raises:
        ClusterError: no scheduler's environment, a malformed one, or a TF_CONFIG too
            large to pass to a command.
        CommandError: the command could not be run (not found, not executable...).
    """
    environ = dict(os.environ if environ is None else environ)
    cluster, job, index = scheduled_task(config, environ)
    islands = config.local_sgd.islands if config.local_sgd is not None else None
    if islands is not None and islands != "host":
        problem = limits.islands_problem(islands, len(cluster.get("chief", []))
                                  + len(cluster.get("worker", [])))
        if problem:
            raise ClusterError(f"local_sgd.islands: {problem} (the tasks of this "
                               "scheduler's step)")
    environ["TF_CONFIG"] = passable_tf_config(cluster, job, index)
    strategy = config.strategy.name if config.strategy else None
    argv = task_argv(strategy, job, command, python=sys.executable)
    if runs_server(strategy, job) and "SLURM_PROCID" in environ:  # srun waits for every task
        argv = slurm.served_until_chief_exits(argv, python=sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, environ)
    except (OSError, ValueError) as e:  # ValueError: an empty command name
        raise command_error(argv, environ, e) from None


def passable_tf_config(cluster, job, index):
    """`tf_config_json` of the task, refused beyond Linux's MAX_ARG_STRLEN: execve
    passes no ``NAME=value`` string longer than `MAX_ENV_STRING_BYTES`."""
    text = tf_config_json(cluster, job, index)
    size = len("TF_CONFIG=") + len(text.encode()) + 1  # with its terminating NUL
    if size > MAX_ENV_STRING_BYTES:
        tasks = sum(map(len, cluster.values()))
        raise ClusterError(f"the TF_CONFIG of this {tasks:,}-task cluster takes {size:,} bytes, "
                           f"but Linux passes at most {MAX_ENV_STRING_BYTES} bytes per "
                           "environment variable (MAX_ARG_STRLEN); use fewer tasks")
    return text


def command_error(argv, environ, error):
    """The `CommandError` for an error of execve."""
    number = getattr(error, "errno", None)
    code = (NOT_FOUND if number in _NOT_FOUND else
            NOT_EXECUTABLE if number in _NOT_EXECUTABLE else OTHER_FAILURE)
    hint = ""
    if number == errno.E2BIG:
        size = sum(len(k) + len(v) + 2 for k, v in environ.items()) + sum(map(len, argv))
        hint = (f"; its arguments and environment take about {size:,} bytes "
                f"(TF_CONFIG {len(environ['TF_CONFIG']):,})")
    reason = getattr(error, "strerror", None) or error
    return CommandError(f"cannot run {shown(argv[0])}: {reason}{hint}", code)
