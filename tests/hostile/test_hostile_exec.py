"""Hostile environments for `tfdist exec`: SLURM, JobSet and Vertex AI variables (and a
TF_CONFIG) that no scheduler would set (issue 31, "Environments").

Every case ends in one `ClusterError` that names the variable, with its value shortened:
most are in-process calls of the readers; a handful run the real CLI (``python -m
tfdist exec``) under resource limits and assert the exit code, one printable stderr line
and no traceback. Sizes are bounded before anything is expanded: a step of 99,999,999
tasks (10 GB and 50 s before) and a bracket of 200 ranges (1.4 GB) are refused in
milliseconds and a few hundred KB (tracemalloc), and under a 256 MiB address-space limit.
Hypothesis generates SLURM environments and CLUSTER_SPEC / TF_CONFIG JSON: the result is
a valid cluster or a `ClusterError`, never another exception.
"""

import json
import os
import re
import resource
import subprocess
import sys
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tfdist.cluster import environment
from tfdist.cluster.address import parse_address
from tfdist.cluster.errors import ClusterError
from tfdist.cluster.tf_config import parse_tf_config, read_tf_config
from tfdist.config import ConfigError, config_from_dict

PY = sys.executable
TIMEOUT = 30
MEMORY_LIMIT = 256 << 20  # bytes of address space per CLI process
MIB = 1 << 20
SLURM = config_from_dict({"cluster": {"slurm": {"chief": 1, "port": 7000}},
                          "strategy": "multi_worker_mirrored"})
COUNTS = config_from_dict({"cluster": {"chief": 1, "worker": 2},
                           "strategy": "multi_worker_mirrored"})
SCHEDULER_PREFIXES = ("SLURM", "JOBSET_", "JOB_", "TF_CONFIG", "CLUSTER_SPEC", "POD_NAMESPACE",
                      "REPLICATED_JOB_NAME")


def srun(**changes):
    """Task 1 of a 3-task step on nodes a (2 tasks) and b (1), with `changes` (None
    removes a variable)."""
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_STEP_NODELIST": "a,b",
           "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_NODEID": "0", "SLURMD_NODENAME": "a",
           "SLURM_LOCALID": "1", **changes}
    return {k: v for k, v in env.items() if v is not None}


def pod(**changes):
    env = {"JOBSET_NAME": "unet", "REPLICATED_JOB_NAME": "worker", "JOB_INDEX": "0",
           "JOB_COMPLETION_INDEX": "1", "POD_NAMESPACE": "ml", **changes}
    return {k: v for k, v in env.items() if v is not None}


def spec(cluster=None, task=None):
    return json.dumps({"cluster": {"workerpool0": ["a:1"], "workerpool1": ["b:1"]}
                       if cluster is None else cluster,
                       "task": {"type": "workerpool1", "index": 0} if task is None else task})


def refused(config, environ, *patterns):
    """`environment.scheduled_task` raises one ClusterError line matching `patterns`."""
    with pytest.raises(ClusterError) as error:
        environment.scheduled_task(config, environ)
    message = str(error.value)
    assert "\n" not in message and len(message) < 2000, message[:3000]
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    return message


def measured(function):
    """(result or the ClusterError raised, seconds, peak bytes) of `function()`; any
    other exception propagates (a failure)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        try:
            result = function()
        except ClusterError as e:
            result = e
        return result, time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def two_hundred_ranges():
    return "n[" + ",".join(["1-99999"] * 200) + "]"


# --- SLURM ----------------------------------------------------------------------------------

SLURM_CASES = [
    ("procid-5000-digits", srun(SLURM_PROCID="9" * 5000), [r"SLURM_PROCID", r"at most 64"]),
    ("ntasks-5000-digits", srun(SLURM_NTASKS="1" + "0" * 4999), [r"SLURM_NTASKS"]),
    ("procid-arabic-digit", srun(SLURM_PROCID="١"), [r"SLURM_PROCID='١'"]),
    ("procid-superscript", srun(SLURM_PROCID="²"), [r"SLURM_PROCID"]),
    ("procid-sign", srun(SLURM_PROCID="+1"), [r"SLURM_PROCID"]),
    ("procid-space", srun(SLURM_PROCID=" 1"), [r"SLURM_PROCID"]),
    ("procid-empty", srun(SLURM_PROCID=""), [r"SLURM_PROCID=''"]),
    ("ntasks-above-max-tasks", srun(SLURM_NTASKS="10001"), [r"SLURM_NTASKS", r"10,000"]),
    ("step-of-99999999-tasks", srun(SLURM_NTASKS="99999999", SLURM_STEP_TASKS_PER_NODE="99999999",
                                    SLURM_STEP_NODELIST="a"), [r"SLURM_NTASKS", r"10,000"]),
    ("tasks-per-node-99999999", srun(SLURM_STEP_TASKS_PER_NODE="99999999"),
     [r"SLURM_STEP_TASKS_PER_NODE", r"10,000"]),
    ("tasks-per-node-x99999999", srun(SLURM_STEP_TASKS_PER_NODE="1(x99999999)"),
     [r"SLURM_STEP_TASKS_PER_NODE"]),
    ("tasks-per-node-5000-digits", srun(SLURM_STEP_TASKS_PER_NODE="9" * 5000),
     [r"SLURM_STEP_TASKS_PER_NODE"]),
    ("tasks-per-node-zero", srun(SLURM_STEP_TASKS_PER_NODE="0(x99999999),3"),
     [r"SLURM_STEP_TASKS_PER_NODE", r"at least 1"]),
    ("tasks-per-node-2-mib", srun(SLURM_STEP_TASKS_PER_NODE="1," * MIB),
     [r"SLURM_STEP_TASKS_PER_NODE has 2,097,152 characters"]),
    ("tasks-per-node-arabic", srun(SLURM_STEP_TASKS_PER_NODE="٢,1"),
     [r"SLURM_STEP_TASKS_PER_NODE"]),
    ("tasks-per-node-sum-differs", srun(SLURM_STEP_TASKS_PER_NODE="5000(x2)"),
     [r"adds up to 10000 tasks but SLURM_NTASKS is 3"]),
    ("nodelist-200-ranges", srun(SLURM_STEP_NODELIST=two_hundred_ranges()),
     [r"SLURM_STEP_NODELIST", r"more than 100,000 hosts"]),
    ("nodelist-product", srun(SLURM_STEP_NODELIST="a[0-999]b[0-999]c[0-999]"),
     [r"SLURM_STEP_NODELIST", r"more than 100,000 hosts"]),
    ("nodelist-300000-names", srun(SLURM_STEP_NODELIST="a," * 300000 + "a"),
     [r"SLURM_STEP_NODELIST", r"more than 100,000 hosts"]),
    ("nodelist-more-nodes-than-tasks", srun(SLURM_STEP_NODELIST="n[1-5000]"),
     [r"SLURM_STEP_NODELIST has 5000 node\(s\) but SLURM_STEP_TASKS_PER_NODE describes 2"]),
    ("nodelist-5000-digit-range", srun(SLURM_STEP_NODELIST="n[0-" + "9" * 5000 + "]"),
     [r"SLURM_STEP_NODELIST", r"numbers or ranges"]),
    ("nodelist-2-mib", srun(SLURM_STEP_NODELIST="a" * 2 * MIB),
     [r"SLURM_STEP_NODELIST has 2,097,152 characters"]),
    ("nodelist-space", srun(SLURM_STEP_NODELIST="a b,c"), [r"SLURM_STEP_NODELIST", r"'a b'"]),
    ("nodelist-quote", srun(SLURM_STEP_NODELIST="a\",b"), [r"SLURM_STEP_NODELIST"]),
    ("nodelist-newline", srun(SLURM_STEP_NODELIST="a\n,b"), [r"SLURM_STEP_NODELIST", r"\\n"]),
    ("nodelist-escape", srun(SLURM_STEP_NODELIST="\x1b[2J,b"), [r"SLURM_STEP_NODELIST"]),
    ("nodelist-shell", srun(SLURM_STEP_NODELIST="a;rm -rf ~,b"), [r"SLURM_STEP_NODELIST"]),
    ("nodelist-unicode-letter", srun(SLURM_STEP_NODELIST="nöde,b"), [r"SLURM_STEP_NODELIST"]),
    ("nodelist-colon", srun(SLURM_STEP_NODELIST="a:1,b"), [r"SLURM_STEP_NODELIST"]),
    ("nodelist-ipv6", srun(SLURM_STEP_NODELIST="::1,b"), [r"SLURM_STEP_NODELIST"]),
    ("nodelist-leading-hyphen", srun(SLURM_STEP_NODELIST="-a,b"),
     [r"SLURM_STEP_NODELIST", r"'-a' is not a valid host"]),
    ("nodelist-empty-label", srun(SLURM_STEP_NODELIST="a..b,c"), [r"SLURM_STEP_NODELIST"]),
    ("nodelist-64-character-label", srun(SLURM_STEP_NODELIST="a" * 64 + ",b"),
     [r"SLURM_STEP_NODELIST", r"not a valid host"]),
    ("nodelist-254-character-name", srun(SLURM_STEP_NODELIST="a." * 127 + ",b"),
     [r"SLURM_STEP_NODELIST", r"longer than 253"]),
    ("nodelist-100000-brackets", srun(SLURM_STEP_NODELIST="a[1]" * 100000 + ",b"),
     [r"SLURM_STEP_NODELIST", r"longer than 253"]),
    ("nodelist-nested", srun(SLURM_STEP_NODELIST="a[[1]],b"), [r"SLURM_STEP_NODELIST", r"nested"]),
    ("job-nodelist-space", srun(SLURM_STEP_NODELIST=None, SLURM_JOB_NODELIST="a b,c"),
     [r"SLURM_JOB_NODELIST"]),
    ("nodeid-5000-digits", srun(SLURM_NODEID="0" * 5000), [r"SLURM_NODEID has 5,000 characters"]),
    ("nodename-escape", srun(SLURMD_NODENAME="\x1b[2Ja"), [r"SLURMD_NODENAME='\\x1b\[2Ja'"]),
    ("localid-huge", srun(SLURM_LOCALID="9" * 60), [r"SLURM_LOCALID='9999"]),
]


@pytest.mark.parametrize("environ,patterns", [c[1:] for c in SLURM_CASES],
                         ids=[c[0] for c in SLURM_CASES])
def test_a_hostile_slurm_environment_is_one_error_naming_the_variable(environ, patterns):
    refused(SLURM, environ, *patterns)


@pytest.mark.parametrize("environ", [
    srun(SLURM_NTASKS="99999999", SLURM_STEP_TASKS_PER_NODE="99999999", SLURM_STEP_NODELIST="a"),
    srun(SLURM_NTASKS="10000", SLURM_STEP_TASKS_PER_NODE="99999999"),
    srun(SLURM_NTASKS="10000", SLURM_STEP_TASKS_PER_NODE="1(x99999999)"),
    srun(SLURM_NTASKS="10000", SLURM_STEP_TASKS_PER_NODE="1(x10000)",
         SLURM_STEP_NODELIST=two_hundred_ranges()),
    srun(SLURM_STEP_NODELIST="a[0-999]b[0-999]c[0-999]"),
    srun(SLURM_STEP_NODELIST="a," * 400000 + "a"),
], ids=["99999999-tasks", "99999999-tasks-on-one-node", "99999999-nodes", "200-ranges",
        "product-of-brackets", "400000-names"])
def test_sizes_are_counted_before_anything_is_expanded(environ):
    result, seconds, peak = measured(lambda: environment.scheduled_task(SLURM, environ))
    assert isinstance(result, ClusterError)
    assert peak < 2 * MIB, f"peak allocation {peak:,} bytes"
    assert seconds < 5, f"{seconds:.1f} s"


def test_the_largest_allowed_step_stays_small():
    """10,000 tasks (MAX_TASKS) on 10,000 nodes: expanded in well under a second and a few MB."""
    environ = srun(SLURM_NTASKS="10000", SLURM_STEP_TASKS_PER_NODE="1(x10000)",
                   SLURM_STEP_NODELIST="n[00001-10000]", SLURM_PROCID="9999", SLURM_NODEID="9999",
                   SLURMD_NODENAME="n10000", SLURM_LOCALID="0")
    tracemalloc.start()
    try:
        cluster, job, index = environment.scheduled_task(SLURM, environ)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (job, index, len(cluster["worker"])) == ("worker", 9998, 9999)
    assert peak < 16 * MIB, f"peak allocation {peak:,} bytes"


def test_a_tf_config_too_large_to_pass_is_refused_before_the_exec():
    """10,000 tasks with 20-character host names: a 300 KB TF_CONFIG, beyond Linux's
    131072 bytes per variable (execve would fail with E2BIG)."""
    environ = srun(SLURM_NTASKS="10000", SLURM_STEP_TASKS_PER_NODE="1(x10000)",
                   SLURM_STEP_NODELIST="node-of-the-rack[00001-10000]", SLURM_PROCID="0",
                   SLURM_NODEID="0", SLURMD_NODENAME="node-of-the-rack00001", SLURM_LOCALID="0")
    with pytest.raises(ClusterError, match=r"TF_CONFIG of this 10,000-task cluster takes "
                                           r"[\d,]+ bytes.* at most 131072 bytes"):
        environment.exec_task(SLURM, ["true"], environ)


def test_underscores_in_node_names_are_accepted_and_read_back():
    """SLURM node names may hold '_'; the TF_CONFIG made from them passes tfdist's reader."""
    environ = srun(SLURM_STEP_NODELIST="gpu_a,gpu_b", SLURMD_NODENAME="gpu_a")
    cluster, job, index = environment.scheduled_task(SLURM, environ)
    assert cluster == {"chief": ["gpu_a:7000"], "worker": ["gpu_a:7001", "gpu_b:7000"]}
    text = environment.passable_tf_config(cluster, job, index)
    assert read_tf_config({"TF_CONFIG": text})["cluster"] == cluster


# --- JobSet ---------------------------------------------------------------------------------

JOBSET_CASES = [
    ("completion-index-5000-digits", pod(JOB_COMPLETION_INDEX="9" * 5000),
     [r"JOB_COMPLETION_INDEX has 5,000 characters"]),
    ("completion-index-64-digits", pod(JOB_COMPLETION_INDEX="9" * 64),
     [r"JOB_COMPLETION_INDEX to be a whole number from 0 to 10,000"]),
    ("completion-index-arabic", pod(JOB_COMPLETION_INDEX="١"), [r"JOB_COMPLETION_INDEX='١'"]),
    ("completion-index-exponent", pod(JOB_COMPLETION_INDEX="1e3"), [r"JOB_COMPLETION_INDEX"]),
    ("job-index-5000-digits", pod(JOB_INDEX="9" * 5000), [r"JOB_INDEX has 5,000 characters"]),
    ("job-index-empty", pod(JOB_INDEX=""), [r"JOB_INDEX=''"]),
    ("jobset-name-1-mib", pod(JOBSET_NAME="a" * MIB), [r"JOBSET_NAME has 1,048,576 characters"]),
    ("jobset-name-escape", pod(JOBSET_NAME="\x1b[2J"), [r"JOBSET_NAME", r"\\x1b"]),
    ("jobset-name-too-long-for-host-names", pod(JOBSET_NAME="a" * 60),
     [r"JOBSET_NAME is too long", r"longer than 63"]),
    ("replicated-job-1-mib", pod(REPLICATED_JOB_NAME="w" * MIB), [r"REPLICATED_JOB_NAME has"]),
    ("replicated-job-list", pod(REPLICATED_JOB_NAME="['worker']"), [r"REPLICATED_JOB_NAME="]),
    ("namespace-dot", pod(POD_NAMESPACE="ml.evil.example"), [r"POD_NAMESPACE"]),
    ("namespace-1-mib", pod(POD_NAMESPACE="n" * MIB), [r"POD_NAMESPACE has"]),
    ("subdomain-space", pod(JOBSET_SUBDOMAIN="a b"), [r"JOBSET_SUBDOMAIN"]),
]


@pytest.mark.parametrize("environ,patterns", [c[1:] for c in JOBSET_CASES],
                         ids=[c[0] for c in JOBSET_CASES])
def test_a_hostile_pod_environment_is_one_error_naming_the_variable(environ, patterns):
    refused(COUNTS, environ, *patterns)


# --- Vertex AI's CLUSTER_SPEC and TF_CONFIG -------------------------------------------------

SPEC_CASES = [
    ("empty-object", "{}", [r"CLUSTER_SPEC must be a JSON object"]),
    ("blank", "  \t", [r"CLUSTER_SPEC is set but blank"]),
    ("empty-string", "", [r"CLUSTER_SPEC is set but blank"]),
    ("null", "null", [r"CLUSTER_SPEC must be a JSON object"]),
    ("list", "[]", [r"CLUSTER_SPEC must be a JSON object"]),
    ("not-json", "{'cluster': 1}", [r"CLUSTER_SPEC is not valid JSON"]),
    ("5000-digit-index", spec(task={"type": "workerpool0", "index": 1}).replace(
        '"index": 1', '"index": 1' + "0" * 4999), [r"CLUSTER_SPEC", r"4,300 digits"]),
    ("deep", "[" * 100000 + "]" * 100000, [r"CLUSTER_SPEC is nested too deeply"]),
    ("2-mib", json.dumps({"x": "y" * 2 * MIB}), [r"CLUSTER_SPEC has 2,097,1\d\d characters"]),
    ("task-type-list", spec(task={"type": ["workerpool0"]}), [r"CLUSTER_SPEC's task type"]),
    ("task-type-object", spec(task={"type": {"a": 1}}), [r"CLUSTER_SPEC's task type"]),
    ("task-type-number", spec(task={"type": 0}), [r"CLUSTER_SPEC's task type"]),
    ("task-type-missing", spec(task={}), [r"CLUSTER_SPEC's task type"]),
    ("task-list", spec(task=[]), [r"CLUSTER_SPEC must be a JSON object .* and a task"]),
    ("cluster-list", spec(cluster=["a:1"]), [r"CLUSTER_SPEC must be a JSON object"]),
    ("pool-number", spec(cluster={"workerpool1": 0}), [r"CLUSTER_SPEC", r"cluster must map"]),
    ("pool-false", spec(cluster={"workerpool1": False}), [r"CLUSTER_SPEC", r"cluster must map"]),
    ("pool-object", spec(cluster={"workerpool1": {}}), [r"CLUSTER_SPEC", r"cluster must map"]),
    ("pool-string", spec(cluster={"workerpool1": "b:1"}), [r"CLUSTER_SPEC", r"cluster must map"]),
    ("unknown-pool", spec(cluster={"workerpool9": ["a:1"]}), [r"CLUSTER_SPEC has pool"]),
    ("address-number", spec(cluster={"workerpool1": [1]}), [r"CLUSTER_SPEC", r"worker:0"]),
    ("address-null", spec(cluster={"workerpool1": [None]}), [r"CLUSTER_SPEC", r"worker:0"]),
    ("address-space", spec(cluster={"workerpool1": ["a b:1"]}), [r"CLUSTER_SPEC", r"visible"]),
    ("address-newline", spec(cluster={"workerpool1": ["a\n:1"]}), [r"CLUSTER_SPEC"]),
    ("address-port-0", spec(cluster={"workerpool1": ["a:0"]}), [r"CLUSTER_SPEC", r"1-65535"]),
    ("address-long-port", spec(cluster={"workerpool1": ["a:" + "9" * 5000]}),
     [r"CLUSTER_SPEC", r"at most 300 characters"]),
    ("address-quote", spec(cluster={"workerpool1": ["a'b:1"]}), [r"CLUSTER_SPEC", r"valid host"]),
    ("index-string", spec(task={"type": "workerpool1", "index": "0"}),
     [r"CLUSTER_SPEC", r"index must be an integer"]),
    ("index-float", spec(task={"type": "workerpool1", "index": 0.0}), [r"CLUSTER_SPEC", r"index"]),
    ("index-bool", spec(task={"type": "workerpool1", "index": False}), [r"CLUSTER_SPEC", r"index"]),
    ("index-negative", spec(task={"type": "workerpool1", "index": -1}),
     [r"CLUSTER_SPEC", r"index"]),
    ("index-huge", spec(task={"type": "workerpool1", "index": 10 ** 400}),
     [r"CLUSTER_SPEC", r"integer of about 400 digits"]),
    ("task-not-in-cluster", spec(cluster={}, task={"type": "workerpool0"}),
     [r"CLUSTER_SPEC's task workerpool0:0 is not in its cluster"]),
    ("task-in-empty-pool", spec(cluster={"workerpool0": [], "workerpool1": ["b:1"]},
                                task={"type": "workerpool0"}),
     [r"CLUSTER_SPEC's task workerpool0:0 is not in its cluster"]),
    ("10001-tasks", spec(cluster={"workerpool1": ["a:1"] * 10001}),
     [r"CLUSTER_SPEC", r"10,001 tasks, more than 10,000"]),
]


@pytest.mark.parametrize("raw,patterns", [c[1:] for c in SPEC_CASES],
                         ids=[c[0] for c in SPEC_CASES])
def test_a_hostile_cluster_spec_is_one_error_naming_it(raw, patterns):
    refused(COUNTS, {"CLUSTER_SPEC": raw}, *patterns)


TF_CONFIG_CASES = [
    ("task-type-list", {"cluster": {"worker": ["a:1"]}, "task": {"type": ["worker"]}},
     r"task type must be a job name"),
    ("task-type-object", {"cluster": {"worker": ["a:1"]}, "task": {"type": {}}},
     r"task type must be a job name"),
    ("index-huge", {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 10 ** 400}},
     r"names task worker:<an integer of about 400 digits>"),
    ("cluster-null", {"cluster": None}, r"cluster must map"),
    ("10001-tasks", {"cluster": {"worker": ["a:1"] * 10001}}, r"10,001 tasks, more than 10,000"),
    ("2-mib", {"cluster": {}, "pad": "x" * 2 * MIB}, r"TF_CONFIG has 2,097,\d+ characters"),
    # found by test_generated_tf_configs in CI: a job name's line break split the message
    ("job-line-break", {"cluster": {"\n": [None]}}, r"cluster: '\\n':0: expected a"),
    ("task-job-line-break", {"cluster": {"w\nx": ["a:1"]}, "task": {"type": "w\nx",
                                                                      "index": 3}},
     r"names task 'w\\nx':3, but its cluster has 1 'w\\nx' task"),
]


@pytest.mark.parametrize("value,pattern", [c[1:] for c in TF_CONFIG_CASES],
                         ids=[c[0] for c in TF_CONFIG_CASES])
def test_a_hostile_tf_config_is_one_error_naming_it(value, pattern):
    with pytest.raises(ClusterError, match=pattern) as error:
        read_tf_config({"TF_CONFIG": json.dumps(value)})
    assert "TF_CONFIG" in str(error.value) and len(str(error.value)) < 2000
    assert "\n" not in str(error.value)  # one line


# --- the real command line ------------------------------------------------------------------

def _limits(stack=None):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        resource.setrlimit(resource.RLIMIT_CPU, (TIMEOUT, TIMEOUT))
        if stack:
            resource.setrlimit(resource.RLIMIT_STACK, (stack, stack))
    return apply


def run_exec(tmp_path, environ, command=("true",), stack=None):
    """`python -m tfdist exec` of a ``cluster: slurm`` config (or counts, for JobSet
    and Vertex) in `environ` (plus PATH, no scheduler variables) under the limits;
    returns (exit code, stdout, stderr)."""
    config = tmp_path / "job.yaml"
    config.write_text("cluster: {slurm: {chief: 1, port: 7000}}\nstrategy: multi_worker_mirrored\n"
                      if any(k.startswith("SLURM") for k in environ) else
                      "cluster: {chief: 1, worker: 2}\nstrategy: multi_worker_mirrored\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_PREFIXES)}
    env.update(environ)
    result = subprocess.run([PY, "-m", "tfdist", "exec", str(config), "--", *command], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT,
                            stdin=subprocess.DEVNULL, preexec_fn=_limits(stack))
    return result.returncode, result.stdout, result.stderr


def assert_one_line(code, err, expected_code, *patterns):
    assert code == expected_code, f"exit {code}; stderr: {err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err[:2000]!r}"
    line = err[:-1]
    assert line.isprintable() and line.startswith("tfdist exec: error: "), line
    assert len(line) < 2000, line
    for pattern in patterns:
        assert re.search(pattern, line), f"{pattern!r} not in {line!r}"


CLI_CASES = [
    ("step-of-99999999-tasks", srun(SLURM_NTASKS="99999999", SLURM_STEP_TASKS_PER_NODE="99999999",
                                    SLURM_STEP_NODELIST="a"), [r"SLURM_NTASKS"]),
    ("99999999-tasks-on-one-node", srun(SLURM_NTASKS="10000", SLURM_STEP_TASKS_PER_NODE="99999999",
                                        SLURM_STEP_NODELIST="a"), [r"SLURM_STEP_TASKS_PER_NODE"]),
    ("200-ranges", srun(SLURM_STEP_NODELIST=two_hundred_ranges()),
     [r"SLURM_STEP_NODELIST", r"more than 100,000 hosts"]),
    ("procid-5000-digits", srun(SLURM_PROCID="9" * 5000), [r"SLURM_PROCID"]),
    ("node-name-with-quote", srun(SLURM_STEP_NODELIST="a',b"), [r"SLURM_STEP_NODELIST"]),
    ("completion-index-5000-digits", pod(JOB_COMPLETION_INDEX="9" * 5000),
     [r"JOB_COMPLETION_INDEX"]),
    ("cluster-spec-task-type-list", {"CLUSTER_SPEC": spec(task={"type": ["workerpool0"]})},
     [r"CLUSTER_SPEC's task type"]),
    ("cluster-spec-empty-object", {"CLUSTER_SPEC": "{}"}, [r"CLUSTER_SPEC"]),
    ("cluster-spec-blank", {"CLUSTER_SPEC": " "}, [r"CLUSTER_SPEC is set but blank"]),
    ("tf-config-too-large", srun(SLURM_NTASKS="9000", SLURM_STEP_TASKS_PER_NODE="1(x9000)",
                                 SLURM_STEP_NODELIST="node-of-the-rack[0001-9000]",
                                 SLURM_PROCID="0", SLURM_NODEID="0",
                                 SLURMD_NODENAME="node-of-the-rack0001", SLURM_LOCALID="0"),
     [r"9,000-task cluster", r"131072 bytes"]),
]


@pytest.mark.multiprocess
@pytest.mark.parametrize("environ,patterns", [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_the_cli_refuses_a_hostile_environment_in_one_line(tmp_path, environ, patterns):
    code, out, err = run_exec(tmp_path, environ)
    assert_one_line(code, err, 2, *patterns)
    assert out == ""


def _not_executable(tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text("echo hi\n")
    return str(path)


def _bad_format(tmp_path):
    path = tmp_path / "bad.bin"
    path.write_bytes(b"\x7fELF\x00\x00garbage")
    path.chmod(0o755)
    return str(path)


COMMANDS = [
    ("not-found", lambda t: "no-such-command-tfdist", 127, r"No such file or directory"),
    ("missing-path", lambda t: str(t / "missing" / "x"), 127, r"No such file or directory"),
    ("not-executable", _not_executable, 126, r"Permission denied"),
    ("directory", lambda t: str(t), 126, r"Permission denied"),
    ("exec-format-error", _bad_format, 126, r"Exec format error"),
    ("empty-name", lambda t: "", 2, r"cannot run ''"),
]


@pytest.mark.multiprocess
@pytest.mark.parametrize("build,expected,pattern", [c[1:] for c in COMMANDS],
                         ids=[c[0] for c in COMMANDS])
def test_a_command_that_cannot_run_is_one_line_with_a_shells_exit_code(tmp_path, build,
                                                                       expected, pattern):
    command = build(tmp_path)
    code, _, err = run_exec(tmp_path, srun(SLURM_PROCID="0", SLURM_LOCALID="0"), [command, "x"])
    assert_one_line(code, err, expected, r"cannot run ", pattern)
    assert f"cannot run {command!r}: " in err


@pytest.mark.multiprocess
def test_an_environment_beyond_arg_max_is_one_line(tmp_path):
    """A stack limit of 512 KiB makes Linux's ARG_MAX its floor, 128 KiB: tfdist starts
    8,000 bytes short of it, and the 13 KB TF_CONFIG of 1,000 tasks does not fit (E2BIG)."""
    environ = srun(SLURM_NTASKS="1000", SLURM_STEP_TASKS_PER_NODE="1(x1000)",
                   SLURM_STEP_NODELIST="n[0001-1000]", SLURM_PROCID="0", SLURM_NODEID="0",
                   SLURMD_NODENAME="n0001", SLURM_LOCALID="0", PADDING="")
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_PREFIXES)}
    argv = [PY, "-m", "tfdist", "exec", str(tmp_path / "job.yaml"), "--", "true"]
    used = sum(len(k) + len(v) + 2 + 8 for k, v in {**env, **environ}.items())
    used += sum(len(a) + 1 + 8 for a in argv)
    environ["PADDING"] = "x" * (128 * 1024 - 8000 - used)
    code, _, err = run_exec(tmp_path, environ, ["true"], stack=512 * 1024)
    assert_one_line(code, err, 2, r"cannot run 'true': Argument list too long",
                    r"arguments and environment take about [\d,]+ bytes \(TF_CONFIG 13,")


@pytest.mark.multiprocess
def test_the_cli_still_runs_a_valid_task(tmp_path):
    show = [PY, "-c", "import os; print(os.environ['TF_CONFIG'])"]
    code, out, err = run_exec(tmp_path, srun(), show)
    assert code == 0, err
    assert json.loads(out)["task"] == {"type": "worker", "index": 0}


# --- generated environments -----------------------------------------------------------------

FUZZ = settings(max_examples=500, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TIME_LIMIT = 5  # seconds per generated case, on a loaded machine
MEMORY_CAP = 32 * MIB  # peak allocation per generated case


def mostly(usual, other, percent=75):
    """`usual` in `percent`% of the cases, else `other`."""
    return st.integers(0, 99).flatmap(lambda i: usual if i < percent else other)


numbers = st.one_of(st.integers(0, 12).map(str), st.integers(0, 10 ** 12).map(str),
                    st.integers(1, 5000).map(lambda n: "9" * n), st.just("10001"),
                    st.sampled_from(["", "-1", "+1", " 1", "1 ", "١", "²", "0x10", "1e3", "01"]),
                    st.text(max_size=6))
names = st.from_regex(r"[a-z][a-z0-9_.-]{0,6}", fullmatch=True)
ranges = st.one_of(
    st.tuples(st.integers(0, 30), st.integers(0, 30)).map(lambda r: f"{r[0]:02d}-{r[1]:02d}"),
    st.integers(0, 99).map(str),
    st.tuples(st.integers(0, 10 ** 20), st.integers(0, 10 ** 20)).map(lambda r: f"{r[0]}-{r[1]}"),
    st.text(alphabet="0123456789-,x ", max_size=6))
patterns = st.one_of(
    names,
    st.tuples(names, st.lists(ranges, min_size=1, max_size=4), st.sampled_from(["", "-x", ".a"]))
    .map(lambda p: f"{p[0]}[{','.join(p[1])}]{p[2]}"),
    st.text(alphabet="ab[]-,.:_ 1\n\x1b'", max_size=12),
    st.sampled_from(["a" * 64, "a." * 127, "-a", "a-", "[::1]", two_hundred_ranges(),
                     "a[0-999]b[0-999]"]))
host_lists = st.lists(patterns, min_size=1, max_size=4).map(",".join)
per_node_parts = st.lists(st.tuples(mostly(st.integers(1, 4), st.just(0), 95),
                                    mostly(st.integers(1, 3), st.just(0), 95)),
                          min_size=1, max_size=4)
hostile_per_node = st.one_of(st.sampled_from(["99999999", "1(x99999999)", "2(3)", "", ",",
                                              "9" * 80]),
                             st.text(alphabet="0123456789(x),", max_size=10))


def assert_valid_task(task):
    """A cluster of ``host:port`` addresses with ports in 1..65535 and the task in it."""
    cluster, job, index = task
    assert isinstance(cluster, dict) and cluster
    for addresses in cluster.values():
        for address in addresses:
            assert 1 <= parse_address(address).port <= 65535
    assert isinstance(index, int) and 0 <= index < len(cluster[job])
    text = environment.passable_tf_config(cluster, job, index)
    assert parse_tf_config(text)["cluster"] == cluster  # the training script's own check


def check_bounded(result, seconds, peak):
    assert seconds < TIME_LIMIT, f"{seconds:.1f} s"
    assert peak < MEMORY_CAP, f"peak allocation {peak:,} bytes"
    event("refused" if isinstance(result, ClusterError) else "a cluster")
    if isinstance(result, ClusterError):
        message = str(result)
        assert "\n" not in message and len(message) < 3000, message[:3000]
    else:
        assert_valid_task(result)


@FUZZ
@given(hosts=host_lists, parts=mostly(per_node_parts, hostile_per_node),
       ntasks=mostly(st.none(), numbers), values=st.fixed_dictionaries({
           "SLURM_PROCID": mostly(st.integers(0, 3).map(str), numbers)}, optional={
           "SLURM_NODEID": numbers, "SLURM_LOCALID": numbers, "SLURMD_NODENAME": names}),
       use_job_list=st.booleans())
def test_generated_slurm_environments(hosts, parts, ntasks, values, use_job_list):
    """Random host lists, tasks per node and numbers; SLURM_NTASKS (when None) agrees with
    the tasks per node, so that the host list is read too."""
    if isinstance(parts, list):
        per_node = ",".join(f"{n}(x{k})" if k > 1 else str(n) for n, k in parts)
        ntasks = str(sum(n * k for n, k in parts)) if ntasks is None else ntasks
    else:
        per_node, ntasks = parts, "3" if ntasks is None else ntasks
    environ = {"SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_NTASKS": ntasks, **values,
               "SLURM_JOB_NODELIST" if use_job_list else "SLURM_STEP_NODELIST": hosts}
    check_bounded(*measured(lambda: environment.scheduled_task(SLURM, environ)))


@FUZZ
@given(data=st.data(), nodes=st.integers(1, 6))
def test_generated_consistent_slurm_steps(data, nodes):
    """Steps consistent enough to succeed often: the same checks on the results."""
    hosts = data.draw(st.lists(names, min_size=nodes, max_size=nodes, unique=True))
    counts = data.draw(st.lists(st.integers(1, 4), min_size=nodes, max_size=nodes))
    total = sum(counts)
    rank = data.draw(st.one_of(st.integers(0, total - 1), st.integers(0, 10 ** 6)))
    environ = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(total),
               "SLURM_STEP_NODELIST": ",".join(hosts),
               "SLURM_STEP_TASKS_PER_NODE": ",".join(map(str, counts))}
    result = measured(lambda: environment.scheduled_task(SLURM, environ))
    check_bounded(*result)
    if total >= 2 and rank < total and not isinstance(result[0], ClusterError):
        assert sum(map(len, result[0][0].values())) == total


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2, 10 ** 30), st.floats(),
              st.text(max_size=8),
              st.sampled_from(["a:1", "b-0:2222", "[::1]:80", "h:0", "h:99999", "a b:1",
                               "workerpool0", "workerpool1", "workerpool3"])),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(max_size=4), children, max_size=3)),
    max_leaves=10)
good_addresses = st.lists(st.sampled_from(["a:1", "b-0:2222", "[::1]:80", "10.0.0.1:9"]),
                          min_size=1, max_size=3)
addresses = st.one_of(good_addresses, good_addresses, st.lists(
    st.one_of(st.sampled_from(["a:1", "b-0:2222"]), json_values), max_size=3), json_values)
pools = st.sampled_from(["workerpool0", "workerpool1", "workerpool2", "workerpool3"])
indexes = st.one_of(st.integers(0, 2), st.integers(0, 2), json_values)


@st.composite
def consistent_specs(draw):
    """CLUSTER_SPECs whose task is in their cluster (often valid)."""
    cluster = draw(st.dictionaries(pools, good_addresses, min_size=1, max_size=4))
    pool = draw(st.sampled_from(sorted(cluster)))
    index = draw(st.integers(0, len(cluster[pool]) - 1))
    return {"cluster": cluster, "task": {"type": pool, "index": index}}


@FUZZ
@given(document=st.one_of(
    json_values, consistent_specs(),
    st.fixed_dictionaries({
        "cluster": st.one_of(st.dictionaries(pools, addresses, max_size=4), json_values),
        "task": st.one_of(st.fixed_dictionaries({"type": st.one_of(pools, pools, json_values)},
                                                optional={"index": indexes}),
                          json_values)},
        optional={"environment": json_values, "job": json_values})))
def test_generated_cluster_specs(document):
    raw = json.dumps(document)
    check_bounded(*measured(lambda: environment.scheduled_task(COUNTS, {"CLUSTER_SPEC": raw})))


@FUZZ
@given(document=st.one_of(json_values, st.fixed_dictionaries(
    {"cluster": st.one_of(st.dictionaries(st.sampled_from(["chief", "worker", "ps"]),
                                          addresses, max_size=3), json_values),
     "task": st.one_of(st.fixed_dictionaries({"type": st.one_of(st.just("worker"), json_values),
                                              "index": indexes}), json_values)})))
def test_generated_tf_configs(document):
    raw = json.dumps(document)
    result, seconds, peak = measured(lambda: parse_tf_config(raw))
    assert seconds < TIME_LIMIT and peak < MEMORY_CAP
    event("refused" if isinstance(result, ClusterError) else "read")
    if isinstance(result, ClusterError):
        assert "TF_CONFIG" in str(result) and "\n" not in str(result)
    elif result is not None:
        for job, listed in result.get("cluster", {}).items():
            for address in listed:
                parse_address(address)


@pytest.mark.multiprocess
@pytest.mark.parametrize("islands, ok", [(2, False), ("[[0], [1, 2], [3]]", False), (3, True),
                                         ("host", True)])
def test_exec_checks_islands_against_the_steps_counted_tasks_as_validate_does(tmp_path,
                                                                              islands, ok):
    """A SLURM step of 3 tasks: `islands: 2` is what `validate` refuses for 3 workers; exec
    refuses it the same way, before the command runs (here `true`)."""
    config = tmp_path / "job.yaml"
    config.write_text("cluster: {slurm: {chief: 1, port: 7000}}\n"
                      "strategy: multi_worker_mirrored\n"
                      f"local_sgd: {{period: 4, islands: {islands}}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_PREFIXES)}
    env.update(srun())
    result = subprocess.run([PY, "-m", "tfdist", "exec", str(config), "--", "true"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT,
                            stdin=subprocess.DEVNULL)
    if ok:
        assert result.returncode == 0, result.stderr[-2000:]
    else:
        assert_one_line(result.returncode, result.stderr, 2, r"local_sgd\.islands",
                        r"step", r"3" if islands == 2 else r"every worker index")
    sections = {"cluster": {"chief": 1, "worker": 2}, "strategy": "multi_worker_mirrored",
                "local_sgd": {"period": 4, "islands": islands if islands in (2, 3, "host")
                              else json.loads(islands)}}
    try:  # what validate says of the same islands on a cluster of 3 counted tasks
        config_from_dict(sections)
        validated = True
    except ConfigError:
        validated = False
    assert validated == ok
