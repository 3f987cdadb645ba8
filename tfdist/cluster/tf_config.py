"""TF_CONFIG: the JSON environment variable that tells each task its cluster and role."""

import json


def tf_config(cluster, task_type, task_index):
    """The TF_CONFIG dict of one task, as the Kubeflow operator writes it.

    Args:
        cluster: {job: ["host:port", ...]}, e.g. from `cluster_dict`.
        task_type, task_index: the task, which must be in `cluster`.

    Returns:
        ``{"cluster": ..., "task": {"type": ..., "index": ...}, "environment": "cloud"}``.
    """
    if task_index >= len(cluster.get(task_type, ())):
        raise ValueError(f"the cluster has no task {task_type}:{task_index}")
    return {"cluster": {job: list(addresses) for job, addresses in cluster.items()},
            "task": {"type": task_type, "index": int(task_index)},
            "environment": "cloud"}


def tf_config_json(cluster, task_type, task_index):
    """`tf_config` as the compact JSON string to put in the environment."""
    return json.dumps(tf_config(cluster, task_type, task_index), separators=(",", ":"))
