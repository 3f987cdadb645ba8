"""TF_CONFIG generation: what `tfdist tf-config` prints is what TensorFlow reads back."""

import json
import os

import pytest

from tfdist.cli import main
from tfdist.cluster.spec import ClusterError, cluster_dict, parse_task
from tfdist.cluster.tf_config import read_tf_config, tf_config, tf_config_json
from tfdist.config import load_config
from paths import ROOT

CLUSTER_YAML = """
    cluster:
      chief: ["node-0:2222"]
      worker: ["node-1:2222", "node-2:2222"]
      ps: ["node-3:2222"]
      evaluator: ["node-4:2222"]
    strategy: parameter_server
"""


def test_tf_config_names_cluster_and_task(write_config):
    cluster = cluster_dict(load_config(write_config(CLUSTER_YAML)).cluster)
    assert cluster == {"chief": ["node-0:2222"], "worker": ["node-1:2222", "node-2:2222"],
                       "ps": ["node-3:2222"], "evaluator": ["node-4:2222"]}
    assert tf_config(cluster, "worker", 1) == {
        "cluster": cluster, "task": {"type": "worker", "index": 1}, "environment": "cloud"}
    with pytest.raises(ClusterError, match="no task worker:2"):
        tf_config(cluster, "worker", 2)


@pytest.mark.parametrize("task", ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"])
def test_tensorflow_reads_back_the_same_cluster_and_task(write_config, capsys, monkeypatch, task):
    import tensorflow as tf

    assert main(["tf-config", write_config(CLUSTER_YAML), "--task", task]) == 0
    printed = capsys.readouterr().out
    monkeypatch.setenv("TF_CONFIG", printed)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    job, index = task.split(":")
    assert (resolver.task_type, resolver.task_id) == (job, int(index))
    expected = json.loads(printed)["cluster"]
    assert resolver.cluster_spec().as_dict() == expected
    assert resolver.cluster_spec().as_dict()["worker"] == ["node-1:2222", "node-2:2222"]


def test_count_based_cluster_has_no_fixed_tf_config(write_config, capsys):
    path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    assert main(["tf-config", path, "--task", "worker:0"]) == 2
    assert "ports are only chosen by `tfdist launch`" in capsys.readouterr().err
    with pytest.raises(ClusterError):
        cluster_dict(load_config(path).cluster)


def test_free_ports_are_distinct_local_ports(write_config):
    config = load_config(write_config("cluster: {chief: 1, worker: 3}\n"
                                      "strategy: multi_worker_mirrored\n"))
    cluster = cluster_dict(config.cluster, pick_free_ports=True)
    addresses = cluster["chief"] + cluster["worker"]
    assert len(addresses) == 4 and len(set(addresses)) == 4
    assert all(a.startswith("localhost:") and 0 < int(a.split(":")[1]) < 65536 for a in addresses)


def test_json_is_compact_and_parses_back():
    cluster = {"worker": ["a:1", "b:2"]}
    text = tf_config_json(cluster, "worker", 0)
    assert " " not in text and json.loads(text)["task"] == {"type": "worker", "index": 0}


@pytest.mark.parametrize("text,message", [
    ("worker", "TYPE:INDEX"), ("worker:x", "TYPE:INDEX"), (":1", "TYPE:INDEX"),
    ("worker:5", "no task worker:5"), ("ps:0", "no task ps:0"),
])
def test_bad_task_names(text, message):
    with pytest.raises(ClusterError, match=message):
        parse_task(text, {"chief": ["a:1"], "worker": ["b:1", "c:1"]})


def test_cli_reports_a_missing_task_without_traceback(write_config, capsys):
    assert main(["tf-config", write_config(CLUSTER_YAML), "--task", "worker:9"]) == 2
    err = capsys.readouterr().err
    assert "no task worker:9" in err and "worker:0..1" in err and "Traceback" not in err
    assert os.environ.get("TF_CONFIG") is None


FIXED = """
    cluster:
      chief: ["localhost:2000"]
      worker: ["localhost:2001", "127.0.0.1:2002"]
    strategy: multi_worker_mirrored
"""


@pytest.mark.parametrize("raw,message", [
    (None, "TF_CONFIG is not set, so this process would train alone"),
    ("{not json", "TF_CONFIG is not valid JSON"),
    ("[1, 2]", "TF_CONFIG must be a JSON object"),
    ('{"cluster": {"worker": ["localhost:2001"]}}', "not a valid task description"),
    (tf_config_json({"chief": ["localhost:2000"], "worker": ["localhost:2001"]}, "worker", 0),
     "TF_CONFIG of task worker:0 disagrees with .*job.yaml: its cluster has "
     r"\{'chief': 1, 'worker': 1\} tasks, the config \{'chief': 1, 'worker': 2\}"),
    (tf_config_json({"chief": ["localhost:2000"], "worker": ["localhost:2001", "otherhost:2002"]},
                    "worker", 1), "task worker:1 puts worker:1 at otherhost:2002, but .* says "
                                  "127.0.0.1:2002"),
    (json.dumps({"cluster": {"chief": ["localhost:2000"],
                             "worker": ["localhost:2001", "localhost:2002"]},
                 "task": {"type": "worker", "index": 5}}), "names task worker:5, but its cluster has 2"),
])
def test_a_tf_config_that_disagrees_with_the_config_is_named(write_config, monkeypatch, raw,
                                                              message):
    import tfdist
    from tfdist.strategies import StrategyError

    config = load_config(write_config(FIXED))
    if raw is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(StrategyError, match=message):
        tfdist.get_strategy(config)


def test_the_tf_config_the_launcher_writes_matches(write_config):
    from tfdist.cluster.tf_config import check_matches

    config = load_config(write_config(FIXED))
    addresses = cluster_dict(config.cluster)
    for job, index in config.cluster.tasks():  # localhost and 127.0.0.1 are the same place
        check_matches(config.cluster, tf_config_json(addresses, job, index))
    counted = load_config(write_config("cluster: {worker: 3}\nstrategy: multi_worker_mirrored\n"))
    check_matches(counted.cluster, tf_config_json(cluster_dict(counted.cluster, pick_free_ports=True),
                                                  "worker", 2))
    check_matches(load_config(write_config("cluster: {worker: 1}\n")).cluster, None)  # alone


def test_read_tf_config_parses_or_names_the_variable(monkeypatch):
    assert read_tf_config({}) is None and read_tf_config({"TF_CONFIG": " "}) is None
    text = tf_config_json({"worker": ["a:1"]}, "worker", 0)
    assert read_tf_config({"TF_CONFIG": text})["task"] == {"type": "worker", "index": 0}
    monkeypatch.setenv("TF_CONFIG", text)
    assert read_tf_config() == json.loads(text)
    with pytest.raises(ClusterError, match=r"TF_CONFIG is not valid JSON .*Received: "
                                           r"TF_CONFIG='\{oops'"):
        read_tf_config({"TF_CONFIG": "{oops"})


def test_tfdist_reads_tf_config_in_one_place():
    """Every reader goes through read_tf_config (issue 14)."""
    import re

    root = ROOT / "tfdist"
    readers = [str(path.relative_to(root)) for path in sorted(root.rglob("*.py"))
               for line in path.read_text().splitlines()
               if re.search(r"""(environ|getenv)\b.*["']TF_CONFIG["']\s*\)""", line)]
    assert readers == ["cluster/tf_config.py"], readers


def test_a_malformed_address_in_tf_config_is_named():
    from tfdist.cluster.tf_config import check_matches

    config = load_config_text("cluster: {chief: ['localhost:2000'], "
                              "worker: ['localhost:2001']}\n")
    bad = {"cluster": {"chief": ["localhost:2000"], "worker": ["nope"]},
           "task": {"type": "chief", "index": 0}}
    with pytest.raises(ClusterError, match=r"worker:0: expected \"host:port\". Received: 'nope'"):
        check_matches(config.cluster, bad)


def load_config_text(text):
    import yaml

    from tfdist.config import config_from_dict

    return config_from_dict(yaml.safe_load(text))


# --- hostile TF_CONFIGs ------------------------------------------------------------------

TWO = {"worker": ["localhost:2001", "localhost:2002"]}


@pytest.mark.parametrize("raw,message", [
    (json.dumps({"cluster": TWO, "task": {"type": "worker", "index": -1}}), "index must be an integer >= 0"),
    (json.dumps({"cluster": TWO, "task": {"type": "worker", "index": 0.5}}), "index must be an integer >= 0"),
    (json.dumps({"cluster": TWO, "task": {"type": "worker", "index": True}}), "index must be an integer >= 0"),
    (json.dumps({"cluster": TWO, "task": {"type": "worker", "index": "1"}}), "index must be an integer >= 0"),
    (json.dumps({"cluster": TWO, "task": {"type": "worker", "index": 2}}), "names task worker:2"),
    (json.dumps({"cluster": TWO, "task": {"type": 7, "index": 0}}), "task type must be a job name"),
    (json.dumps({"cluster": TWO, "task": [0]}), "task must be an object"),
    (json.dumps({"cluster": ["localhost:1"], "task": {}}), "cluster must map job names"),
    (json.dumps({"cluster": {"worker": "localhost:1"}}), "cluster must map job names"),
    (json.dumps({"cluster": {"worker": [7]}}), r"worker:0: expected a \"host:port\" string"),
    (json.dumps({"cluster": {"worker": ["localhost\n:1"]}}), "worker:0: expected \"host:port\" in visible"),
    (json.dumps({"cluster": {"worker": ["localhost:99999"]}}), "outside 1-65535"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ('{"cluster": ', "not valid JSON"),
    ("null", "must be a JSON object"),
])
def test_a_hostile_tf_config_is_a_cluster_error_naming_it(raw, message):
    from tfdist.cluster.errors import ClusterError
    from tfdist.cluster.tf_config import parse_tf_config

    with pytest.raises(ClusterError, match=message) as error:
        parse_tf_config(raw)
    assert "\n" not in str(error.value) and len(str(error.value)) < 1000


@pytest.mark.parametrize("name", ["multi_worker_mirrored", "parameter_server"])
def test_get_strategy_names_a_malformed_tf_config_before_tensorflow_sees_it(monkeypatch, name):
    import tfdist
    from tfdist.strategies import StrategyError

    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": TWO, "task": {"type": "worker",
                                                                          "index": -1}}))
    with pytest.raises(StrategyError, match="index must be an integer >= 0"):
        tfdist.get_strategy(name)


@pytest.mark.parametrize("cluster, places, size, task, accepted", [
    ("{worker: 4}", "0,1,2/4", 3, ("worker", 2), True),     # worker:3 lost for good
    ("{worker: 4}", "0,2,3/4", 3, ("worker", 0), True),     # a middle worker lost
    ("{chief: 1, worker: 3}", "0,1/4", 2, ("worker", 0), True),  # the chief stays
    ("{worker: 4}", "0,1,2/5", 3, ("worker", 1), "elastic launch of 5 chief and worker tasks"),
    ("{worker: 4}", None, 3, ("worker", 1), r"its cluster has \{'worker': 3\} tasks"),
    ("{worker: 4}", "0,1/4", 3, ("worker", 1), "must list 3 distinct places"),
    ("{worker: 4}", "0,1,x/4", 3, ("worker", 1), "TFDIST_ELASTIC_PLACES must be the places"),
])
def test_a_resized_tf_config_of_an_elastic_launch_is_the_config_at_its_size(
        write_config, monkeypatch, cluster, places, size, task, accepted):
    """Under `tfdist launch --min-workers` the config's cluster is the most the job runs
    with: get_strategy(config) accepts the resized TF_CONFIG the launcher wrote (the
    places variable says so) and refuses one that no resize of that config gives."""
    config = load_config(write_config(f"cluster: {cluster}\nstrategy: multi_worker_mirrored\n"))
    resized = config.cluster.resized(size)
    monkeypatch.setenv("TF_CONFIG", tf_config_json(cluster_dict(resized, pick_free_ports=True),
                                                   *task))
    if places is None:
        monkeypatch.delenv("TFDIST_ELASTIC_PLACES", raising=False)
    else:
        monkeypatch.setenv("TFDIST_ELASTIC_PLACES", places)
    from tfdist.strategies import StrategyError
    from tfdist.strategies.factory import _check_tf_config

    if accepted is True:
        _check_tf_config(config, size)
    else:
        with pytest.raises(StrategyError, match=accepted):
            _check_tf_config(config, size)
