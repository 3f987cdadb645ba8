"""Kubeflow Trainer v2: the TrainingRuntime and TrainJob, checked against the real CRD
schemas and JobSet's naming rules, and each pod's TF_CONFIG (derived by `tfdist exec` from
what JobSet and Kubernetes give the pod) equal to what `tfdist tf-config` prints."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from kubernetes_schemas import assert_valid, embedded_jobset, errors
from tfdist.cli import main
from tfdist.cluster.errors import ClusterError
from tfdist.cluster.jobset import scheduled_task
from tfdist.cluster.tf_config import check_matches, tf_config
from tfdist.config import load_config

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
MWMS = "cluster: {chief: 1, worker: 2}\nstrategy: multi_worker_mirrored\n"
PS = "cluster: {chief: 1, worker: 2, ps: 2}\nstrategy: parameter_server\n"
CLUSTERS = [MWMS, PS,
            "cluster: {worker: 3, evaluator: 1}\nstrategy: multi_worker_mirrored\n",
            "cluster: {chief: 1, worker: 12, ps: 1, evaluator: 1}\nstrategy: parameter_server\n"]
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
PREEMPTED = {"name": "preempted", "action": "RestartJobSetAndIgnoreMaxRestarts",
             "onJobFailureReasons": ["PodFailurePolicy"]}


def render(capsys, path, *options, command=("python", "train.py")):
    """(TrainingRuntime, TrainJob) that `tfdist manifest --format trainjob` prints."""
    assert main(["manifest", path, "--format", "trainjob", *options, "--", *command]) == 0
    runtime, job = yaml.safe_load_all(capsys.readouterr().out)
    return runtime, job


def effective_jobs(runtime, job):
    """The replicated jobs as Trainer v2 builds the JobSet: the one labelled as the
    trainer's ancestor takes the TrainJob's numNodes, image and command (container 'node')."""
    built = []
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        rjob = json.loads(json.dumps(rjob))
        if rjob["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR) == "trainer":
            trainer, spec = job["spec"]["trainer"], rjob["template"]["spec"]
            spec["parallelism"] = spec["completions"] = trainer["numNodes"]
            for container in spec["template"]["spec"]["containers"]:
                if container["name"] == "node":
                    container.update(image=trainer["image"], command=trainer["command"])
        built.append(rjob)
    return built


def pod_environments(runtime, job):
    """(replicated job, pod index, environment) of every pod: the container's downward-API
    variables resolved against the labels JobSet puts on a pod, plus JOB_COMPLETION_INDEX,
    which Kubernetes sets for an Indexed Job."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    for rjob in effective_jobs(runtime, job):
        spec = rjob["template"]["spec"]
        assert spec["completionMode"] == "Indexed" and rjob["replicas"] == 1
        for index in range(spec["completions"]):
            fields = {"metadata.namespace": namespace,
                      "metadata.labels['jobset.sigs.k8s.io/jobset-name']": name,
                      "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']": rjob["name"],
                      "metadata.labels['jobset.sigs.k8s.io/job-index']": "0"}
            (container,) = spec["template"]["spec"]["containers"]
            env = {e["name"]: fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
                   for e in container["env"]}
            yield rjob["name"], index, {**env, "JOB_COMPLETION_INDEX": str(index)}


def dns_addresses(runtime, job):
    """{job: [address]}: JobSet's pod DNS names <jobset>-<rjob>-<jobIndex>-<podIndex>.
    <subdomain (default: the JobSet name)>.<namespace>.svc and the container port."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    assert "subdomain" not in runtime["spec"]["template"]["spec"]["network"]
    cluster = {}
    for rjob in effective_jobs(runtime, job):
        spec = rjob["template"]["spec"]
        port = spec["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        cluster[rjob["name"]] = [f"{name}-{rjob['name']}-0-{i}.{name}.{namespace}.svc:{port}"
                                 for i in range(spec["completions"])]
    return cluster


def jobset_name_errors(runtime, name):
    """JobSet's webhook rules for the names it derives (pkg/webhooks/jobset_webhook.go):
    Job names <jobset>-<rjob>-<last job index> and, for Indexed Jobs, pod names
    <jobset>-<rjob>-<jobIndex>-<last pod index>-<5 random characters> are DNS-1035 labels."""
    found = []
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        longest_job = f"{name}-{rjob['name']}-{rjob['replicas'] - 1}"
        longest_pod = f"{longest_job}-{spec['completions'] - 1}-abcde"
        found += [n for n in (name, longest_job, longest_pod)
                  if len(n) > 63 or not DNS_1035.fullmatch(n)]
    return found


def trainer_webhook_errors(runtime):
    """Trainer v2's TrainingRuntime webhook (pkg/webhooks/trainingruntime_webhook.go): a job
    labelled as the trainer's ancestor has replicas 1 and a container named 'node'."""
    found = []
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        if rjob["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR) == "trainer":
            names = [c["name"] for c in rjob["template"]["spec"]["template"]["spec"]["containers"]]
            found += [rjob["name"]] if rjob["replicas"] != 1 or "node" not in names else []
    return found


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("restarts", ["0", "3"])
def test_documents_validate_against_the_crds(write_config, capsys, cluster, restarts):
    path = write_config(cluster)
    runtime, job = render(capsys, path, "--image", "ghcr.io/team/unet:1.0", "--namespace",
                          "team-a", "--max-restarts", restarts)
    assert_valid(runtime)
    assert_valid(job)
    # The runtime's template is a JobSet spec: the JobSet CRD's own schema accepts it too.
    assert_valid(embedded_jobset(runtime, job["metadata"]["name"]))
    assert jobset_name_errors(runtime, job["metadata"]["name"]) == []
    assert trainer_webhook_errors(runtime) == []
    labelled = [r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                if r["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR)]
    assert len(labelled) == 1  # exactly one job takes the TrainJob's trainer settings


def test_missing_schemas_fail_saying_where_they_were_looked_for(monkeypatch, tmp_path):
    import kubernetes_schemas

    monkeypatch.setenv("TFDIST_K8S_SCHEMAS", str(tmp_path / "nowhere"))
    with pytest.raises(pytest.fail.Exception, match="looked in: .*nowhere"):
        kubernetes_schemas.schema_dir()


@pytest.mark.parametrize("document,path,misspelt", [
    ("runtime", ["spec", "template", "spec", "network"], "enableDNSHostname"),
    ("runtime", ["spec", "template", "spec", "replicatedJobs", 0, "template", "spec"],
     "completionsMode"),
    ("runtime", ["spec", "template", "spec", "replicatedJobs", 1, "template", "spec",
                 "template", "spec", "containers", 0], "comand"),
    ("job", ["spec", "trainer"], "numNode"),
    ("job", ["spec"], "runtimeref"),
])
def test_a_misspelt_field_fails_validation(write_config, capsys, document, path, misspelt):
    runtime, job = render(capsys, write_config(MWMS), "--image", "i")
    target = {"runtime": runtime, "job": job}[document]
    node = target
    for key in path:
        node = node[key]
    node[misspelt] = 1
    assert any(repr(misspelt) in problem for problem in errors(target)), errors(target)
    if document == "runtime":
        assert errors(embedded_jobset(runtime, "x"))  # the JobSet schema is strict too


def test_runtime_shape(write_config, capsys, tmp_path, monkeypatch):
    write_config(PS, name="PS_Job.yaml")
    monkeypatch.chdir(tmp_path)  # the path given is the path inside the image
    runtime, job = render(capsys, "PS_Job.yaml", "--image", "img:2", "--max-restarts", "2",
                          command=("python", "train.py", "--epochs", "1"))
    assert (runtime["kind"], job["kind"]) == ("TrainingRuntime", "TrainJob")
    assert job["metadata"] == {"name": "ps-job", "namespace": "default"}
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                         "kind": "TrainingRuntime", "name": "tfdist-ps-job"}
    assert runtime["metadata"]["name"] == "tfdist-ps-job"
    spec = runtime["spec"]["template"]["spec"]
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert spec["failurePolicy"] == {"maxRestarts": 2, "rules": [PREEMPTED]}
    # Under parameter_server only the chief runs the script; workers and ps are TF servers.
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    counts = {r["name"]: r["template"]["spec"]["completions"] for r in spec["replicatedJobs"]}
    assert counts == {"chief": 1, "worker": 2, "ps": 2}
    command = ["tfdist", "exec", "PS_Job.yaml", "--", "python", "train.py", "--epochs", "1"]
    for rjob in spec["replicatedJobs"]:
        template = rjob["template"]["spec"]
        assert template["parallelism"] == template["completions"]
        assert template["backoffLimit"] == 0
        assert template["template"]["spec"]["restartPolicy"] == "Never"
        # a preemption (an eviction, or 143 after saving) fails the Job by its pod failure
        # policy, which JobSet's rule restarts without counting; 60 s to save after SIGTERM
        assert template["podFailurePolicy"]["rules"] == [
            {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In",
                                                  "values": [143]}},
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget",
                                                       "status": "True"}]}]
        assert template["template"]["spec"]["terminationGracePeriodSeconds"] == 60
        (container,) = template["template"]["spec"]["containers"]
        assert container["name"] == "node" and container["image"] == "img:2"
        assert container["command"] == command
        labels = rjob["template"].get("metadata", {}).get("labels", {})
        assert labels == ({ANCESTOR: "trainer"} if rjob["name"] == "worker" else {})
    assert job["spec"]["trainer"] == {"image": "img:2", "command": command, "numNodes": 2}
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2}


def test_no_restarts_by_default_and_tfjob_stays_the_default(write_config, capsys):
    path = write_config(MWMS)
    runtime, _ = render(capsys, path, "--image", "i")
    spec = runtime["spec"]["template"]["spec"]
    assert spec["failurePolicy"] == {"maxRestarts": 0, "rules": [PREEMPTED]}
    assert spec["successPolicy"]["targetReplicatedJobs"] == ["chief", "worker"]
    assert main(["manifest", path, "--image", "i", "--", "python", "train.py"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "TFJob"


@pytest.mark.parametrize("cluster", [MWMS, PS])
def test_each_pod_gets_the_tf_config_tf_config_prints(write_config, capsys, cluster):
    path = write_config(cluster)
    runtime, job = render(capsys, path, "--image", "i", "--name", "unet", "--namespace", "ml")
    fixed = write_config(yaml.safe_dump({"cluster": dns_addresses(runtime, job),
                                         "strategy": load_config(path).strategy.name}),
                         name="fixed.yaml")
    config, tasks = load_config(path), []
    for rjob, index, environ in pod_environments(runtime, job):
        cluster_dict, task_type, task_index = scheduled_task(config, environ)
        derived = tf_config(cluster_dict, task_type, task_index)
        assert main(["tf-config", fixed, "--task", f"{rjob}:{index}"]) == 0
        assert derived == json.loads(capsys.readouterr().out)
        check_matches(config.cluster, json.dumps(derived), path)  # the script's own check
        tasks.append((task_type, task_index))
    assert tasks == config.cluster.tasks()


def exec_environment(environ):
    """The current environment without TF_CONFIG or SLURM variables, plus `environ`."""
    base = {k: v for k, v in os.environ.items()
            if k != "TF_CONFIG" and not k.startswith(("SLURM_", "JOBSET_", "JOB_"))}
    return {**base, **environ}


@pytest.mark.multiprocess
@pytest.mark.parametrize("cluster", [MWMS, PS])
def test_tfdist_exec_in_a_simulated_pod(write_config, capsys, cluster):
    """`tfdist exec` (a real subprocess) sets the TF_CONFIG that `tfdist tf-config` prints;
    the tasks that run the user's command print it (TF server tasks would not return)."""
    path = write_config(cluster)
    runtime, job = render(capsys, path, "--image", "i", "--name", "unet", "--namespace", "ml")
    fixed = write_config(yaml.safe_dump({"cluster": dns_addresses(runtime, job),
                                         "strategy": load_config(path).strategy.name}),
                         name="fixed.yaml")
    tfdist = os.path.join(os.path.dirname(sys.executable), "tfdist")
    show = [sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"]
    targets = runtime["spec"]["template"]["spec"]["successPolicy"]["targetReplicatedJobs"]
    ran = 0
    for rjob, index, environ in pod_environments(runtime, job):
        if rjob not in targets:
            continue
        done = subprocess.run([tfdist, "exec", path, "--", *show], env=exec_environment(environ),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert main(["tf-config", fixed, "--task", f"{rjob}:{index}"]) == 0
        assert json.loads(done.stdout) == json.loads(capsys.readouterr().out)
        ran += 1
    assert ran == (3 if "multi_worker" in cluster else 1)


def pod(job="worker", index="0", **extra):
    return {"JOBSET_NAME": "unet", "REPLICATED_JOB_NAME": job, "JOB_INDEX": "0",
            "JOB_COMPLETION_INDEX": index, "POD_NAMESPACE": "ml", **extra}


def test_outside_a_jobset_pod_there_is_no_task(write_config):
    assert scheduled_task(load_config(write_config(MWMS)), {"SLURM_PROCID": "0"}) is None


def test_subdomain_and_namespace_shape_the_addresses(write_config):
    config = load_config(write_config(MWMS))
    cluster, _, _ = scheduled_task(config, pod(JOBSET_SUBDOMAIN="svc-x"))
    assert cluster["worker"][1] == "unet-worker-0-1.svc-x.ml.svc:2222"
    cluster, _, _ = scheduled_task(config, {k: v for k, v in pod().items()
                                            if k != "POD_NAMESPACE"})
    assert cluster["chief"] == ["unet-chief-0-0.unet:2222"]


@pytest.mark.parametrize("environ,message", [
    (pod(job="launcher"), "REPLICATED_JOB_NAME='launcher'"),
    (pod(job="ps"), "REPLICATED_JOB_NAME='ps'"),
    (pod(index="2"), "JOB_COMPLETION_INDEX=2"),
    (pod(index="-1"), "JOB_COMPLETION_INDEX='-1'"),
    (pod(index=""), "JOB_COMPLETION_INDEX=''"),
    (pod(JOB_INDEX="1"), "JOB_INDEX='1'"),
    ({k: v for k, v in pod().items() if k != "REPLICATED_JOB_NAME"}, "REPLICATED_JOB_NAME=None"),
    ({k: v for k, v in pod().items() if k != "JOB_COMPLETION_INDEX"},
     "JOB_COMPLETION_INDEX=None"),
    (pod(JOBSET_NAME=""), "JOBSET_NAME=''"),
    (pod(JOBSET_NAME="a.b\nc"), "JOBSET_NAME must be a DNS-1123 label"),
    (pod(POD_NAMESPACE="Team_A"), "Received: 'Team_A'"),
])
def test_bad_pod_environment(write_config, environ, message):
    with pytest.raises(ClusterError) as error:
        scheduled_task(load_config(write_config(MWMS)), environ)
    assert message in str(error.value)


def test_fixed_addresses_are_refused_in_a_pod_and_in_the_manifest(write_config, capsys):
    path = write_config("cluster: {worker: [a:2222, b:2222]}\nstrategy: multi_worker_mirrored\n")
    with pytest.raises(ClusterError, match=r"give task counts for Kubernetes \(worker: 2\)"):
        scheduled_task(load_config(path), pod())
    assert main(["manifest", path, "--format", "trainjob", "--image", "i", "--", "x"]) == 2
    assert "Received: ['a:2222', 'b:2222']" in capsys.readouterr().err


def test_name_length_follows_jobsets_pod_names(write_config, capsys):
    path = write_config("cluster: {chief: 1, worker: 10}\nstrategy: multi_worker_mirrored\n")
    limit = 63 - len("-worker-0-9-abcde")  # the longest pod name JobSet's webhook checks
    runtime, job = render(capsys, path, "--image", "i", "--name", "a" * limit)
    assert jobset_name_errors(runtime, job["metadata"]["name"]) == []
    assert main(["manifest", path, "--format", "trainjob", "--image", "i",
                 "--name", "a" * (limit + 1), "--", "x"]) == 2
    err = capsys.readouterr().err
    assert f"at most {limit} characters" in err and f"({limit + 1} characters)" in err
    runtime, job = render(capsys, write_config(MWMS, name="x" * 80 + ".yaml"), "--image", "i")
    assert len(job["metadata"]["name"]) <= limit
    assert jobset_name_errors(runtime, job["metadata"]["name"]) == []


@pytest.mark.parametrize("argv,message", [
    (["--image", "i", "--name", "9lives"], "--name must be a DNS-1123 label"),
    (["--image", "i", "--namespace", "Team_A"], "Received: 'Team_A'"),
    (["--image", "two words"], "Received: 'two words'"),
    (["--image", "r/" + "x" * 499], "at most 500 characters"),
    (["--image", "i", "--max-restarts", "2147483648"], "Received: 2147483648"),
])
def test_bad_trainjob_arguments(write_config, capsys, argv, message):
    path = write_config(MWMS)
    assert main(["manifest", path, "--format", "trainjob", *argv, "--", "python"]) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_format_is_a_usage_error(write_config, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["manifest", write_config(MWMS), "--format", "pytorchjob", "--image", "i", "--", "x"])
    assert exit_.value.code == 2
    assert "invalid choice: 'pytorchjob'" in capsys.readouterr().err


def test_a_trainjob_needs_task_counts(write_config, capsys):
    path = write_config("strategy: mirrored\n")
    assert main(["manifest", path, "--format", "trainjob", "--image", "i", "--", "x"]) == 2
    assert "needs task counts" in capsys.readouterr().err
