"""TF_CONFIG: the JSON environment variable that tells each task its cluster and role.

`read_tf_config` is tfdist's one reader of it; everything else takes the parsed dict.
`environ_text` and `environ_integer` are the bounded readers of every variable a
scheduler sets (here and in `tfdist.cluster.slurm`, `tfdist.cluster.jobset`): a value is
refused by its length before it is parsed, with a message naming the variable.
"""

import json
import os

from tfdist.cluster.address import parse_address
from tfdist.cluster.errors import ClusterError
from tfdist.cluster.vertex import load_json, parse_cluster_spec
from tfdist.errors import shown
from tfdist.limits import MAX_TASKS

MAX_VARIABLE_CHARS = 1 << 20  # the longest variable read (a host list, JSON): 1 MiB
MAX_NUMBER_CHARS = 64  # the longest number read from a variable
MAX_ENV_STRING_BYTES = 128 * 1024  # Linux's MAX_ARG_STRLEN: one "NAME=value" execve passes


def environ_text(environ, name, max_chars=MAX_VARIABLE_CHARS):
    """Variable `name` of `environ` (None when unset), at most `max_chars` characters.

    Raises:
        ClusterError: a longer value; the message names the variable and shortens it.
    """
    return bounded(name, environ.get(name), max_chars)


def bounded(name, text, max_chars=MAX_VARIABLE_CHARS):
    """`text`, the value of variable `name` (or None), unless longer than `max_chars`."""
    if text is not None and len(text) > max_chars:
        raise ClusterError(f"{name} has {len(text):,} characters, expected at most "
                           f"{max_chars:,}. Received: {name}={shown(text)}")
    return text


def environ_integer(environ, name, maximum):
    """Variable `name` of `environ` as a whole number from 0 to `maximum`, written in
    ASCII decimal digits (at most `MAX_NUMBER_CHARS` of them).

    Raises:
        ClusterError: unset, not such a number, or above `maximum`; names the variable.
    """
    text = environ_text(environ, name, MAX_NUMBER_CHARS)
    if text is None or not (text.isascii() and text.isdigit()) or int(text) > maximum:
        raise ClusterError(f"expected {name} to be a whole number from 0 to {maximum:,}. "
                           f"Received: {name}={shown(text)}")
    return int(text)


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
    raw = environ_text(environ, "CLUSTER_SPEC")
    parsed = parse_cluster_spec(raw)
    if parsed is not None:
        try:
            check_tf_config(parsed, raw, name="CLUSTER_SPEC")
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
    parsed = load_json(bounded("TF_CONFIG", raw), "TF_CONFIG")
    check_tf_config(parsed, raw)
    return parsed


def _job(name):
    """A job name for a one-line message: as written, or quoted and escaped (`shown`) if it
    holds a line break or another unprintable character."""
    return name if name.isprintable() and len(name) <= 60 else shown(name)


def check_tf_config(parsed, raw=None, name="TF_CONFIG"):
    """Raises `ClusterError` unless `parsed` is a TF_CONFIG TensorFlow can use.

    That is a JSON object whose ``cluster`` (if given) maps job names to lists of
    ``"host:port"`` strings, at most `MAX_TASKS` in all, and whose ``task`` (if given)
    has a string ``type`` and an integer ``index`` >= 0 inside that job. `raw` is the
    text of variable `name` that `parsed` was read from, shown in messages.
    """
    shown_raw = f"{name}={shown(raw if raw is not None else json.dumps(parsed))}"
    if not isinstance(parsed, dict):
        raise ClusterError("TF_CONFIG must be a JSON object with keys cluster and task. "
                           f"Received: {shown_raw}")
    cluster, task = parsed.get("cluster", {}), parsed.get("task", {})
    if not isinstance(cluster, dict) or not all(
            isinstance(job, str) and isinstance(a, list) for job, a in cluster.items()):
        raise ClusterError('TF_CONFIG\'s cluster must map job names to lists of "host:port" '
                           f"strings. Received: {shown_raw}")
    if sum(map(len, cluster.values())) > MAX_TASKS:
        raise ClusterError(f"TF_CONFIG's cluster has {sum(map(len, cluster.values())):,} tasks, "
                           f"more than {MAX_TASKS:,} (tfdist.limits.MAX_TASKS). "
                           f"Received: {shown_raw}")
    for job, addresses in cluster.items():
        for index, text in enumerate(addresses):
            _address(text, f"TF_CONFIG's cluster: {_job(job)}:{index}")
    if not isinstance(task, dict):
        raise ClusterError("TF_CONFIG's task must be an object with type and index. "
                           f"Received: {shown_raw}")
    job, index = task.get("type"), task.get("index", 0)
    if task and not (isinstance(job, str) and job):
        raise ClusterError("TF_CONFIG's task type must be a job name such as 'worker'. "
                           f"Received: {shown_raw}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ClusterError("TF_CONFIG's task index must be an integer >= 0. "
                           f"Received: {shown_raw}")
    if job in cluster and index >= len(cluster[job]):
        raise ClusterError(f"TF_CONFIG names task {_job(job)}:{shown(index)}, but its cluster "
                           f"has {len(cluster[job])} {_job(job)} task(s). Received: {shown_raw}")


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


def check_matches(cluster, parsed, config_name="the config", places=None):
    """Raises `ClusterError` naming the task if a TF_CONFIG disagrees with `cluster`.

    Args:
        cluster: a `ClusterConfig`, or a `SlurmClusterConfig`, whose chief, ps and
            evaluator counts must match and whose workers are whatever TF_CONFIG has.
        parsed: the TF_CONFIG, as `read_tf_config` returns it (or its JSON text); None
            when unset, which only a one-task cluster accepts.
        config_name: how messages name the config (its path).
        places: (places, members) that an elastic launch gave this task
            (`tfdist.resize_signal.places`), or None: `cluster` is then the most the job
            runs with, and TF_CONFIG holds ``len(places)`` of its `members`
            (`ClusterConfig.resized`).

    Raises:
        ClusterError: missing, malformed, other jobs or task counts, another address for
            a task whose address the config fixes, or a task outside the cluster.
    """
    if isinstance(parsed, str):
        parsed = parse_tf_config(parsed)
    if parsed is None:
        _check_alone(cluster, config_name)
        return
    task, name, actual = _described_task(parsed)
    if getattr(cluster, "scheduler", None):  # cluster: slurm: the step's workers are the rest
        cluster = cluster.with_workers(len(actual.get("worker", ())))
    elif places is not None:
        cluster = _elastic_size(cluster, places, name, config_name)
    expected = cluster.jobs()
    _check_counts(expected, actual, task, name, config_name)
    _check_addresses(expected, actual, name, config_name)


def _check_alone(cluster, config_name):
    """Raises `ClusterError` unless a process without TF_CONFIG is the cluster's one task."""
    if len(cluster.tasks()) != 1:
        raise ClusterError(f"{config_name} describes a cluster of {len(cluster.tasks())} tasks "
                           "but TF_CONFIG is not set, so this process would train alone; run "
                           "it under `tfdist launch` (or the Kubeflow operator)")


def _described_task(parsed):
    """(task, its ``type:index`` name, {job: addresses}) of a parsed TF_CONFIG."""
    try:
        task = parsed["task"]
        name = f"{task['type']}:{int(task['index'])}"
        actual = {job: list(addresses) for job, addresses in parsed["cluster"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ClusterError(f"TF_CONFIG is not a valid task description ({e}). "
                           f"Received: TF_CONFIG={shown(json.dumps(parsed))}") from None
    return task, name, actual


def _counts(jobs):
    """{job: task count} of the jobs that have tasks."""
    return {job: len(addresses) for job, addresses in jobs.items() if addresses}


def _check_counts(expected, actual, task, name, config_name):
    """Raises `ClusterError` unless TF_CONFIG has the config's task counts and the task."""
    if _counts(actual) != _counts(expected):
        raise ClusterError(f"TF_CONFIG of task {name} disagrees with {config_name}: its cluster "
                           f"has {_counts(actual)} tasks, the config {_counts(expected)}")
    if int(task["index"]) >= len(actual.get(task["type"], ())):
        raise ClusterError(f"TF_CONFIG names task {name}, which is not in its cluster "
                           f"{_counts(actual)}")


def _check_addresses(expected, actual, name, config_name):
    """Raises `ClusterError` if TF_CONFIG moves a task whose address the config fixes."""
    for job, addresses in expected.items():
        for index, address in enumerate(addresses):
            if address.port is None:
                continue  # a task count: the launcher picked the port
            got = _address(actual[job][index], f"TF_CONFIG of task {name}: {job}:{index}")
            if got.key() != address.key():
                raise ClusterError(f"TF_CONFIG of task {name} puts {job}:{index} at {got}, but "
                                   f"{config_name} says {address}")


def _elastic_size(cluster, places, name, config_name):
    """`cluster` at the size an elastic launch runs it now."""
    found, members = places
    if members != cluster.num_training_tasks:
        raise ClusterError(f"task {name} was started by an elastic launch of {members} chief and "
                           f"worker tasks, but {config_name} has {cluster.num_training_tasks}: "
                           "launch the job with the config the training script reads")
    return cluster.resized(len(found))


def _address(text, where):
    try:
        if not isinstance(text, str):
            raise ClusterError('expected a "host:port" string')
        return parse_address(text)
    except ClusterError as e:
        raise ClusterError(f"{where}: {e}. Received: {shown(text)}") from None
