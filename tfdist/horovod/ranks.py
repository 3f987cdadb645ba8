"""Horovod's ranks of this process, read from its TF_CONFIG (Sergeev & Del Balso 2018,
"Horovod: fast and easy distributed deep learning in TensorFlow").

`rank` is the task's index among the job's workers in MultiWorkerMirroredStrategy's
order — the chief first, then the workers — and `size` their count; `local_rank` and
`local_size` count the workers on this task's host (the host part of its address, as
Horovod groups processes by host name); `cross_rank` is the host's index among the hosts
in order of their first worker, `cross_size` their count. Without a TF_CONFIG a process
is a job of one (Horovod without horovodrun). Pure Python.
"""

import dataclasses

from tfdist.cluster.errors import ClusterError

#: The tasks that run training steps: the ones Horovod's processes are.
TRAINING_JOBS = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class Ranks:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1


def ranks_of(tf_config):
    """The `Ranks` of the task a parsed TF_CONFIG describes (None: a job of one).

    Raises:
        ClusterError: no task, or the task is not a worker (a parameter server or an evaluator runs
            no training steps: a Horovod script has no such process).
    """
    if tf_config is None:
        return Ranks()
    task = tf_config.get("task") or {}
    if not task:
        raise ClusterError("TF_CONFIG names no task for this process, so it has no rank: "
                           "each worker's TF_CONFIG needs its task (tfdist launch sets it)")
    if task["type"] not in TRAINING_JOBS:
        raise ClusterError(
            f"tfdist.horovod runs one process per worker, as horovodrun does; this task is "
            f"{task['type']}:{task['index']} (TF_CONFIG), which trains no step: start workers "
            "only (tfdist launch -n N -- python train.py), or use tfdist's strategies for "
            "parameter servers and evaluators")
    workers = [(job, index, address) for job in TRAINING_JOBS
               for index, address in enumerate(tf_config["cluster"].get(job, []))]
    rank = next(r for r, (job, index, _) in enumerate(workers)
                if (job, index) == (task["type"], task["index"]))
    hosts = [_host(address) for _, _, address in workers]
    order = list(dict.fromkeys(hosts))
    mine = hosts[rank]
    return Ranks(rank=rank, size=len(workers), local_rank=hosts[:rank].count(mine),
                 local_size=hosts.count(mine), cross_rank=order.index(mine),
                 cross_size=len(order))


def _host(address):
    """The host part of "host:port" ("[::1]:2222" -> "[::1]")."""
    return address.rsplit(":", 1)[0]
