"""`tfdist launch` end to end: real processes on localhost.

Tasks are tiny `python -c` scripts (no TensorFlow) that report what they saw into files in
`tmp_path`; only the parameter_server test starts real TF servers. Every process a test
starts carries a unique token in its environment, and the `env` fixture kills whatever
still carries it afterwards, so a failing test leaves nothing behind.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

pytestmark = pytest.mark.multiprocess

PY = sys.executable
TIMEOUT = 30  # seconds for any launcher run that should finish quickly
TWO_WORKERS = "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"

# Prepended to every task script; sys.argv[1] is the test's tmp_path.
PRELUDE = """\
import json, os, subprocess, sys, time
from pathlib import Path

out = Path(sys.argv[1])
tf_config = json.loads(os.environ["TF_CONFIG"]) if "TF_CONFIG" in os.environ else None
name = f"{tf_config['task']['type']}:{tf_config['task']['index']}" if tf_config else "main"

def report(kind, text):
    tmp = out / f".{name}.{kind}.tmp"
    tmp.write_text(text)
    os.replace(tmp, out / f"{name}.{kind}")

def wait_for(*files):
    deadline = time.monotonic() + 20
    while not all((out / f).exists() for f in files):
        if time.monotonic() > deadline:
            sys.exit(f"{name}: timed out waiting for {files}")
        time.sleep(0.05)
"""


# --- helpers -------------------------------------------------------------------------------

def task(body, tmp_path):
    """The argv of a small task script: PRELUDE + `body`."""
    return [PY, "-c", PRELUDE + textwrap.dedent(body), str(tmp_path)]


def cli(config, *options, command):
    return [PY, "-m", "tfdist", "launch", config, *options, "--", *command]


def run_launch(config, *options, command, env, timeout=TIMEOUT):
    """Runs `tfdist launch` to the end; returns the CompletedProcess (text)."""
    return subprocess.run(cli(config, *options, command=command), env=env,
                          cwd=os.path.dirname(config), capture_output=True, text=True,
                          timeout=timeout)


def start_launch(config, *options, command, env):
    return subprocess.Popen(cli(config, *options, command=command), env=env,
                            cwd=os.path.dirname(config), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=TIMEOUT):
    """(returncode, stdout, stderr) of a started launcher; kills it if it hangs."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"launcher did not exit within {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return proc.returncode, out, err


def wait_for_pids(tmp_path, names, proc=None, timeout=20):
    """Waits until every `names` file in tmp_path exists; returns {name: pid}."""
    deadline = time.monotonic() + timeout
    while not all((tmp_path / n).exists() for n in names):
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"launcher exited early with {proc.returncode}: {proc.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"tasks did not write {names} within {timeout}s")
        time.sleep(0.05)
    return {n: int((tmp_path / n).read_text()) for n in names}


def alive(pid):
    """True while `pid` is a running (not zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # an orphan may linger as a zombie until init reaps it: it runs no more
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_gone(pids, timeout=5):
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], f"still running among {pids}"


def processes_with(token, in_cmdline=""):
    """PIDs of live processes whose environment carries `token` (and cmdline the text)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if token.encode() in environ and in_cmdline in cmdline and alive(int(entry)):
            pids.append(int(entry))
    return pids


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture
def token():
    return f"tfdist-test-{uuid.uuid4().hex}"


@pytest.fixture
def env(token):
    """The launcher's environment: no TF_CONFIG, plus a token that marks our processes."""
    environ = dict(os.environ, TFDIST_TEST_TOKEN=token)
    environ.pop("TF_CONFIG", None)
    yield environ
    for pid in processes_with(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- every task, its TF_CONFIG and its output ------------------------------------------------

def test_each_task_gets_its_own_tf_config_and_prefixed_output(tmp_path, write_config, env):
    config = write_config("""
        cluster: {chief: 1, worker: 2}
        strategy: multi_worker_mirrored
    """)
    result = run_launch(config, env=env, command=task("""
        report("tf_config", os.environ["TF_CONFIG"])
        print("hello from", name)
        print("second line")
    """, tmp_path))

    assert result.returncode == 0, result.stderr
    names = ["chief:0", "worker:0", "worker:1"]
    assert sorted(p.name for p in tmp_path.glob("*.tf_config")) == [f"{n}.tf_config" for n in names]
    seen = {n: json.loads((tmp_path / f"{n}.tf_config").read_text()) for n in names}
    cluster = seen["chief:0"]["cluster"]
    assert sorted(cluster) == ["chief", "worker"]
    assert len(cluster["chief"]) == 1 and len(cluster["worker"]) == 2
    addresses = cluster["chief"] + cluster["worker"]
    assert all(a.rpartition(":")[0] in ("localhost", "127.0.0.1") for a in addresses)
    ports = [int(a.rpartition(":")[2]) for a in addresses]
    assert len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)
    for n, tf_config in seen.items():
        job, index = n.split(":")
        assert tf_config["cluster"] == cluster
        assert tf_config["task"] == {"type": job, "index": int(index)}

    lines = result.stdout.splitlines()
    for n in names:
        assert f"[{n}] hello from {n}" in lines
        assert f"[{n}] second line" in lines
    assert len(lines) == 6
    assert all(line.startswith(tuple(f"[{n}] " for n in names)) for line in lines)


# --- failures and restarts -------------------------------------------------------------------

def test_failing_task_stops_the_job_and_every_process(tmp_path, write_config, env):
    config = write_config("""
        cluster: {chief: 1, worker: 2}
        strategy: multi_worker_mirrored
    """)
    started = time.monotonic()
    result = run_launch(config, env=env, command=task("""
        if name == "worker:1":
            wait_for("chief:0.pid", "worker:0.pid", "worker:0.grandchild")
            sys.exit(3)
        if name == "worker:0":
            grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            report("grandchild", str(grandchild.pid))
        report("pid", str(os.getpid()))
        time.sleep(60)
    """, tmp_path))
    elapsed = time.monotonic() - started

    assert result.returncode == 3, result.stderr
    assert elapsed < 20
    assert "worker:1" in result.stderr and "code 3" in result.stderr
    assert "Traceback" not in result.stderr
    pids = wait_for_pids(tmp_path, ["chief:0.pid", "worker:0.pid", "worker:0.grandchild"])
    assert_gone(pids.values())


def test_launch_n_runs_that_many_workers_as_a_config_of_counts_would(tmp_path, env):
    """`tfdist launch -n 3 -- CMD` (horovodrun -np 3): no config file, three local workers
    under multi_worker_mirrored, each with the TF_CONFIG `cluster: {worker: 3}` gives."""
    command = task("""
        report("tf_config", os.environ["TF_CONFIG"])
        print("hello from", name)
    """, tmp_path)
    result = subprocess.run([PY, "-m", "tfdist", "launch", "-n", "3", "--", *command], env=env,
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    names = [f"worker:{i}" for i in range(3)]
    seen = {n: json.loads((tmp_path / f"{n}.tf_config").read_text()) for n in names}
    assert sorted(p.name for p in tmp_path.glob("*.tf_config")) == [f"{n}.tf_config" for n in names]
    cluster = seen["worker:0"]["cluster"]
    assert list(cluster) == ["worker"] and len(set(cluster["worker"])) == 3
    for i, n in enumerate(names):
        assert seen[n]["cluster"] == cluster
        assert seen[n]["task"] == {"type": "worker", "index": i}
        assert f"[{n}] hello from {n}" in result.stdout.splitlines()


def test_failed_task_is_restarted_with_the_same_tf_config(tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, "--max-restarts", "1", env=env, command=task("""
        if name == "worker:1":
            with open(out / "attempts", "a") as f:
                f.write(os.environ["TF_CONFIG"] + "\\n")
            if not (out / "failed-once").exists():
                (out / "failed-once").touch()
                sys.exit(1)
    """, tmp_path))

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "failed-once").exists()
    assert re.search(r"worker:1\b.*restarting the whole job \(1/1\)", result.stderr), result.stderr
    attempts = (tmp_path / "attempts").read_text().splitlines()
    assert len(attempts) == 2 and attempts[0] == attempts[1]


def test_task_that_keeps_failing_is_run_one_plus_max_restarts_times(tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, "--max-restarts", "1", env=env, command=task("""
        if name == "worker:1":
            with open(out / "attempts", "a") as f:
                f.write("attempt\\n")
            sys.exit(4)
    """, tmp_path))

    assert result.returncode == 4, result.stderr
    assert (tmp_path / "attempts").read_text().splitlines() == ["attempt", "attempt"]
    assert "(1/1)" in result.stderr and "(2/1)" not in result.stderr
    assert "worker:1 exited with code 4; stopping the other tasks" in result.stderr


def test_a_synchronous_job_restarts_every_task_after_a_failure(tmp_path, write_config, env):
    """MultiWorkerMirroredStrategy's collective group cannot take in a restarted worker:
    the healthy worker is restarted too, in the same launch."""
    config = write_config(TWO_WORKERS)
    result = run_launch(config, "--max-restarts", "1", env=env, command=task("""
        with open(out / f"{name}.starts", "a") as f:
            f.write(f"{os.getpid()}\\n")
        if name == "worker:1" and not (out / "failed-once").exists():
            wait_for("worker:0.starts")
            (out / "failed-once").touch()
            sys.exit(1)
        time.sleep(0.5)
    """, tmp_path))
    assert result.returncode == 0, result.stderr + result.stdout
    for name in ("worker:0", "worker:1"):
        starts = (tmp_path / f"{name}.starts").read_text().split()
        assert len(starts) == 2 and starts[0] != starts[1]


def test_a_hung_task_is_reported_by_name_and_the_job_stops(tmp_path, write_config, env):
    """worker:1 blocks without output or CPU (like a collective whose peer died); worker:0
    keeps computing without output (busy is not hung)."""
    config = write_config(TWO_WORKERS)
    started = time.monotonic()
    result = run_launch(config, "--hang-seconds", "3", env=env, command=task("""
        report("pid", str(os.getpid()))
        if name == "worker:1":
            time.sleep(60)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            pass
        report("done", "")
    """, tmp_path))
    assert result.returncode == 137, result.stderr
    assert re.search(r"worker:1 is hung: no output and no CPU time for 3s", result.stderr)
    assert "worker:0 is hung" not in result.stderr
    assert time.monotonic() - started < 20
    assert_gone(wait_for_pids(tmp_path, ["worker:0.pid", "worker:1.pid"]).values())


def test_tasks_temporary_files_are_removed_even_when_killed(tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    proc = start_launch(config, "--grace-seconds", "1", env=env, command=task("""
        import signal, tempfile
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # SIGKILLed: no chance to clean up
        scratch = tempfile.mkdtemp(prefix="scratch-")
        Path(scratch, "big.bin").write_bytes(b"x" * 1000)
        report("scratch", scratch)
        report("pid", str(os.getpid()))
        time.sleep(60)
    """, tmp_path))
    pids = wait_for_pids(tmp_path, ["worker:0.pid", "worker:1.pid"], proc)
    scratch = [(tmp_path / f"worker:{i}.scratch").read_text() for i in range(2)]
    assert all(os.path.isdir(path) for path in scratch) and scratch[0] != scratch[1]
    proc.send_signal(signal.SIGTERM)
    returncode, _, err = finish(proc, timeout=15)
    assert returncode == 143, err
    assert_gone(pids.values())
    assert not any(os.path.exists(path) for path in scratch)


# --- signals to the launcher -----------------------------------------------------------------

SLEEPER = """
    report("pid", str(os.getpid()))
    time.sleep(60)
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
def test_signal_to_launcher_stops_every_task(tmp_path, write_config, env, sig, code):
    config = write_config(TWO_WORKERS)
    proc = start_launch(config, "--grace-seconds", "5", env=env, command=task(SLEEPER, tmp_path))
    pids = wait_for_pids(tmp_path, ["worker:0.pid", "worker:1.pid"], proc)

    sent = time.monotonic()
    proc.send_signal(sig)
    returncode, _, err = finish(proc, timeout=15)

    assert returncode == code, err
    assert time.monotonic() - sent < 5
    assert f"received {sig.name}" in err
    assert "Traceback" not in err
    assert_gone(pids.values())


def test_task_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    proc = start_launch(config, "--grace-seconds", "1", env=env, command=task("""
        import signal
        if name == "worker:0":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        report("pid", str(os.getpid()))
        time.sleep(60)
    """, tmp_path))
    pids = wait_for_pids(tmp_path, ["worker:0.pid", "worker:1.pid"], proc)

    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    returncode, _, err = finish(proc, timeout=15)
    elapsed = time.monotonic() - sent

    assert returncode == 143, err
    assert 1.0 <= elapsed < 6
    assert "worker:0 did not stop within 1s; killing it" in err
    assert "worker:1 did not stop" not in err
    assert_gone(pids.values())


# --- jobs that must not start ----------------------------------------------------------------

def test_port_in_use_is_reported_before_anything_runs(tmp_path, write_config, env):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (other,) = free_ports(1)  # cannot be `port`: that one is bound
        config = write_config(f"""
            cluster: {{worker: ["localhost:{port}", "localhost:{other}"]}}
            strategy: multi_worker_mirrored
        """)
        result = run_launch(config, env=env, command=task('(out / "ran").touch()', tmp_path))

    assert result.returncode == 2
    assert "worker:0" in result.stderr and "in use" in result.stderr
    assert str(port) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ran").exists()


def test_non_local_address_is_refused_with_a_hint_about_task(tmp_path, write_config, env):
    (port,) = free_ports(1)
    config = write_config(f"""
        cluster: {{worker: ["localhost:{port}", "10.1.2.3:2222"]}}
        strategy: multi_worker_mirrored
    """)
    started = time.monotonic()
    result = run_launch(config, env=env, command=task('(out / "ran").touch()', tmp_path))

    assert result.returncode == 2
    assert time.monotonic() - started < 10
    assert "worker:1" in result.stderr and "10.1.2.3:2222" in result.stderr
    assert "--task" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ran").exists()


def test_unresolvable_host_is_reported_naming_the_task(tmp_path, write_config, env):
    (port,) = free_ports(1)
    config = write_config(f"""
        cluster: {{worker: ["localhost:{port}", "nohost.invalid:2222"]}}
        strategy: multi_worker_mirrored
    """)
    result = run_launch(config, "--task", "worker:0", env=env,
                        command=task('(out / "ran").touch()', tmp_path))
    assert result.returncode == 2
    assert "worker:1 is at nohost.invalid:2222, but host 'nohost.invalid' cannot be resolved" \
        in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ran").exists()


def test_missing_command_is_reported_without_traceback(tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, env=env, command=["/nonexistent/binary", "--flag"])

    assert result.returncode == 2
    assert "/nonexistent/binary" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


# --- one task, or no cluster -----------------------------------------------------------------

def test_task_option_runs_only_that_task(tmp_path, write_config, env):
    (port,) = free_ports(1)
    config = write_config(f"""
        cluster: {{worker: ["10.1.2.3:2222", "localhost:{port}"]}}
        strategy: multi_worker_mirrored
    """)
    result = run_launch(config, "--task", "worker:1", env=env, command=task("""
        report("tf_config", os.environ["TF_CONFIG"])
        print("running")
    """, tmp_path))

    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.glob("*.tf_config")] == ["worker:1.tf_config"]
    tf_config = json.loads((tmp_path / "worker:1.tf_config").read_text())
    assert tf_config["cluster"] == {"worker": ["10.1.2.3:2222", f"localhost:{port}"]}
    assert tf_config["task"] == {"type": "worker", "index": 1}
    assert result.stdout.splitlines() == ["[worker:1] running"]


def test_task_option_with_a_task_count_is_refused(tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, "--task", "worker:1", env=env,
                        command=task('(out / "ran").touch()', tmp_path))

    assert result.returncode == 2
    assert "cluster.worker" in result.stderr and "host:port" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ran").exists()


def test_without_cluster_the_command_runs_once_without_tf_config(tmp_path, write_config, env):
    config = write_config("strategy: mirrored\n")
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["localhost:1"]},
                                   "task": {"type": "worker", "index": 0}})
    result = run_launch(config, env=env, command=task("""
        print("TF_CONFIG:", os.environ.get("TF_CONFIG"))
        with open(out / "runs", "a") as f:
            f.write(name + "\\n")
    """, tmp_path))

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[main] TF_CONFIG: None"]
    assert (tmp_path / "runs").read_text() == "main\n"


# --- parameter_server with real TensorFlow ---------------------------------------------------

CHIEF_SCRIPT = """
import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    v = tf.Variable(0.0)


@tf.function
def step():
    v.assign_add(1.0)


for _ in range(20):
    coordinator.schedule(step)
coordinator.join()

workers = sorted({d.name.split("/device:")[0] for d in tf.config.list_logical_devices()
                  if "/job:worker/" in d.name})
print("variable device:", v.device, flush=True)
print("worker devices:", " ".join(workers), flush=True)
print("final value:", float(v.numpy()), flush=True)
"""


def test_parameter_server_job_trains_and_stops_its_servers(tmp_path, write_config, env, token):
    config = write_config("""
        cluster: {chief: 1, worker: 2, ps: 1}
        strategy: parameter_server
    """)
    script = tmp_path / "chief.py"
    script.write_text(CHIEF_SCRIPT)
    result = run_launch(config, env=env, command=[PY, str(script)], timeout=180)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    lines = result.stdout.splitlines()
    assert "[chief:0] final value: 20.0" in lines
    assert "[chief:0] variable device: /job:ps/replica:0/task:0/device:CPU:0" in lines
    assert ("[chief:0] worker devices: /job:worker/replica:0/task:0 "
            "/job:worker/replica:0/task:1") in lines
    for server in ("worker:0", "worker:1", "ps:0"):
        assert any(line.startswith(f"[{server}] tfdist server: {server} serving at")
                   for line in lines), server

    deadline = time.monotonic() + 10
    while processes_with(token, "tfdist.launch.server") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(token, "tfdist.launch.server") == []


def test_each_task_is_a_process_group_of_its_own_in_the_launchers_session(
        tmp_path, write_config, env):
    """Each task is a process group of its own (signalled as one, with its children) in the
    launcher's session: Linux shares the CPU between sessions (autogroups), so a session
    per task would give a job of N tasks N shares against every other program on the
    machine, whatever their nice values."""
    config = write_config(TWO_WORKERS)
    result = run_launch(config, command=task("""
        report("ids", f"{os.getpid()} {os.getpgid(0)} {os.getsid(0)}")
    """, tmp_path), env=env)
    assert result.returncode == 0, result.stderr
    for name in ("worker:0", "worker:1"):
        pid, group, session = map(int, (tmp_path / f"{name}.ids").read_text().split())
        assert group == pid, name  # a group of its own
        assert session == os.getsid(0), name  # the launcher's: the test's own
