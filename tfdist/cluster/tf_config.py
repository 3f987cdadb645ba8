"""TF_CONFIG: the JSON environment variable that tells each task its cluster and role."""

import json

from tfdist.cluster.errors import ClusterError


def tf_config(cluster, task_type, task_index):
    """The TF_CONFIG dict of one task, as the Kubeflow operator writes it.

    Args:
        cluster: {job: ["host:port", ...]}, e.g. from `cluster_dict`.
        task_type, task_index: the task, which must be in `cluster`.

    Returns:
        ``{"cluster": ..., "task": {"type": ..., "index": ...}, "environment": "cloud"}``.

    Raises:
        ClusterError: the task is not in `cluster`.
    """
    if task_index >= len(cluster.get(task_type, ())):
        raise ClusterError(f"the cluster has no task {task_type}:{task_index}")
    return {"cluster": {job: list(addresses) for job, addresses in cluster.items()},
            "task": {"type": task_type, "index": int(task_index)},
            "environment": "cloud"}


def tf_config_json(cluster, task_type, task_index):
    """`tf_config` as the compact JSON string to put in the environment."""
    return json.dumps(tf_config(cluster, task_type, task_index), separators=(",", ":"))


def check_matches(cluster, raw, config_name="the config"):
    """Raises `ClusterError` naming the task if TF_CONFIG (`raw`) disagrees with `cluster`
    (a `ClusterConfig`): missing, malformed, other jobs or task counts, another address
    for a task whose address the config fixes, or a task outside the cluster."""
    from tfdist.cluster.address import parse_address

    if not raw:
        if len(cluster.tasks()) == 1:
            return
        raise ClusterError(f"{config_name} describes a cluster of {len(cluster.tasks())} tasks "
                           "but TF_CONFIG is not set, so this process would train alone; run "
                           "it under `tfdist launch` (or the Kubeflow operator)")
    try:
        parsed = json.loads(raw)
        task = parsed["task"]
        name = f"{task['type']}:{int(task['index'])}"
        actual = {job: list(addresses) for job, addresses in parsed["cluster"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ClusterError(f"TF_CONFIG is not a valid task description ({e}). "
                           f"Received: TF_CONFIG={raw!r}") from None
    expected = cluster.jobs()
    counts = lambda jobs: {job: len(addresses) for job, addresses in jobs.items() if addresses}
    if counts(actual) != counts(expected):
        raise ClusterError(f"TF_CONFIG of task {name} disagrees with {config_name}: its cluster "
                           f"has {counts(actual)} tasks, the config {counts(expected)}")
    if int(task["index"]) >= len(actual.get(task["type"], ())):
        raise ClusterError(f"TF_CONFIG names task {name}, which is not in its cluster "
                           f"{counts(actual)}")
    for job, addresses in expected.items():
        for index, address in enumerate(addresses):
            if address.port is None:
                continue  # a task count: the launcher picked the port
            got = parse_address(actual[job][index])
            if got.key() != address.key():
                raise ClusterError(f"TF_CONFIG of task {name} puts {job}:{index} at {got}, but "
                                   f"{config_name} says {address}")
