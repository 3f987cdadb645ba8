"""A task's TF_CONFIG from what its scheduler gives it, then the command its role runs.

`tfdist exec CONFIG -- COMMAND` is the entry point of every task that a scheduler, not
`tfdist launch`, starts: a pod of Kubeflow Trainer v2 (JobSet), a step of SLURM (`srun`)
or a replica of a Vertex AI custom job (CLUSTER_SPEC).
Each scheduler module turns its environment into (cluster, task type, index); this module
sets TF_CONFIG from it and replaces itself with the task's command.
"""

import os
import sys

from tfdist.cluster import jobset, slurm
from tfdist.cluster.errors import ClusterError
from tfdist.cluster.roles import runs_server, task_argv
from tfdist.cluster.tf_config import has_tf_config, read_tf_config, tf_config_json


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
        ClusterError: a malformed CLUSTER_SPEC.
    """
    if has_tf_config(environ) or not (environ.get("CLUSTER_SPEC") or "").strip():
        return None
    parsed = read_tf_config(environ)
    return parsed["cluster"], parsed["task"]["type"], parsed["task"]["index"]


def exec_task(config, command, environ=None):
    """Sets TF_CONFIG for this scheduled task and execs its command (does not return)."""
    environ = dict(os.environ if environ is None else environ)
    cluster, job, index = scheduled_task(config, environ)
    environ["TF_CONFIG"] = tf_config_json(cluster, job, index)
    strategy = config.strategy.name if config.strategy else None
    argv = task_argv(strategy, job, command, python=sys.executable)
    if runs_server(strategy, job) and "SLURM_PROCID" in environ:  # srun waits for every task
        argv = slurm.served_until_chief_exits(argv, python=sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, environ)
