"""Kubeflow Trainer v2 manifests: a TrainingRuntime for tfdist and a TrainJob that uses it.

Trainer v2 (``trainer.kubeflow.org/v1alpha1``) ships no TensorFlow runtime, so tfdist
writes one per config: a JobSet template with one replicated job per TF task type
(one Indexed Job, ``replicas: 1``, one pod per task) and the headless Service JobSet
creates for stable pod DNS names. Every container runs ``tfdist exec CONFIG -- COMMAND``,
which derives the pod's TF_CONFIG (`tfdist.cluster.jobset`) and runs the task's role.

How the TrainJob reaches the pods (Trainer's ``pkg/runtime/framework/plugins/jobset``,
``plainml``): only the replicated job labelled ``trainer.kubeflow.org/trainjob-ancestor-step:
trainer`` takes the TrainJob's ``spec.trainer`` — its ``numNodes`` becomes that job's
parallelism and completions (else the runtime's ``mlPolicy.numNodes``), its image, command,
args and env go to the container named ``node``, and its ``replicas`` is forced to 1. tfdist
labels the ``worker`` job (the first job when there are no workers); the other jobs keep
the runtime's image and command. Both documents are generated with the same image,
command and worker count, so they agree.
"""

from tfdist.cluster.errors import ClusterError
from tfdist.cluster.jobset import PORT, downward_env, task_counts
from tfdist.cluster.manifest import (DEFAULT_GRACE_SECONDS, DNS_LABEL_LENGTH,
                                     PREEMPTED_EXIT_CODE, check_argv, check_grace_seconds,
                                     check_image, check_max_restarts, default_name, dns_name)
from tfdist.cluster.roles import runs_server

API_VERSION = "trainer.kubeflow.org/v1alpha1"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
CONTAINER = "node"  # the container Trainer v2 overrides from the TrainJob
POD_NAME_RANDOM = len("-abcde")  # JobSet's webhook allows for the 5 random characters
MAX_IMAGE_LENGTH = 500  # TrainJob's spec.trainer.image


def longest_pod_suffix(counts):
    """The longest ``-<type>-0-<index>-xxxxx`` JobSet's webhook appends to the JobSet name
    when it checks pod names (``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>-<random>``)."""
    return max(len(f"-{job}-0-{count - 1}") for job, count in counts.items()) + POD_NAME_RANDOM


def trainjob_manifests(config, *, image, command, config_path, name=None, namespace="default",
                       max_restarts=0, grace_seconds=DEFAULT_GRACE_SECONDS):
    """The TrainingRuntime and TrainJob for `config`'s cluster.

    Args:
        config: a `Config` whose cluster gives task counts (fixed addresses are refused:
            pods are at their DNS names).
        image: the container image; it must contain tfdist and the config file.
        command: the training command (argv list).
        config_path: the config file's path inside the image, as ``tfdist exec`` reads it.
        name: the TrainJob's name, which is also the JobSet's and the subdomain's: a
            DNS-1035 label short enough for JobSet's pod names; by default from the config
            file's name. The runtime is ``tfdist-<name>``.
        namespace: a DNS-1123 label; the runtime and the TrainJob live in it.
        max_restarts: JobSet's ``failurePolicy.maxRestarts``: how often the whole JobSet is
            recreated after a task fails (pods never restart alone: a collective group
            cannot take a newcomer). 0: the first failure fails the TrainJob. A preempted
            task — evicted by Kubernetes (`DisruptionTarget`), or exiting with 143 after
            saving at the step every worker agreed on — restarts the JobSet without
            counting (`RestartJobSetAndIgnoreMaxRestarts`).
        grace_seconds: each pod's ``terminationGracePeriodSeconds`` (time to save after
            SIGTERM).

    Returns:
        ``[training_runtime, train_job]``, dicts ready for `yaml.safe_dump_all`.

    Raises:
        ClusterError: no cluster or fixed addresses, a bad or too long name, a bad
            namespace or image, `max_restarts` beyond int32.
    """
    counts = task_counts(config)
    name = _checked_name(config, name, counts)
    _check_arguments(namespace, image, max_restarts, grace_seconds)
    argv = _exec_argv(config_path, command)
    trainer_job = "worker" if "worker" in counts else next(iter(counts))
    runtime = training_runtime(config, counts, image=image, argv=argv, name=f"tfdist-{name}",
                               namespace=namespace, trainer_job=trainer_job,
                               max_restarts=max_restarts, grace_seconds=grace_seconds)
    return [runtime, _train_job(name, namespace, runtime, image, argv, counts[trainer_job])]


def _check_arguments(namespace, image, max_restarts, grace_seconds):
    """Raises `ClusterError` unless the namespace, image and limits are valid."""
    dns_name(namespace, "--namespace")
    check_image(image, MAX_IMAGE_LENGTH)
    check_max_restarts(max_restarts, "failurePolicy.maxRestarts")
    check_grace_seconds(grace_seconds)


def _exec_argv(config_path, command):
    """Every container's argv: ``tfdist exec CONFIG -- COMMAND``, each argument checked."""
    return ["tfdist", "exec", *check_argv([str(config_path)], "the config path"), "--",
            *check_argv(command)]


def _train_job(name, namespace, runtime, image, argv, nodes):
    """The TrainJob that runs `runtime` with `nodes` trainer nodes."""
    return {"apiVersion": API_VERSION, "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                    "name": runtime["metadata"]["name"]},
                     "trainer": {"image": image, "command": argv, "numNodes": nodes}}}


def training_runtime(config, counts, *, image, argv, name, namespace, trainer_job,
                     max_restarts, grace_seconds=DEFAULT_GRACE_SECONDS):
    """The TrainingRuntime: a JobSet template with one replicated job per task type."""
    strategy = config.strategy.name if config.strategy else None
    scripts = [job for job in counts if not runs_server(strategy, job)]
    return {
        "apiVersion": API_VERSION, "kind": "TrainingRuntime",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"trainer.kubeflow.org/framework": "tensorflow"}},
        "spec": {
            "mlPolicy": {"numNodes": counts[trainer_job]},
            "template": {"spec": {
                "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                # Done when every task running the script is; TF servers are then stopped.
                "successPolicy": {"operator": "All", "targetReplicatedJobs": scripts},
                "failurePolicy": {"maxRestarts": int(max_restarts), "rules": [{
                    "name": "preempted", "action": "RestartJobSetAndIgnoreMaxRestarts",
                    "onJobFailureReasons": ["PodFailurePolicy"]}]},
                "replicatedJobs": [
                    replicated_job(job, count, image=image, argv=argv, trainer=job == trainer_job,
                                   grace_seconds=grace_seconds)
                    for job, count in counts.items()],
            }},
        },
    }


def replicated_job(job, count, *, image, argv, trainer=False,
                   grace_seconds=DEFAULT_GRACE_SECONDS):
    """One task type: an Indexed Job of `count` pods that fails at its first pod failure —
    with reason PodFailurePolicy (a preemption: JobSet restarts without counting it) when
    the pod was evicted or exited with tfdist's preemption code."""
    template = {"spec": {
        "parallelism": count, "completions": count, "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {
                "containerName": CONTAINER, "operator": "In", "values": [PREEMPTED_EXIT_CODE]}},
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget",
                                                       "status": "True"}]}]},
        "template": {"spec": {"restartPolicy": "Never",
                              "terminationGracePeriodSeconds": grace_seconds, "containers": [{
            "name": CONTAINER, "image": image, "command": list(argv), "env": downward_env(),
            "ports": [{"name": "tf-server", "containerPort": PORT}],
        }]}},
    }}
    if trainer:
        template = {"metadata": {"labels": {ANCESTOR_LABEL: "trainer"}}, **template}
    return {"name": job, "replicas": 1, "template": template}


def _checked_name(config, name, counts):
    """The TrainJob name, checked against JobSet's limits for the names it derives."""
    limit = DNS_LABEL_LENGTH - longest_pod_suffix(counts)
    name = default_name(config.path or "trainjob", limit) if name is None else name
    dns_name(name, "--name")
    if len(name) > limit:
        raise ClusterError(f"--name must be at most {limit} characters for this cluster: JobSet "
                           f"names pods <name>-<type>-0-<index>-<5 random characters> (up to "
                           f"{DNS_LABEL_LENGTH - limit} more) and Kubernetes allows "
                           f"{DNS_LABEL_LENGTH}. Received: {name!r} ({len(name)} characters)")
    return name
