"""TF_CONFIG: the JSON environment variable that tells each task its cluster and role.

`read_tf_config` is tfdist's one reader of it; everything else takes the parsed dict.
"""

import json
import os

from tfdist.cluster.address import parse_address
from tfdist.cluster.errors import ClusterError
from tfdist.cluster.vertex import parse_cluster_spec


def read_tf_config(environ=None):
    """This process's TF_CONFIG, parsed; without one, Vertex AI's CLUSTER_SPEC read as
    the TF_CONFIG it describes (`tfdist.cluster.vertex`: workerpool0..3 -> chief,
    worker, ps, evaluator).

    Args:
        environ: the environment to read; `os.environ` by default.

    Returns:
        The parsed JSON object, or None when TF_CONFIG and CLUSTER_SPEC are unset or empty.

    Raises:
        ClusterError: TF_CONFIG is not a JSON object with a valid cluster and task (see
            `check_tf_config`), or CLUSTER_SPEC is not Vertex's shape.
    """
    environ = os.environ if environ is None else environ
    if has_tf_config(environ):
        return parse_tf_config(environ["TF_CONFIG"])
    raw = environ.get("CLUSTER_SPEC")
    parsed = parse_cluster_spec(raw)
    if parsed is not None:
        try:
            check_tf_config(parsed, raw)
        except ClusterError as e:
            raise ClusterError(f"CLUSTER_SPEC (Vertex AI), read as TF_CONFIG: {e}") from None
    return parsed


def has_tf_config(environ=None):
    """True when TF_CONFIG itself is set and not blank (TensorFlow reads only it, not
    CLUSTER_SPEC); `environ` defaults to `os.environ`."""
    environ = os.environ if environ is None else environ
    return bool((environ.get("TF_CONFIG") or "").strip())


def parse_tf_config(raw):
    """Parses the text of a TF_CONFIG (None or empty: None); see `read_tf_config`."""
    if raw is None or not raw.strip():
        return None
    try:
        parsed = json.loads(raw)
    except ValueError as e:
        raise ClusterError(f"TF_CONFIG is not valid JSON ({e}). "
                           f"Received: TF_CONFIG={_shown(raw)}") from None
    except RecursionError:
        raise ClusterError("TF_CONFIG is nested too deeply to be a task description. "
                           f"Received: TF_CONFIG={_shown(raw)}") from None
    check_tf_config(parsed, raw)
    return parsed


def check_tf_config(parsed, raw=None):
    """Raises `ClusterError` unless `parsed` is a TF_CONFIG TensorFlow can use.

    That is a JSON object whose ``cluster`` (if given) maps job names to lists of
    ``"host:port"`` strings and whose ``task`` (if given) has a string ``type`` and an
    integer ``index`` >= 0 inside that job.
    """
    shown = _shown(raw if raw is not None else json.dumps(parsed))
    if not isinstance(parsed, dict):
        raise ClusterError("TF_CONFIG must be a JSON object with keys cluster and task. "
                           f"Received: TF_CONFIG={shown}")
    cluster, task = parsed.get("cluster", {}), parsed.get("task", {})
    if not isinstance(cluster, dict) or not all(
            isinstance(job, str) and isinstance(a, list) for job, a in cluster.items()):
        raise ClusterError('TF_CONFIG\'s cluster must map job names to lists of "host:port" '
                           f"strings. Received: TF_CONFIG={shown}")
    for job, addresses in cluster.items():
        for index, text in enumerate(addresses):
            _address(text, f"TF_CONFIG's cluster: {job}:{index}")
    if not isinstance(task, dict):
        raise ClusterError("TF_CONFIG's task must be an object with type and index. "
                           f"Received: TF_CONFIG={shown}")
    job, index = task.get("type"), task.get("index", 0)
    if task and not (isinstance(job, str) and job):
        raise ClusterError("TF_CONFIG's task type must be a job name such as 'worker'. "
                           f"Received: TF_CONFIG={shown}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ClusterError("TF_CONFIG's task index must be an integer >= 0. "
                           f"Received: TF_CONFIG={shown}")
    if job in cluster and index >= len(cluster[job]):
        raise ClusterError(f"TF_CONFIG names task {job}:{index}, but its cluster has "
                           f"{len(cluster[job])} {job} task(s). Received: TF_CONFIG={shown}")


def _shown(raw, limit=300):
    """TF_CONFIG text for a message: repr-escaped, long ones shortened."""
    return repr(raw) if len(raw) <= limit else f"{raw[:limit]!r}... ({len(raw)} characters)"


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


def check_matches(cluster, parsed, config_name="the config"):
    """Raises `ClusterError` naming the task if a TF_CONFIG disagrees with `cluster`.

    Args:
        cluster: a `ClusterConfig`, or a `SlurmClusterConfig`, whose chief, ps and
            evaluator counts must match and whose workers are whatever TF_CONFIG has.
        parsed: the TF_CONFIG, as `read_tf_config` returns it (or its JSON text); None
            when unset, which only a one-task cluster accepts.
        config_name: how messages name the config (its path).

    Raises:
        ClusterError: missing, malformed, other jobs or task counts, another address for
            a task whose address the config fixes, or a task outside the cluster.
    """
    if isinstance(parsed, str):
        parsed = parse_tf_config(parsed)
    if parsed is None:
        if len(cluster.tasks()) == 1:
            return
        raise ClusterError(f"{config_name} describes a cluster of {len(cluster.tasks())} tasks "
                           "but TF_CONFIG is not set, so this process would train alone; run "
                           "it under `tfdist launch` (or the Kubeflow operator)")
    try:
        task = parsed["task"]
        name = f"{task['type']}:{int(task['index'])}"
        actual = {job: list(addresses) for job, addresses in parsed["cluster"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ClusterError(f"TF_CONFIG is not a valid task description ({e}). "
                           f"Received: TF_CONFIG={json.dumps(parsed)!r}") from None
    if getattr(cluster, "scheduler", None):  # cluster: slurm: the step's workers are the rest
        cluster = cluster.with_workers(len(actual.get("worker", ())))
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
            got = _address(actual[job][index], f"TF_CONFIG of task {name}: {job}:{index}")
            if got.key() != address.key():
                raise ClusterError(f"TF_CONFIG of task {name} puts {job}:{index} at {got}, but "
                                   f"{config_name} says {address}")


def _address(text, where):
    try:
        if not isinstance(text, str):
            raise ClusterError('expected a "host:port" string')
        return parse_address(text)
    except ClusterError as e:
        raise ClusterError(f"{where}: {e}. Received: {text!r}") from None
