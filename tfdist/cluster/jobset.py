"""A JobSet pod's task: its TF_CONFIG from what JobSet and Kubernetes give the pod.

Kubeflow Trainer v2 runs a TrainJob as a JobSet (``jobset.x-k8s.io/v1alpha2``); tfdist's
runtime (`tfdist.cluster.trainjob`) has one replicated job per TF task type, named like
it (``chief``, ``worker``, ``ps``, ``evaluator``), each one Indexed Job (``replicas: 1``)
with one pod per task (``parallelism = completions =`` the task count).

What a pod knows, as JobSet's source (``api/jobset/v1alpha2/jobset_types.go``,
``pkg/controllers/jobset_controller.go``) and Kubernetes define it:

- labels and annotations JobSet puts on every pod: ``jobset.sigs.k8s.io/jobset-name``,
  ``jobset.sigs.k8s.io/replicatedjob-name``, ``jobset.sigs.k8s.io/job-index``; tfdist's
  pod template exposes them through the downward API as JOBSET_NAME,
  REPLICATED_JOB_NAME and JOB_INDEX, and ``metadata.namespace`` as POD_NAMESPACE
  (`downward_env`). JobSet itself sets no environment variables.
- JOB_COMPLETION_INDEX: set by Kubernetes in every container of an Indexed Job's pod
  (from the annotation ``batch.kubernetes.io/job-completion-index``).
- stable DNS names with ``network.enableDNSHostnames``: the pod's host name is
  ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>`` (``placement.GenPodName``) and its
  subdomain the headless Service JobSet creates, named ``network.subdomain`` or, by
  default, the JobSet name (Trainer v2: the TrainJob name). JOBSET_SUBDOMAIN overrides
  that default for a JobSet that sets ``network.subdomain``.

Every task listens on port 2222, as under the Kubeflow TFJob.
"""

from tfdist.cluster.errors import ClusterError
from tfdist.cluster.manifest import DNS_LABEL_LENGTH, dns_name
from tfdist.cluster.tf_config import MAX_NUMBER_CHARS, environ_integer, environ_text
from tfdist.limits import MAX_TASKS

PORT = 2222
JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_NAME_KEY = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_KEY = "jobset.sigs.k8s.io/job-index"
# Environment variable -> the pod field the downward API reads it from.
DOWNWARD_FIELDS = {
    "JOBSET_NAME": f"metadata.labels['{JOBSET_NAME_KEY}']",
    "REPLICATED_JOB_NAME": f"metadata.labels['{REPLICATED_JOB_NAME_KEY}']",
    "JOB_INDEX": f"metadata.labels['{JOB_INDEX_KEY}']",
    "POD_NAMESPACE": "metadata.namespace",
}


def downward_env():
    """The container ``env`` entries that give a pod what `scheduled_task` reads."""
    return [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for name, path in DOWNWARD_FIELDS.items()]


def host_name(jobset, replicated_job, pod_index, job_index=0):
    """A pod's stable host name, ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>``."""
    return f"{jobset}-{replicated_job}-{job_index}-{pod_index}"


def task_address(jobset, job, index, *, subdomain=None, namespace=None):
    """``host:port`` of task `job`:`index`: its pod's DNS name (with ``.<namespace>.svc``
    when the namespace is known) and `PORT`."""
    fqdn = f"{host_name(jobset, job, index)}.{subdomain or jobset}"
    return f"{fqdn}.{namespace}.svc:{PORT}" if namespace else f"{fqdn}:{PORT}"


def scheduled_task(config, environ):
    """(cluster, task type, index) of this JobSet pod, or None outside one.

    Args:
        config: the `Config` whose cluster gives the task counts; its job names are the
            replicated jobs' names.
        environ: the environment (JOBSET_NAME marks a JobSet pod).

    Returns:
        ``({job: ["host:port", ...]}, job, index)``, every address a pod's DNS name.

    Raises:
        ClusterError: a missing or malformed variable, a replicated job or index the
            config's cluster does not have, or a cluster given as fixed addresses.
    """
    if "JOBSET_NAME" not in environ:
        return None
    jobset = dns_name(_required(environ, "JOBSET_NAME"), "JOBSET_NAME")
    jobs = task_counts(config)
    job = _required(environ, "REPLICATED_JOB_NAME")
    if job not in jobs:
        raise ClusterError(f"this pod's replicated job is not a task type of {_name(config)}'s "
                           f"cluster {sorted(jobs)}. Received: REPLICATED_JOB_NAME={job!r}")
    if "JOB_INDEX" in environ and environ_integer(environ, "JOB_INDEX", MAX_TASKS) != 0:
        raise ClusterError("tfdist runs one Job per task type (replicas: 1), with one pod per "
                           f"task. Received: JOB_INDEX={environ['JOB_INDEX']!r}")
    _required(environ, "JOB_COMPLETION_INDEX", MAX_NUMBER_CHARS)
    index = environ_integer(environ, "JOB_COMPLETION_INDEX", MAX_TASKS)
    if index >= jobs[job]:
        raise ClusterError(f"{_name(config)} has {jobs[job]} {job} task(s), so this pod's index "
                           f"is out of range. Received: JOB_COMPLETION_INDEX={index}")
    place = {key: dns_name(text, name) if (text := environ_text(environ, name, DNS_LABEL_LENGTH))
             else None for key, name in (("subdomain", "JOBSET_SUBDOMAIN"),
                                         ("namespace", "POD_NAMESPACE"))}
    for name, count in jobs.items():
        _check_host_name(jobset, name, count)
    cluster = {name: [task_address(jobset, name, i, **place) for i in range(count)]
               for name, count in jobs.items()}
    return cluster, job, index


def _check_host_name(jobset, job, count):
    """The longest host name of `job`'s pods must be a DNS label (JobSet's webhook
    refuses longer ones, so a longer JOBSET_NAME is not JobSet's)."""
    host = host_name(jobset, job, count - 1)
    if len(host) > DNS_LABEL_LENGTH:
        raise ClusterError(f"the host name of pod {job}:{count - 1}, {host!r}, is longer than "
                           f"{DNS_LABEL_LENGTH} characters, so JOBSET_NAME is too long for a "
                           f"JobSet. Received: JOBSET_NAME={jobset!r}")


def task_counts(config):
    """{job: task count} of `config`'s cluster, which must be given by counts.

    Raises:
        ClusterError: no cluster, or one with fixed ``host:port`` addresses.
    """
    cluster = config.cluster
    if cluster is None or getattr(cluster, "scheduler", None) is not None:
        shown = cluster if cluster is None else cluster.scheduler  # e.g. "slurm"
        raise ClusterError(f"a JobSet (Kubeflow Trainer v2) needs task counts in the cluster: "
                           f"section of {_name(config)}, e.g. cluster: {{chief: 1, worker: 2}}. "
                           f"Received: cluster: {shown}")
    for job, addresses in cluster.jobs().items():
        fixed = [str(a) for a in addresses if a.port is not None]
        if fixed:
            raise ClusterError(f"{_name(config)}: cluster.{job} lists fixed addresses, but in a "
                               "JobSet every task is at its pod's DNS name; give task "
                               f"counts for Kubernetes ({job}: {len(addresses)}). "
                               f"Received: {fixed}")
    return {job: len(addresses) for job, addresses in cluster.jobs().items()}


def _required(environ, name, max_chars=DNS_LABEL_LENGTH):
    value = environ_text(environ, name, max_chars)
    if not value:
        raise ClusterError(f"{name} is missing or empty in this JobSet pod (JOBSET_NAME is set); "
                           "tfdist's pod template sets it (see `tfdist manifest --format "
                           f"trainjob`). Received: {name}={value!r}")
    return value


def _name(config):
    return config.path or "the config"
