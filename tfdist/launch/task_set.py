"""Which tasks a launch starts, and how each one's process is made: its TF_CONFIG, its
argv (a TF server for parameter_server's workers and ps), and its environment (the
launch's tag `reaper.ENV_TAG`, a private TMPDIR inside the launch's directory)."""

import os
import signal
import sys
import time

from tfdist.cluster.roles import runs_server, task_argv
from tfdist.cluster.spec import check_local_ports_free, check_resolvable, cluster_dict
from tfdist.cluster.tf_config import tf_config_json
from tfdist.launch import elastic, reaper
from tfdist.launch.errors import LaunchError
from tfdist.launch.task_process import TaskProcess

_POLL_SECONDS = 0.05


def selected_tasks(config, only_task):
    """The (job, index) tasks to start, [] for a job without a cluster.

    Raises:
        LaunchError, ClusterError: a task not on this machine, ports not fixed for
            `only_task`, a host that does not resolve, a port in use.
    """
    cluster = config.cluster
    if cluster is None:
        return []
    selected = [only_task] if only_task else cluster.tasks()
    if only_task is None:
        _check_all_local(cluster)
    elif cluster.has_free_ports:
        job = next(j for j, a in cluster.jobs().items() if any(x.port is None for x in a))
        raise LaunchError(
            f"--task starts one host of a cluster with fixed addresses, but cluster.{job} "
            "is a task count, whose ports are only picked when tfdist launches every task "
            "itself; list \"host:port\" addresses for every task")
    check_resolvable(cluster)
    check_local_ports_free(cluster, selected)
    return selected


def make_tasks(config, command, tmpdir, sink, selected, *, places=None, only_task=None,
               preloader=None):
    """A `TaskProcess` per task of `selected` (every task of the cluster at the present
    size of an elastic job's `places`), writing to `sink`; one "main" task without a
    cluster; each forked from `preloader` where it can be."""
    strategy = config.strategy.name if config.strategy else None
    base_env = dict(os.environ, PYTHONUNBUFFERED="1")
    base_env.pop("TF_CONFIG", None)
    base_env[reaper.ENV_TAG] = tmpdir
    cluster = config.cluster
    if cluster is None:
        return [TaskProcess("main", command, _private_tmp(base_env, tmpdir, "main"), sink,
                            preloader=preloader)]
    if places is not None:
        cluster = elastic.resized(cluster, places.size())
        selected = cluster.tasks()
        base_env = elastic.task_env(base_env, places)
    addresses = cluster_dict(cluster, pick_free_ports=only_task is None)
    tasks = []
    for job, index in selected:
        env = dict(_private_tmp(base_env, tmpdir, f"{job}-{index}"),
                   TF_CONFIG=tf_config_json(addresses, job, index))
        argv = task_argv(strategy, job, command, python=sys.executable)
        tasks.append(TaskProcess(f"{job}:{index}", argv, env, sink,
                                 is_server=runs_server(strategy, job), preloader=preloader))
    return tasks


def stop_tasks(tasks, grace_seconds, log, first=signal.SIGTERM):
    """`first` to every task's process group, SIGKILL to each after `grace_seconds` (said
    for those still running), each process waited for."""
    for task in tasks:
        if task.poll() is None and task.proc is not None:
            task.stopped = True
        task.signal_group(first)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(t.poll() is None for t in tasks if t.proc):
        time.sleep(_POLL_SECONDS)
    for task in tasks:
        if first != signal.SIGKILL and task.poll() is None and task.proc is not None:
            log(f"{task.name} did not stop within {grace_seconds:g}s; killing it")
        task.signal_group(signal.SIGKILL)
        if task.proc is not None:
            task.proc.wait()
            task.group_killed = True


def kill_hung(tasks, finished, hang_seconds, log, first_only=False):
    """SIGKILLs (and says so) each running task of `tasks` not in `finished` that made no
    progress for `hang_seconds`; only the first of them (`first_only`: an elastic job,
    whose others wait for it and are not lost)."""
    hung = [task for task in tasks
            if not (task.is_server or task.name in finished or task.poll() is not None
                    or task.seconds_without_progress() < hang_seconds)]
    if first_only and hung:
        hung = [elastic.first_hung(hung)]
    for task in hung:
        log(f"{task.name} is hung: no output and no CPU time for {hang_seconds:g}s "
            f"(pid {task.pid})")
        task.hung = True
        task.signal_group(signal.SIGKILL)


def _private_tmp(env, tmpdir, name):
    """`env` with TMPDIR (and TEMP, TMP) a new directory `name` inside `tmpdir`."""
    path = os.path.join(tmpdir, name)
    os.makedirs(path, exist_ok=True)
    return dict(env, TMPDIR=path, TEMP=path, TMP=path)


def _check_all_local(cluster):
    for job, index in cluster.tasks():
        address = cluster.jobs()[job][index]
        if not address.is_local:
            raise LaunchError(
                f"{job}:{index} is at {address}, which is not this machine; to run every task "
                "here use localhost addresses or task counts, or start one task per host "
                "with --task TYPE:INDEX")
