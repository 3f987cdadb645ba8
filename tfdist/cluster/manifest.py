"""A Kubeflow TFJob (kubeflow.org/v1) for the cluster of a config file."""

import re

from tfdist.cluster.errors import ClusterError
from tfdist.cluster.roles import task_argv

REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
PORT = 2222
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def dns_name(text, what):
    """Checks a Kubernetes name (DNS-1123 label); raises `ClusterError` with the rule."""
    if not _DNS_LABEL.match(text):
        raise ClusterError(f"{what} must be a DNS-1123 label: lowercase letters, digits and '-', "
                         f"starting with a letter, at most 63 characters. Received: {text!r}")
    return text


def default_name(path):
    """A TFJob name from a config file name: 'configs/MWMS_2.yaml' -> 'mwms-2'."""
    stem = re.sub(r"\.ya?ml$", "", str(path).rsplit("/", 1)[-1]).lower()
    stem = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")
    return (stem if stem[:1].isalpha() else f"tfdist-{stem}".rstrip("-"))[:63].rstrip("-")


def tfjob_manifest(config, *, image, command, name, namespace="default", max_restarts=0):
    """The TFJob for `config`'s cluster: one replica spec per job type.

    Args:
        config: a `Config` with a cluster section (addresses are ignored: in Kubernetes
            each pod is ``<name>-<type>-<i>.<namespace>.svc:2222``).
        image: the container image, which must have tfdist installed.
        command: the training command (argv list) for the tasks that run it.
        name, namespace: DNS-1123 labels.
        max_restarts: 0 for ``restartPolicy: Never``; else ``OnFailure`` and this backoff limit.

    Returns:
        The manifest as a dict, ready for `yaml.safe_dump`.

    Raises:
        ClusterError: no cluster section, or a name that is not a DNS-1123 label.
    """
    if config.cluster is None:
        raise ClusterError("the config has no cluster: section to turn into a TFJob")
    dns_name(name, "--name")
    dns_name(namespace, "--namespace")
    strategy = config.strategy.name if config.strategy else None
    policy = "OnFailure" if max_restarts > 0 else "Never"
    replicas = {
        REPLICA_TYPES[job]: {
            "replicas": len(addresses),
            "restartPolicy": policy,
            "template": {"spec": {"containers": [{
                "name": "tensorflow",
                "image": image,
                "command": task_argv(strategy, job, command),
                "ports": [{"name": "tfjob-port", "containerPort": PORT}],
            }]}},
        }
        for job, addresses in config.cluster.jobs().items()
    }
    run_policy = {"cleanPodPolicy": "Running"}
    if max_restarts > 0:
        run_policy["backoffLimit"] = int(max_restarts)
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runPolicy": run_policy, "tfReplicaSpecs": replicas}}
