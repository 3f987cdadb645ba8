"""A Kubeflow TFJob (kubeflow.org/v1) for the cluster of a config file."""

import re

from tfdist.cluster.errors import ClusterError
from tfdist.cluster.roles import task_argv
from tfdist.errors import shown

REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
PORT = 2222
DNS_LABEL_LENGTH = 63  # Kubernetes' limit for a Service name and a pod's host name
#: The exit code of a task that saved a backup after a preemption signal
#: (`tfdist.step.preemption.EXIT_CODE`, 128 + SIGTERM); restart rules retry it.
PREEMPTED_EXIT_CODE = 143
DEFAULT_GRACE_SECONDS, MAX_GRACE_SECONDS = 60, 86400
INT32_MAX = 2**31 - 1  # backoffLimit is an int32
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_IMAGE = re.compile(r"[!-~]+")  # visible ASCII: no spaces, newlines or control characters


def dns_name(text, what, max_length=DNS_LABEL_LENGTH):
    """Checks a Kubernetes name (DNS-1123 label); raises `ClusterError` with the rule."""
    if len(text) > max_length or not _DNS_LABEL.fullmatch(text):
        raise ClusterError(f"{what} must be a DNS-1123 label: lowercase letters, digits and '-', "
                           f"starting with a letter, at most {max_length} characters. "
                           f"Received: {text!r}")
    return text


def check_image(image, max_length=None):
    """Raises `ClusterError` unless `image` looks like a container image reference."""
    if not _IMAGE.fullmatch(image) or (max_length is not None and len(image) > max_length):
        limit = f", at most {max_length} characters" if max_length is not None else ""
        raise ClusterError("--image must be a container image reference (visible characters, "
                           f"no spaces{limit}). Received: {image!r}")


def check_max_restarts(max_restarts, field):
    """Raises `ClusterError` unless `max_restarts` fits the int32 `field` it becomes."""
    if not 0 <= max_restarts <= INT32_MAX:
        raise ClusterError(f"--max-restarts must be between 0 and {INT32_MAX} ({field} is "
                           f"an int32). Received: {max_restarts!r}")


def check_grace_seconds(seconds):
    """Raises `ClusterError` unless `seconds` is a whole number of seconds a task may
    take to save after SIGTERM (1 to a day)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or \
            not 1 <= seconds <= MAX_GRACE_SECONDS:
        raise ClusterError(f"--grace-seconds must be a whole number from 1 to {MAX_GRACE_SECONDS} "
                           "(the time a task gets after SIGTERM to finish its step and save). "
                           f"Received: {seconds!r}")


def check_argv(argv, what="the command"):
    """Raises `ClusterError` unless every argument can stand in a Kubernetes manifest:
    UTF-8 text (the API's strings; a command line's bytes that are not UTF-8 arrive as
    lone surrogates) without NUL (which no exec takes)."""
    for i, word in enumerate(argv):
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            raise ClusterError(f"{what} cannot go into a Kubernetes manifest: argument {i} "
                               "holds bytes that are not UTF-8 (Kubernetes strings are UTF-8). "
                               f"Received: {shown(word.encode('utf-8', 'surrogateescape'))}"
                               ) from None
        if "\0" in word:
            raise ClusterError(f"{what} cannot hold a NUL character (argument {i}). "
                               f"Received: {shown(word)}")
    return list(argv)


def default_name(path, max_length=DNS_LABEL_LENGTH):
    """A TFJob name from a config file name: 'configs/MWMS_2.yaml' -> 'mwms-2'."""
    stem = re.sub(r"\.ya?ml$", "", str(path).rsplit("/", 1)[-1]).lower()
    stem = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")
    name = stem if stem[:1].isalpha() else f"tfdist-{stem}".rstrip("-")
    return name[:max_length].rstrip("-")


def longest_suffix(cluster):
    """The longest ``-<type>-<index>`` the operator appends to the job name for a pod and
    its Service (``<name>-worker-11``)."""
    return max(len(f"-{job}-{len(addresses) - 1}") for job, addresses in cluster.jobs().items())


def tfjob_manifest(config, *, image, command, name=None, namespace="default", max_restarts=0,
                   grace_seconds=DEFAULT_GRACE_SECONDS):
    """The TFJob for `config`'s cluster: one replica spec per job type.

    Args:
        config: a `Config` with a cluster section (addresses are ignored: in Kubernetes
            each pod is ``<name>-<type>-<i>.<namespace>.svc:2222``).
        image: the container image, which must have tfdist installed.
        command: the training command (argv list) for the tasks that run it.
        name: a DNS-1123 label short enough that every pod and Service name derived from
            it (``<name>-<type>-<i>``) is at most 63 characters; by default from the
            config file's name.
        namespace: a DNS-1123 label.
        max_restarts: 0 for ``restartPolicy: Never``; else ``ExitCode`` (exit codes 128 to
            255 — a preempted task's 143 after saving, a SIGKILL's 137 — are retried, 1 to
            127 fail the job at once) and this backoff limit (an int32).
        grace_seconds: each pod's ``terminationGracePeriodSeconds``: the time a task gets
            after SIGTERM to finish its step and save (`tfdist.callbacks.BackupAndRestore`).

    Returns:
        The manifest as a dict, ready for `yaml.safe_dump`.

    Raises:
        ClusterError: no cluster section, a name that is not a DNS-1123 label or too long
            for the names derived from it, an empty image, a backoff limit beyond int32.
    """
    if config.cluster is None:
        raise ClusterError("the config has no cluster: section to turn into a TFJob")
    name = _checked_name(config, name)
    _check_arguments(namespace, image, command, max_restarts, grace_seconds)
    replicas = _replica_specs(config, image, command, grace_seconds,
                              "ExitCode" if max_restarts > 0 else "Never")
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runPolicy": _run_policy(max_restarts), "tfReplicaSpecs": replicas}}


def _check_arguments(namespace, image, command, max_restarts, grace_seconds):
    """Raises `ClusterError` unless the TFJob's arguments besides its name are valid."""
    dns_name(namespace, "--namespace")
    check_image(image)
    check_argv(command)
    check_max_restarts(max_restarts, "backoffLimit")
    check_grace_seconds(grace_seconds)


def _run_policy(max_restarts):
    """The TFJob's runPolicy: running pods cleaned up, and a backoff limit if restarted."""
    run_policy = {"cleanPodPolicy": "Running"}
    if max_restarts > 0:
        run_policy["backoffLimit"] = int(max_restarts)
    return run_policy


def _checked_name(config, name):
    """The TFJob's name: `name` or one from the config file's, a DNS-1123 label short
    enough for the pod and Service names the operator derives from it."""
    limit = DNS_LABEL_LENGTH - longest_suffix(config.cluster)
    name = default_name(config.path or "tfjob", limit) if name is None else name
    dns_name(name, "--name")
    if len(name) > limit:
        raise ClusterError(f"--name must be at most {limit} characters for this cluster: the "
                           f"operator names pods and Services <name>-<type>-<index> (up to "
                           f"{DNS_LABEL_LENGTH - limit} more) and Kubernetes allows "
                           f"{DNS_LABEL_LENGTH}. Received: {name!r} ({len(name)} characters)")
    return name


def _replica_specs(config, image, command, grace_seconds, policy):
    """One TFJob replica spec per job type of `config`'s cluster."""
    strategy = config.strategy.name if config.strategy else None
    return {
        REPLICA_TYPES[job]: {
            "replicas": len(addresses),
            "restartPolicy": policy,
            "template": {"spec": {"terminationGracePeriodSeconds": grace_seconds, "containers": [{
                "name": "tensorflow",
                "image": image,
                "command": task_argv(strategy, job, command),
                "ports": [{"name": "tfjob-port", "containerPort": PORT}],
            }]}},
        }
        for job, addresses in config.cluster.jobs().items()
    }
