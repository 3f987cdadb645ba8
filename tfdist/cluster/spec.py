"""From a `ClusterConfig` to the concrete {job: ["host:port"]} that TF_CONFIG carries."""

from tfdist.cluster.errors import ClusterError
from tfdist.cluster.ports import free_ports, port_in_use

__all__ = ["ClusterError", "check_local_ports_free", "check_resolvable", "cluster_dict",
           "parse_task"]


def cluster_dict(cluster, *, pick_free_ports=False):
    """{job: ["host:port", ...]} for every non-empty job.

    Args:
        cluster: a `ClusterConfig`.
        pick_free_ports: give tasks configured by count a free local port; if False,
            such a cluster raises, since no port is known yet.

    Raises:
        ClusterError: a count-based job and `pick_free_ports=False`.
    """
    jobs = cluster.jobs()
    missing = [job for job, addresses in jobs.items() if any(a.port is None for a in addresses)]
    if missing and not pick_free_ports:
        raise ClusterError(
            f"cluster.{missing[0]} is a task count, so its ports are only chosen by "
            "`tfdist launch`; list \"host:port\" addresses to get a fixed TF_CONFIG")
    ports = iter(free_ports(sum(a.port is None for job in missing for a in jobs[job])))
    return {job: [str(a) if a.port is not None else f"localhost:{next(ports)}" for a in addresses]
            for job, addresses in jobs.items()}


def check_local_ports_free(cluster, tasks=None):
    """Raises ClusterError naming the first local task whose fixed port is already taken.

    Args:
        cluster: a `ClusterConfig`.
        tasks: the (job, index) pairs to check; all tasks by default.
    """
    for job, index in tasks or cluster.tasks():
        address = cluster.jobs()[job][index]
        if address.port is not None and address.is_local and port_in_use(address.port):
            raise ClusterError(f"{job}:{index}: port {address.port} of {address} is already "
                               "in use by another process (on some local address: TensorFlow's "
                               "server listens on all of them); free it or choose another port")


def check_resolvable(cluster):
    """Raises `ClusterError` naming the first task whose host name does not resolve."""
    import socket

    for job, addresses in cluster.jobs().items():
        for index, address in enumerate(addresses):
            try:
                socket.getaddrinfo(address.host, address.port or 0)
            except (socket.gaierror, UnicodeError) as e:
                raise ClusterError(f"{job}:{index} is at {address}, but host {address.host!r} "
                                   f"cannot be resolved ({getattr(e, 'strerror', None) or e}); "
                                   "check the cluster: section") from None


def parse_task(text, cluster=None):
    """'worker:1' -> ('worker', 1), checked against `cluster` ({job: addresses}) if given.

    Raises:
        ClusterError: malformed text, or a task the cluster does not have.
    """
    job, sep, index = text.partition(":")
    if not sep or not job or not (index.isascii() and index.isdigit()) or len(index) > 9:
        raise ClusterError(f"expected a task as TYPE:INDEX, e.g. worker:0. Received: {text!r}")
    index = int(index)
    if cluster is not None and index >= len(cluster.get(job, ())):
        tasks = ", ".join(f"{j}:0..{len(a) - 1}" for j, a in cluster.items() if a)
        raise ClusterError(f"the cluster has no task {job}:{index}; it has [{tasks}]")
    return job, index
