"""The Kubeflow TFJob: each pod's operator-made TF_CONFIG equals `tfdist tf-config`'s."""

import json

import pytest
import yaml

from kubernetes_schemas import assert_valid, errors
from tfdist.cli import main

JOB_TYPES = {"Chief": "chief", "Worker": "worker", "PS": "ps", "Evaluator": "evaluator"}


def operator_tf_config(manifest, replica_type, index):
    """What the Kubeflow training operator puts in TF_CONFIG for one pod (independent model).

    Every replica type is listed; addresses are <name>-<type>-<i>.<namespace>.svc:<port>.
    """
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    cluster = {}
    for rtype, spec in manifest["spec"]["tfReplicaSpecs"].items():
        port = spec["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        job = JOB_TYPES[rtype]
        cluster[job] = [f"{name}-{job}-{i}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    return {"cluster": cluster, "task": {"type": JOB_TYPES[replica_type], "index": index},
            "environment": "cloud"}


def render(capsys, *argv):
    assert main(list(argv)) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_manifest_shape(write_config, capsys):
    path = write_config("cluster: {chief: 1, worker: 2, ps: 1, evaluator: 1}\n"
                        "strategy: parameter_server\n", name="PS_job.yaml")
    manifest = render(capsys, "manifest", path, "--image", "repo/img:1", "--namespace", "ml",
                      "--", "python", "train.py", "--config", "job.yaml")
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "TFJob"
    assert manifest["metadata"] == {"name": "ps-job", "namespace": "ml"}
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {
        "Chief": 1, "Worker": 2, "PS": 1, "Evaluator": 1}
    for rtype, spec in specs.items():
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == "tensorflow" and container["image"] == "repo/img:1"
        assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
        assert spec["restartPolicy"] == "Never"
        expected = (["python", "-m", "tfdist.launch.server"] if rtype in ("Worker", "PS")
                    else ["python", "train.py", "--config", "job.yaml"])
        assert container["command"] == expected, rtype


def test_restarts_asked_for_retry_signals_and_fail_errors_at_once(write_config, capsys):
    """ExitCode: 128-255 (143 after a preemption's save, 137 from a SIGKILL) are retried,
    1-127 (a Python error, a refused config) fail the job; each pod gets 90 s to save."""
    path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    manifest = render(capsys, "manifest", path, "--image", "i", "--name", "job",
                      "--max-restarts", "3", "--grace-seconds", "90", "--", "python", "train.py")
    assert manifest["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] == "ExitCode"
    pod = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 90
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == 3
    container = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "train.py"]


@pytest.mark.parametrize("cluster", [
    "{worker: 2}", "{chief: 1, worker: 3, evaluator: 1}", "{chief: 1, worker: 2, ps: 2}"])
def test_operator_tf_config_matches_tfdist_tf_config(write_config, capsys, cluster):
    strategy = "parameter_server" if "ps" in cluster else "multi_worker_mirrored"
    path = write_config(f"cluster: {cluster}\nstrategy: {strategy}\n")
    name, namespace = "unet", "team-a"
    manifest = render(capsys, "manifest", path, "--image", "i", "--name", name,
                      "--namespace", namespace, "--", "python", "train.py")
    # The same cluster, with the addresses the operator gives the pods.
    jobs = {JOB_TYPES[r]: s["replicas"] for r, s in manifest["spec"]["tfReplicaSpecs"].items()}
    listed = {job: [f"{name}-{job}-{i}.{namespace}.svc:2222" for i in range(n)]
              for job, n in jobs.items()}
    fixed = write_config(yaml.safe_dump({"cluster": listed, "strategy": strategy}), name="fixed.yaml")
    for rtype, spec in manifest["spec"]["tfReplicaSpecs"].items():
        for index in range(spec["replicas"]):
            assert main(["tf-config", fixed, "--task", f"{JOB_TYPES[rtype]}:{index}"]) == 0
            ours = json.loads(capsys.readouterr().out)
            assert ours == operator_tf_config(manifest, rtype, index)


@pytest.mark.parametrize("argv,message", [
    (["--image", "i", "--name", "Bad_Name", "--", "python"], "DNS-1123"),
    (["--image", "i", "--namespace", "Team_A", "--", "python"], "DNS-1123"),
    (["--image", "i"], "no command given"),
])
def test_bad_manifest_arguments(write_config, capsys, argv, message):
    path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    assert main(["manifest", path, *argv]) == 2
    assert message in capsys.readouterr().err


def test_manifest_needs_a_cluster(write_config, capsys):
    assert main(["manifest", write_config("strategy: mirrored\n"), "--image", "i", "--", "x"]) == 2
    assert "no cluster" in capsys.readouterr().err


@pytest.mark.parametrize("cluster,strategy", [
    ("{worker: 2}", "multi_worker_mirrored"),
    ("{chief: 1, worker: 3, evaluator: 1}", "multi_worker_mirrored"),
    ("{chief: 1, worker: 2, ps: 2}", "parameter_server"),
    ("{chief: 1, worker: 12, ps: 1, evaluator: 1}", "parameter_server"),
])
@pytest.mark.parametrize("restarts", ["0", "4"])
def test_tfjob_validates_against_the_crd(write_config, capsys, cluster, strategy, restarts):
    path = write_config(f"cluster: {cluster}\nstrategy: {strategy}\n")
    manifest = render(capsys, "manifest", path, "--image", "ghcr.io/team/unet:1.0",
                      "--namespace", "team-a", "--max-restarts", restarts,
                      "--", "python", "train.py", "--config", "job.yaml")
    assert_valid(manifest)


@pytest.mark.parametrize("where,misspelt", [
    (["spec"], "tfReplicaSpec"),
    (["spec", "runPolicy"], "backOffLimit"),
    (["spec", "tfReplicaSpecs", "Worker"], "replica"),
    (["spec", "tfReplicaSpecs", "Worker", "template", "spec", "containers", 0], "imagePullPolice"),
])
def test_a_misspelt_tfjob_field_fails_validation(write_config, capsys, where, misspelt):
    config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    manifest = render(capsys, "manifest", config, "--image", "i", "--", "python", "train.py")
    node = manifest
    for key in where:
        node = node[key]
    node[misspelt] = 1
    assert any(repr(misspelt) in problem for problem in errors(manifest)), errors(manifest)
