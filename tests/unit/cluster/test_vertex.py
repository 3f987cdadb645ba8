"""Vertex AI's CLUSTER_SPEC read as the TF_CONFIG it describes (no Vertex needed)."""

import json
import os
import subprocess
import sys

import pytest

from tfdist.cluster.errors import ClusterError
from tfdist.cluster.tf_config import check_matches, read_tf_config
from tfdist.config import config_from_dict, load_config
from paths import ROOT


# As Vertex AI documents it: primary replica, workers, parameter servers, evaluator.
SPEC = {
    "cluster": {
        "workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
        "workerpool1": ["cmle-training-workerpool1-ab-0:2222",
                        "cmle-training-workerpool1-ab-1:2222"],
        "workerpool2": ["cmle-training-workerpool2-ab-0:2222"],
        "workerpool3": ["cmle-training-workerpool3-ab-0:2222"],
    },
    "environment": "cloud",
    "task": {"type": "workerpool1", "index": 1, "trial": ""},
    "job": {"worker_pool_specs": [{"replica_count": 1}, {"replica_count": 2}]},
}
EXPECTED = {
    "cluster": {"chief": SPEC["cluster"]["workerpool0"], "worker": SPEC["cluster"]["workerpool1"],
                "ps": SPEC["cluster"]["workerpool2"], "evaluator": SPEC["cluster"]["workerpool3"]},
    "task": {"type": "worker", "index": 1},
    "environment": "cloud",
}


def test_cluster_spec_reads_as_tf_config():
    assert read_tf_config({"CLUSTER_SPEC": json.dumps(SPEC)}) == EXPECTED


@pytest.mark.parametrize("pool, job", [("workerpool0", "chief"), ("workerpool1", "worker"),
                                       ("workerpool2", "ps"), ("workerpool3", "evaluator")])
def test_every_pool_is_its_tf_job(pool, job):
    spec = {**SPEC, "task": {"type": pool, "index": 0}}
    assert read_tf_config({"CLUSTER_SPEC": json.dumps(spec)})["task"] == {"type": job, "index": 0}


def test_tf_config_wins_and_nothing_is_none():
    tf_config = {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}
    environ = {"TF_CONFIG": json.dumps(tf_config), "CLUSTER_SPEC": json.dumps(SPEC)}
    assert read_tf_config(environ) == tf_config
    assert read_tf_config({"TF_CONFIG": " ", "CLUSTER_SPEC": ""}) is None
    assert read_tf_config({}) is None


def test_empty_pools_are_left_out():
    spec = {"cluster": {"workerpool0": ["a:1"], "workerpool1": ["b:1"], "workerpool2": []},
            "task": {"type": "workerpool0", "index": 0}}
    assert read_tf_config({"CLUSTER_SPEC": json.dumps(spec)})["cluster"] == {
        "chief": ["a:1"], "worker": ["b:1"]}


def test_matches_a_config_with_the_same_counts():
    config = config_from_dict({"cluster": {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1},
                               "strategy": "parameter_server"})
    check_matches(config.cluster, read_tf_config({"CLUSTER_SPEC": json.dumps(SPEC)}))
    fewer = config_from_dict({"cluster": {"chief": 1, "worker": 1, "ps": 1},
                              "strategy": "parameter_server"})
    with pytest.raises(ClusterError, match="disagrees with"):
        check_matches(fewer.cluster, read_tf_config({"CLUSTER_SPEC": json.dumps(SPEC)}))


@pytest.mark.parametrize("raw, message", [
    ("{", "CLUSTER_SPEC is not valid JSON"),
    ("[1]", "must be a JSON object with a cluster"),
    ('{"cluster": [], "task": {}}', "must be a JSON object with a cluster"),
    ('{"cluster": {"workerpool0": ["a:1"]}}', "must be a JSON object with a cluster"),
    ('{"cluster": {"workerpool4": ["a:1"]}, "task": {"type": "workerpool4"}}',
     "has pool 'workerpool4'"),
    ('{"cluster": {"master": ["a:1"]}, "task": {"type": "master"}}', "has pool 'master'"),
    ('{"cluster": {"workerpool0": ["a:1"]}, "task": {"type": "chief"}}',
     r"task type must be one of \[workerpool0"),
    ('{"cluster": {"workerpool0": ["a:1"]}, "task": {"type": "workerpool0", "index": 1}}',
     "read as TF_CONFIG: TF_CONFIG names task chief:1, but its cluster has 1"),
    ('{"cluster": {"workerpool0": ["a:1"]}, "task": {"type": "workerpool0", "index": -1}}',
     "read as TF_CONFIG: TF_CONFIG's task index must be an integer >= 0"),
    ('{"cluster": {"workerpool0": ["a"]}, "task": {"type": "workerpool0"}}',
     "read as TF_CONFIG: TF_CONFIG's cluster: chief:0"),
    ('{"cluster": {"workerpool0": "a:1"}, "task": {"type": "workerpool0"}}',
     "must map job names to lists"),
])
def test_malformed_cluster_specs_are_named(raw, message):
    with pytest.raises(ClusterError, match=message) as e:
        read_tf_config({"CLUSTER_SPEC": raw})
    assert "CLUSTER_SPEC" in str(e.value) and "Received" in str(e.value)


def test_exec_writes_the_tf_config_for_tensorflow():
    """On a Vertex replica without TF_CONFIG, `tfdist exec` sets it from CLUSTER_SPEC (the
    README's recipe), and the training script's own check accepts it."""
    config = str(ROOT / "configs" / "unet_parameter_server.yaml")
    spec = {**SPEC, "cluster": {k: v for k, v in SPEC["cluster"].items() if k != "workerpool3"},
            "task": {"type": "workerpool0", "index": 0}}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "JOBSET", "TF_CONFIG"))}
    env["CLUSTER_SPEC"] = json.dumps(spec)
    result = subprocess.run([sys.executable, "-m", "tfdist", "exec", config, "--", "sh", "-c",
                             "echo $TF_CONFIG"], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stderr
    cluster = {k: v for k, v in EXPECTED["cluster"].items() if k != "evaluator"}
    assert json.loads(result.stdout) == {"cluster": cluster, "task": {"type": "chief", "index": 0},
                                         "environment": "cloud"}
    check_matches(load_config(config).cluster, result.stdout, config)


def test_get_strategy_refuses_a_cluster_tensorflow_cannot_see(monkeypatch):
    """CLUSTER_SPEC alone: TensorFlow would train this task alone; say to use tfdist exec."""
    from tfdist.strategies import StrategyError, get_strategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("CLUSTER_SPEC", json.dumps(SPEC))
    with pytest.raises(StrategyError, match="TF_CONFIG is not set.*tfdist exec"):
        get_strategy("multi_worker_mirrored")
