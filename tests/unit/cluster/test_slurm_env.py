"""SLURM without SLURM: host lists, task placement from simulated srun environments,
the ``cluster: slurm`` config section, `tfdist exec` and `tfdist sbatch`.

The real thing runs in tests/e2e/test_slurm.py.
"""

import json
import os
import random
import subprocess
import sys

import pytest

from tfdist.cluster.errors import ClusterError
from tfdist.cluster.slurm import (block_placement, expand_hostlist, expand_tasks_per_node,
                                  scheduled_task)
from tfdist.cluster.tf_config import check_matches, tf_config
from tfdist.config import ConfigError, config_from_dict, load_config

TFDIST = [sys.executable, "-m", "tfdist"]


def slurm_config(strategy="multi_worker_mirrored", **slurm):
    return config_from_dict({"cluster": {"slurm": slurm}, "strategy": strategy})


def srun_env(nodes, tasks_per_node, rank, **extra):
    """The SLURM variables srun gives task `rank` under block distribution, computed
    here by walking the nodes (independently of tfdist's placement code)."""
    hosts = expand_hostlist(nodes) if isinstance(nodes, str) else nodes
    counts = [int(n) for n in tasks_per_node.split(",")] if "(" not in tasks_per_node \
        else expand_tasks_per_node(tasks_per_node)
    start = 0
    for node_id, (host, count) in enumerate(zip(hosts, counts)):
        if rank < start + count:
            break
        start += count
    env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(sum(counts)),
           "SLURM_STEP_NODELIST": nodes if isinstance(nodes, str) else ",".join(nodes),
           "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "SLURM_NODEID": str(node_id),
           "SLURMD_NODENAME": host, "SLURM_LOCALID": str(rank - start)}
    return {**env, **extra}


# --- host lists -------------------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("node[01-04,07],gpu3", ["node01", "node02", "node03", "node04", "node07", "gpu3"]),
    ("vm", ["vm"]),
    ("a,b,c", ["a", "b", "c"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("x[3],y[1-2]z", ["x3", "y1z", "y2z"]),
    ("gpu-[0-1].cluster", ["gpu-0.cluster", "gpu-1.cluster"]),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, reason", [
    ("node[01-04", "unclosed bracket"),
    ("node01-04]", "unbalanced"),
    ("node[[1-2]]", "nested"),
    ("node[4-1]", "ends before it starts"),
    ("node[a-c]", "numbers or ranges"),
    ("node[1-2:2]", "numbers or ranges"),
    ("node[]", "numbers or ranges"),
    ("a,,b", "empty host name"),
    ("", "expected a SLURM host list"),
    ("n[0-99999999]", "more than 100,000 hosts"),
    ("a[0-999]b[0-999]", "more than 100,000 hosts"),
])
def test_bad_hostlists_are_named(text, reason):
    with pytest.raises(ClusterError, match="Received") as e:
        expand_hostlist(text)
    assert reason in str(e.value)


def test_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    assert expand_tasks_per_node("1,3(x2)") == [1, 3, 3]
    for bad in ("", "2(3)", "x", "2(x3", "-1", "2(x99999999)"):
        with pytest.raises(ClusterError, match="SLURM_STEP_TASKS_PER_NODE like 2"):
            expand_tasks_per_node(bad)


def test_block_placement_fills_each_node_in_order():
    assert block_placement(["a", "b"], [2, 1]) == [("a", 0), ("a", 1), ("b", 0)]
    with pytest.raises(ClusterError, match="2 node.* describes 3"):
        block_placement(["a", "b"], [1, 1, 1])


# --- a task from its environment ---------------------------------------------------------

def test_hand_written_cluster():
    """chief 1, ps 1, evaluator 1 on 6 tasks over n[1-2] (4 + 2 slots): ranks 0 chief,
    1 evaluator, 2 ps, 3..5 workers; ports count up per node."""
    config = slurm_config("parameter_server", chief=1, ps=1, evaluator=1, port=5000)
    expected = {"chief": ["n1:5000"], "worker": ["n1:5003", "n2:5000", "n2:5001"],
                "ps": ["n1:5002"], "evaluator": ["n1:5001"]}
    tasks = [("chief", 0), ("evaluator", 0), ("ps", 0), ("worker", 0), ("worker", 1),
             ("worker", 2)]
    for rank, (job, index) in enumerate(tasks):
        assert scheduled_task(config, srun_env("n[1-2]", "4,2", rank)) == (expected, job, index)


def test_not_slurm_is_none():
    assert scheduled_task(slurm_config(), {"JOBSET_NAME": "x"}) is None


def brute_force_cluster(hosts, counts, jobs, port):
    """{job: addresses} by simulating every rank: its node and local id from srun_env,
    its job by counting ranks in SlurmClusterResolver's order."""
    order = [job for job in ("chief", "evaluator", "ps", "worker") for _ in range(jobs[job])]
    cluster = {}
    for rank, job in enumerate(order):
        env = srun_env(hosts, ",".join(map(str, counts)), rank)
        address = f"{env['SLURMD_NODENAME']}:{port + int(env['SLURM_LOCALID'])}"
        cluster.setdefault(job, []).append(address)
    return cluster


@pytest.mark.parametrize("seed", range(25))
def test_random_allocations_match_a_brute_force_simulation(seed):
    rng = random.Random(seed)
    hosts = [f"node{i:02d}" for i in sorted(rng.sample(range(40), rng.randint(1, 5)))]
    counts = [rng.randint(1, 4) for _ in hosts]
    fixed = {"chief": rng.randint(0, 1), "evaluator": rng.randint(0, 1), "ps": rng.randint(0, 2)}
    if sum(counts) <= sum(fixed.values()):
        counts[0] += sum(fixed.values())
    jobs = {**fixed, "worker": sum(counts) - sum(fixed.values())}
    strategy = "parameter_server" if fixed["ps"] else "multi_worker_mirrored"
    if strategy == "parameter_server":
        fixed["chief"] = jobs["chief"] = 1
        jobs["worker"] = sum(counts) - sum(fixed.values())
        if jobs["worker"] < 1:
            counts[0] += 1
            jobs["worker"] += 1
    config = slurm_config(strategy, port=20000, **fixed)
    expected = brute_force_cluster(hosts, counts, jobs, 20000)
    seen = []
    for rank in range(sum(counts)):
        cluster, job, index = scheduled_task(
            config, srun_env(hosts, ",".join(map(str, counts)), rank))
        assert cluster == expected
        seen.append((job, index))
        # the TF_CONFIG tfdist exec writes passes the training script's own check
        check_matches(config.cluster, tf_config(cluster, job, index), "job.yaml")
    assert sorted(seen) == sorted((j, i) for j, n in jobs.items() for i in range(n))
    addresses = [a for job in expected.values() for a in job]
    assert len(set(addresses)) == len(addresses)


@pytest.mark.parametrize("seed", range(10))
def test_same_cluster_as_tensorflows_slurm_cluster_resolver(seed, monkeypatch):
    """TensorFlow's own resolver, given the same variables, builds the same cluster (its
    host sorting agrees here: zero-padded names sort as SLURM lists them)."""
    from tensorflow.python.distribute.cluster_resolver import SlurmClusterResolver

    rng = random.Random(seed)
    hosts = [f"gpu{i:03d}" for i in sorted(rng.sample(range(200), rng.randint(1, 4)))]
    counts = [rng.randint(1, 3) for _ in hosts]
    counts[0] += 2
    fixed = {"chief": 1, "evaluator": rng.randint(0, 1), "ps": 0}
    config = slurm_config(port=30000, **fixed)
    jobs = {**fixed, "worker": sum(counts) - 1 - fixed["evaluator"]}
    rank = rng.randrange(sum(counts))
    env = srun_env(",".join(hosts), ",".join(map(str, counts)), rank)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", env["SLURM_NTASKS"])
    resolver = SlurmClusterResolver(
        jobs={job: n for job, n in jobs.items() if n}, port_base=30000,
        gpus_per_node=max(counts), gpus_per_task=1, auto_set_gpu=False)
    theirs = resolver.cluster_spec().as_dict()
    cluster, job, index = scheduled_task(config, env)
    assert cluster == theirs
    assert (job, index) == resolver.get_task_info()


def test_slurm_node_order_is_the_lists_not_sorted():
    """node9 comes before node10 in SLURM's list: rank 0 runs on node9."""
    env = srun_env("node[9-10]", "1,1", 0)
    cluster, job, index = scheduled_task(slurm_config(port=7000), env)
    assert cluster == {"worker": ["node9:7000", "node10:7000"]} and (job, index) == ("worker", 0)


def test_falls_back_to_the_jobs_node_list():
    env = srun_env("a,b", "1,1", 1)
    env["SLURM_JOB_NODELIST"] = env.pop("SLURM_STEP_NODELIST")
    assert scheduled_task(slurm_config(port=7000), env)[0] == {"worker": ["a:7000", "b:7000"]}


@pytest.mark.parametrize("change, message", [
    ({"SLURM_PROCID": "3"}, "SLURM_PROCID must be below SLURM_NTASKS=3. Received: SLURM_PROCID=3"),
    ({"SLURM_NTASKS": "4"}, "adds up to 3 tasks but SLURM_NTASKS is 4"),
    ({"SLURM_NTASKS": "three"},
     "SLURM_NTASKS to be a whole number.*Received: SLURM_NTASKS='three'"),
    ({"SLURM_PROCID": "-1"}, "SLURM_PROCID to be a whole number"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2,1,1", "SLURM_NTASKS": "4"}, "2 node.* describes 3"),
    ({"SLURM_STEP_NODELIST": "a[1-"}, "unclosed bracket"),
    ({"SLURM_NODEID": "1"}, "SLURM_NODEID='1'.*block distribution"),
    ({"SLURMD_NODENAME": "b"}, "SLURMD_NODENAME='b'.*block distribution"),
    ({"SLURM_LOCALID": "0"}, "SLURM_LOCALID='0'.*--distribution=cyclic"),
    ({"SLURM_STEP_TASKS_PER_NODE": None}, "batch script, not a task of an srun step"),
    ({"SLURM_STEP_NODELIST": None}, "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"),
])
def test_bad_environments_are_named(change, message):
    env = srun_env("a,b", "2,1", 1)  # rank 1: a, local id 1
    for name, value in change.items():
        env.pop(name) if value is None else env.__setitem__(name, value)
    with pytest.raises(ClusterError, match=message):
        scheduled_task(slurm_config(chief=1, port=7000), env)


def test_too_few_tasks_for_the_config():
    config = slurm_config("parameter_server", chief=1, ps=2)
    with pytest.raises(ClusterError, match=r"needs 4 SLURM tasks or more \(1 chief, 2 ps, 0 "
                                           r"evaluator.*Received: SLURM_NTASKS=3"):
        scheduled_task(config, srun_env("a", "3", 0))


def test_ports_beyond_65535_are_refused():
    with pytest.raises(ClusterError, match="port 65535 \\+ 1 .* beyond 65535"):
        scheduled_task(slurm_config(port=65535), srun_env("a", "2", 0))


def test_a_config_without_cluster_slurm_under_srun():
    config = config_from_dict({"cluster": {"worker": 2}, "strategy": "multi_worker_mirrored"},
                              name="two.yaml")
    with pytest.raises(ClusterError, match="two.yaml does not say `cluster: {slurm"):
        scheduled_task(config, srun_env("a", "2", 0))


def test_check_matches_compares_the_fixed_counts():
    config = slurm_config("parameter_server", chief=1, ps=1)
    good = {"cluster": {"chief": ["a:1"], "worker": ["a:2", "a:3"], "ps": ["a:4"]},
            "task": {"type": "worker", "index": 1}}
    check_matches(config.cluster, good)
    wrong = {**good, "cluster": {**good["cluster"], "ps": ["a:4", "a:5"]}}
    with pytest.raises(ClusterError, match="disagrees with"):
        check_matches(config.cluster, wrong)
    with pytest.raises(ClusterError, match="known only under srun"):
        check_matches(config.cluster, None)


# --- the config section ------------------------------------------------------------------

def test_slurm_section_values_and_defaults(write_config):
    config = load_config(write_config("""
        cluster:
          slurm: {chief: 1, ps: 2, evaluator: 1, port: 23456}
        strategy: parameter_server
        """))
    c = config.cluster
    assert (c.scheduler, c.chief, c.ps, c.evaluator, c.port) == ("slurm", 1, 2, 1, 23456)
    assert c.minimum_tasks == 5
    bare = load_config(write_config("cluster: slurm\nstrategy: multi_worker_mirrored\n"))
    assert (bare.cluster.chief, bare.cluster.ps, bare.cluster.evaluator, bare.cluster.port) == (
        0, 0, 0, 2222)
    assert load_config(write_config("cluster: {slurm: }\n")).cluster == bare.cluster


@pytest.mark.parametrize("text, message", [
    ("cluster: {slurm: {chef: 1}}",
     "2: cluster.slurm.chef: unknown key 'chef'; did you mean 'chief'"),
    ("cluster: {slurm: {ps: -1}}\nstrategy: parameter_server",
     "cluster.slurm.ps: expected a value between 0 and 10000. Received: ps=-1"),
    ("cluster: {slurm: {chief: 2}}", "cluster.slurm.chief: expected a value between 0 and 1"),
    ("cluster: {slurm: {evaluator: true}}", "cluster.slurm.evaluator"),
    ("cluster: {slurm: {port: 0}}", "cluster.slurm.port: expected a value between 1 and 65535"),
    ("cluster: {slurm: {port: '2222'}}", "cluster.slurm.port"),
    ("cluster: {slurm: {worker: 2}}", "cluster.slurm.worker: under cluster: slurm: every SLURM "
                                      "task not a chief.*Received: worker=2"),
    ("cluster: {slurm: {}, worker: 2}", "cluster.worker: cluster: slurm: takes its tasks from "
                                        "SLURM.*Received: 'worker'"),
    ("cluster: {slurm: 3}", "cluster.slurm: expected a mapping"),
    ("cluster: {slurm: {ps: 1}}\nstrategy: multi_worker_mirrored",
     "cluster.slurm.ps: ps tasks need strategy name: parameter_server"),
    ("cluster: {slurm: {ps: 1}}\nstrategy: parameter_server",
     "cluster.slurm.chief: parameter_server needs a chief task"),
    ("cluster: {slurm: {chief: 1}}\nstrategy: parameter_server",
     "cluster.slurm.ps: parameter_server needs a ps task"),
    ("cluster: slurm\nstrategy: mirrored", "strategy.name: mirrored trains on one machine, but "
                                           "cluster: slurm"),
    ("cluster: slurmm", "cluster: expected a mapping of job types"),
])
def test_bad_slurm_sections_are_named(write_config, text, message):
    path = write_config("# a comment\n" + text + "\n")
    with pytest.raises(ConfigError, match=message) as e:
        load_config(path)
    assert path in str(e.value)


# --- the command line ----------------------------------------------------------------------

def cli(*args, env=None):
    return subprocess.run([*TFDIST, *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_validate_says_what_slurm_will_run(write_config):
    path = write_config("cluster: {slurm: {chief: 1, port: 23456}}\n"
                        "strategy: multi_worker_mirrored\n")
    result = cli("validate", path)
    assert result.returncode == 0
    assert result.stdout == (f"{path}: OK (strategy multi_worker_mirrored; tasks from SLURM "
                             "(chief×1, worker×the rest, at least 2; ports 23456+ per node))\n")


@pytest.mark.parametrize("command", [
    ["launch", "CONFIG", "--", "python", "x.py"],
    ["tf-config", "CONFIG", "--task", "worker:0"],
])
def test_launch_and_tf_config_point_to_sbatch_and_srun(write_config, command):
    path = write_config("cluster: slurm\nstrategy: multi_worker_mirrored\n")
    result = cli(*[path if a == "CONFIG" else a for a in command])
    assert result.returncode == 2 and result.stdout == ""
    assert "known only under srun" in result.stderr
    assert "tfdist sbatch" in result.stderr and "srun -n N tfdist exec" in result.stderr
    assert "Traceback" not in result.stderr


def test_exec_runs_the_command_with_the_tf_config(write_config, tmp_path):
    """`tfdist exec` in a simulated srun task: the command sees the TF_CONFIG that
    `tfdist tf-config` prints for the same task of a config listing the addresses."""
    path = write_config("cluster: {slurm: {chief: 1, port: 6000}}\n"
                        "strategy: multi_worker_mirrored\n")
    by_hand = write_config('cluster: {chief: ["a:6000"], worker: ["a:6001", "b:6000"]}\n'
                           "strategy: multi_worker_mirrored\n", name="by_hand.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.pop("TF_CONFIG", None)
    env.update(srun_env("a,b", "2,1", 2))
    result = cli("exec", path, "--", sys.executable, "-c",
                 "import os; print(os.environ['TF_CONFIG'])", env=env)
    assert result.returncode == 0, result.stderr
    expected = cli("tf-config", by_hand, "--task", "worker:1")
    assert json.loads(result.stdout) == json.loads(expected.stdout)


def test_exec_outside_any_scheduler(write_config):
    path = write_config("cluster: slurm\nstrategy: multi_worker_mirrored\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "JOBSET", "JOB_"))}
    result = cli("exec", path, "--", "true", env=env)
    assert result.returncode == 2 and "neither a JobSet pod" in result.stderr


def test_sbatch_script(write_config):
    path = write_config("cluster: {slurm: {chief: 1, ps: 1}}\nstrategy: parameter_server\n")
    result = cli("sbatch", path, "--ntasks", "5", "--nodes", "2", "--time", "01:00:00",
                 "--partition", "gpu", "--", "python", "train.py", "--name", "a b")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "chief x1, ps x1, worker x3" in lines[1]
    assert [l for l in lines if l.startswith("#SBATCH")] == [
        "#SBATCH --ntasks=5", "#SBATCH --signal=B:TERM@60", "#SBATCH --requeue",
        "#SBATCH --open-mode=append", "#SBATCH --nodes=2", "#SBATCH --time=01:00:00", "#SBATCH --partition=gpu"]
    assert (f"srun --distribution=block --kill-on-bad-exit=1 --label {sys.executable} -m "
            f"tfdist exec {path} -- python train.py --name 'a b' &") in lines
    assert 'scontrol requeue "$SLURM_JOB_ID"' in result.stdout
    check = subprocess.run(["bash", "-n"], input=result.stdout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_sbatch_defaults_to_the_fewest_tasks(write_config):
    path = write_config("cluster: {slurm: {chief: 1, evaluator: 1}}\n"
                        "strategy: multi_worker_mirrored\n")
    assert "#SBATCH --ntasks=3\n" in cli("sbatch", path, "--", "python", "t.py").stdout


@pytest.mark.parametrize("args, message", [
    (["--ntasks", "1"], "--ntasks must be at least 2 for this config.*Received: --ntasks=1"),
    (["--time", "1\nrm -rf /"], r"--time takes one word.*Received: '1\\nrm -rf /'"),
    (["--partition", "a b"], "--partition takes one word"),
    (["--ntasks", "x"], "expected a whole number"),
    ([], "no command given"),
])
def test_sbatch_bad_input(write_config, args, message):
    import re
    path = write_config("cluster: {slurm: {chief: 1}}\nstrategy: multi_worker_mirrored\n")
    tail = [] if not args else ["--", "python", "t.py"]
    result = cli("sbatch", path, *args, *tail)
    assert result.returncode == 2 and re.search(message, result.stderr), result.stderr


def test_sbatch_needs_a_slurm_config(write_config):
    path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    result = cli("sbatch", path, "--", "python", "t.py")
    assert result.returncode == 2
    assert "tfdist sbatch needs a config with `cluster: {slurm: {...}}`" in result.stderr


# --- parameter_server's servers end with the chief -------------------------------------------

def watch(tmp_path, chief_port, server_code):
    """Starts server_watch over a child running `server_code`; returns (watcher, pid file)."""
    tf = {"cluster": {"chief": [f"localhost:{chief_port}"], "worker": ["localhost:1"]},
          "task": {"type": "worker", "index": 0}}
    pid_file = tmp_path / "server.pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); " + server_code
    watcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist.cluster.server_watch", "--", sys.executable, "-c", code],
        env=dict(os.environ, TF_CONFIG=json.dumps(tf)))
    return watcher, pid_file


def stop(process, pid_file):
    import signal
    if process.poll() is None:
        process.kill()
        process.wait(30)
    if pid_file.exists() and pid_file.read_text():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.multiprocess
def test_server_watch_stops_the_server_once_the_chief_has_gone(tmp_path):
    import socket
    import time

    chief = socket.socket()
    chief.bind(("127.0.0.1", 0))
    chief.listen()
    watcher, pid_file = watch(tmp_path, chief.getsockname()[1], "time.sleep(600)")
    try:
        for _ in range(600):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.1)
        time.sleep(5)  # a few checks with the chief up: still serving
        assert watcher.poll() is None
        chief.close()
        assert watcher.wait(timeout=120) == 0
        with pytest.raises(ProcessLookupError):  # the server was stopped (and reaped)
            os.kill(int(pid_file.read_text()), 0)
    finally:
        chief.close()
        stop(watcher, pid_file)


@pytest.mark.multiprocess
def test_server_watch_passes_on_the_servers_own_exit(tmp_path):
    from tfdist.cluster.ports import free_ports

    watcher, pid_file = watch(tmp_path, free_ports(1)[0], "raise SystemExit(3)")
    try:
        assert watcher.wait(timeout=120) == 3
    finally:
        stop(watcher, pid_file)


def test_server_tasks_run_through_server_watch_under_slurm(write_config):
    """`tfdist exec` of a ps task in a simulated srun step runs the TF server watched."""
    path = write_config("cluster: {slurm: {chief: 1, ps: 1, port: 6000}}\n"
                        "strategy: parameter_server\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(srun_env("a", "3", 1))  # rank 1: the ps
    env["PATH"] = os.path.dirname(sys.executable)  # exec replaces itself: record the argv
    code = ("import os, sys; from tfdist.cluster import environment; "
            "from tfdist.config import load_config; "
            "os.execvpe = lambda f, argv, env: (print(argv), sys.exit(0)); "
            f"environment.exec_task(load_config({path!r}), ['python', 'train.py'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([sys.executable, "-m", "tfdist.cluster.server_watch",
                                         "--", sys.executable, "-m", "tfdist.launch.server"])


FAKE_SRUN = """#!/bin/bash
# stands in for srun: its tasks get SIGTERM, save and exit 143
trap 'echo TERM >> "$OUT/srun.log"; exit 143' TERM
echo $$ > "$OUT/srun.pid"
echo started >> "$OUT/srun.log"
if [ -n "${EARLY:-}" ]; then kill -TERM "$PPID"; fi  # the batch shell's SIGTERM, at once
while true; do sleep 0.05; done
"""
# stands in for scancel: SLURM signals the step's tasks (here: the stand-in srun)
FAKE_SCANCEL = """#!/bin/bash
echo "$@" >> "$OUT/scancel.log"
kill -TERM "$(cat "$OUT/srun.pid")"
"""


# stands in for scontrol: a requeue has SLURM end the batch script (the script waits for it)
FAKE_SCONTROL = """#!/bin/bash
echo "$@" >> "$OUT/scontrol.log"
kill -TERM "$PPID"
"""


@pytest.mark.parametrize("early", [False, True], ids=["while-training", "as-srun-starts"])
def test_the_batch_script_passes_sigterm_to_the_step_and_requeues_a_preemption(write_config,
                                                                                tmp_path, early):
    """The generated script run by bash, with stand-ins for srun, scancel and scontrol:
    SIGTERM to the batch shell (what SLURM's --signal=B:TERM and preemption send) has
    SLURM signal the step's tasks; the step's 143 makes the script requeue its job and wait
    for SLURM to end it (here: the stand-in scontrol's SIGTERM, which the script no longer
    traps). (tests/e2e/test_slurm.py does the same on a real SLURM.) `as-srun-starts`: the
    SIGTERM comes the moment the step exists — CI once saw it end a script whose trap was
    set after `srun &`, and the orphaned step run on."""
    import os
    import signal
    import time

    path = write_config("cluster: {slurm: {}}\nstrategy: multi_worker_mirrored\n")
    script = cli("sbatch", path, "--", "python", "train.py").stdout
    lines = script.splitlines()  # no moment without the trap once the step can exist
    trap = lines.index("""trap 'scancel --signal=TERM "$SLURM_JOB_ID"' TERM""")
    assert trap < next(i for i, line in enumerate(lines) if line.startswith("srun "))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(FAKE_SRUN)
    (fake / "scancel").write_text(FAKE_SCANCEL)
    (fake / "scontrol").write_text(FAKE_SCONTROL)
    for tool in ("srun", "scancel", "scontrol"):
        (fake / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OUT=str(tmp_path),
               SLURM_JOB_ID="42", **({"EARLY": "1"} if early else {}))
    job = subprocess.Popen(["bash", "-c", script], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "srun.log").exists() and not early:
            assert time.monotonic() < deadline and job.poll() is None, "srun never started"
            time.sleep(0.05)
        if not early:
            job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
        try:  # a stand-in srun the script left running
            os.kill(int((tmp_path / "srun.pid").read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    assert job.returncode == -signal.SIGTERM, stderr  # ended by "SLURM", not by exiting
    assert (tmp_path / "scancel.log").read_text().split() == ["--signal=TERM", "42"]
    assert (tmp_path / "srun.log").read_text().split() == ["started", "TERM"]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "42"]
    assert "preempted; requeueing job 42" in stderr
