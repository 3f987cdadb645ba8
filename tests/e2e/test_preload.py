"""`tfdist launch --preload`: tasks forked from one process that imported the modules
(`tfdist.launch.preload`), each as a fresh process would be, and every way it can go wrong
said in one line. Most tests preload the quick `json,numpy` (the mechanism is the same);
one trains on 2 workers with TensorFlow and Keras preloaded and compares with exec."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytestmark = pytest.mark.multiprocess

PY = sys.executable
TIMEOUT = 120
TWO = "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"

# What a task saw, reported to <out>/<task>.json (sys.argv[1] is out).
REPORT = """\
import json, os, sys
preloaded = sorted(m for m in ("json", "numpy", "tensorflow") if m in sys.modules)
import numpy as np
tf_config = json.loads(os.environ["TF_CONFIG"])
name = f"{tf_config['task']['type']}-{tf_config['task']['index']}"
seen = dict(preloaded=preloaded, argv=sys.argv, path0=sys.path[0], cwd=os.getcwd(),
            main=__name__, file=__file__, pid=os.getpid(), ppid=os.getppid(),
            pgid=os.getpgid(0), stdin=os.readlink("/proc/self/fd/0"),
            env=dict(os.environ), draw=float(np.random.rand()),
            tmp=__import__("tempfile").gettempdir(), comm=open("/proc/self/comm").read().strip())
with open("/proc/self/environ", "rb") as f:  # a forked task's: the server's, its TMPDIR too
    server_tmp = [e[7:] for e in f.read().decode().split("\\0") if e.startswith("TMPDIR=")][0]
try:
    seen["listed"] = open(os.path.join(server_tmp, "tasks", str(os.getpid()))).read()
except OSError:
    seen["listed"] = None
with open(os.path.join(sys.argv[1], name + ".json"), "w") as f:
    json.dump(seen, f)
"""


# The start of a task that looks at the server's tasks/PID files (sys.argv[1] is out).
NAMES = """\
import json, os, shutil, sys
out = sys.argv[1]
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
with open("/proc/self/environ", "rb") as f:  # a forked task's: the server's
    tmp = [e[7:] for e in f.read().decode().split("\\0") if e.startswith("TMPDIR=")][0]
names = os.path.join(tmp, "tasks")
"""


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


def launch(tmp_path, script, *args, preload="json,numpy", config=TWO, options=(),
           env=None, timeout=TIMEOUT):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(config)
    command = [PY, "-m", "tfdist", "launch", str(cfg), "--preload", preload, *options,
               "--", PY, script, *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env=env or dict(os.environ, TMPDIR=str(tmp_path)))


def reports(out):
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def test_a_forked_task_starts_as_a_fresh_process_would(tmp_path):
    """Each task: the modules already imported, its own argv, sys.path[0], cwd, process
    group, environment (its TF_CONFIG and TMPDIR) and NumPy draws, its name the task's;
    stdin /dev/null; run as __main__; the launcher's job succeeds."""
    out = tmp_path / "out"
    out.mkdir()
    script = write(tmp_path / "report.py", REPORT)
    run = launch(tmp_path, script, out, "--flag")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    seen = reports(out)
    assert sorted(seen) == ["worker-0", "worker-1"], seen
    for name, task in seen.items():
        assert task["preloaded"] == ["json", "numpy"], task["preloaded"]
        assert task["argv"] == [script, str(out), "--flag"]
        assert task["path0"] == str(tmp_path) and task["cwd"] == str(tmp_path)
        assert task["main"] == "__main__" and task["file"] == script
        assert task["pgid"] == task["pid"], "not a process group of its own"
        assert task["stdin"] == "/dev/null"
        index = int(name[-1])
        assert json.loads(task["env"]["TF_CONFIG"])["task"]["index"] == index
        assert task["env"]["TMPDIR"].endswith(f"worker-{index}")
        assert task["tmp"] == task["env"]["TMPDIR"], "tempfile kept the server's directory"
        assert task["comm"] == f"worker:{index}"  # what ps -o comm, top and pkill show
        assert task["listed"] == f"worker:{index}"  # for a program that renames itself
    a, b = seen["worker-0"], seen["worker-1"]
    assert a["ppid"] == b["ppid"], "not forked from one server"
    assert a["draw"] != b["draw"], "NumPy's global generator was not drawn anew"
    assert {k: v for k, v in a["env"].items() if k not in ("TF_CONFIG", "TMPDIR", "TEMP", "TMP")} \
        == {k: v for k, v in b["env"].items() if k not in ("TF_CONFIG", "TMPDIR", "TEMP", "TMP")}


def test_exec_and_preload_start_the_same_tasks_but_for_the_imported_modules(tmp_path):
    """Without the option (TFDIST_PRELOAD empty) nothing is preloaded and the parent is
    the launcher; what a task is given is otherwise the same."""
    out = tmp_path / "out"
    out.mkdir()
    script = write(tmp_path / "report.py", REPORT)
    run = launch(tmp_path, script, out, preload="",
                 env=dict(os.environ, TMPDIR=str(tmp_path), TFDIST_PRELOAD="json"))
    assert run.returncode == 0, run.stderr[-2000:]
    for task in reports(out).values():
        assert task["preloaded"] == ["json"]  # python imports json for itself, no more
        assert task["listed"] is None
        assert task["pgid"] == task["pid"] and task["stdin"] == "/dev/null"


def test_exit_codes_signals_and_tracebacks_reach_the_launcher_as_from_exec(tmp_path):
    """sys.exit(3) on worker:1 fails the job naming exit 3; an uncaught exception is exit 1
    with the script's own traceback (no frame of the preload server); a SIGKILLed task
    is 137."""
    script = write(tmp_path / "ends.py", """\
        import json, os, signal, sys
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        how = sys.argv[1]
        if index == 1 and how == "exit":
            sys.exit(3)
        if index == 1 and how == "raise":
            def deep():
                raise ValueError("from the task")
            deep()
        if index == 1 and how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        """)
    ended = {how: launch(tmp_path, script, how) for how in ("exit", "raise", "kill", "ok")}
    assert ended["ok"].returncode == 0, ended["ok"].stderr[-2000:]
    assert ended["exit"].returncode == 3, ended["exit"].stderr[-2000:]
    assert "worker:1 exited with code 3" in ended["exit"].stderr, ended["exit"].stderr
    text = ended["raise"].stdout + ended["raise"].stderr
    assert ended["raise"].returncode == 1, text[-2000:]
    assert "ValueError: from the task" in text and 'in deep' in text
    assert "preload_server" not in text and "runpy" not in text, text[-3000:]
    assert ended["kill"].returncode == 137, ended["kill"].stderr[-2000:]


@pytest.mark.parametrize("preload, said", [
    ("tensorflw", "import tensorflw failed: ModuleNotFoundError: No module named 'tensorflw'"),
    ("numpy;rm -rf", "'numpy;rm -rf' is not a module name"),
    ("numpy,,json", "'' is not a module name"),
])
def test_a_wrong_preload_is_one_line_before_any_task_runs(tmp_path, preload, said):
    marker = tmp_path / "ran"
    script = write(tmp_path / "touch.py", f"open({str(marker)!r}, 'w').close()\n")
    run = launch(tmp_path, script, preload=preload)
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert any(said in line for line in lines), lines[-5:]
    assert not marker.exists()


def test_the_environment_variable_is_checked_as_the_option_is(tmp_path):
    script = write(tmp_path / "noop.py", "pass\n")
    cfg = tmp_path / "job.yaml"
    cfg.write_text(TWO)
    run = subprocess.run([PY, "-m", "tfdist", "launch", str(cfg), "--", PY, script],
                         capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path,
                         env=dict(os.environ, TMPDIR=str(tmp_path), TFDIST_PRELOAD="json,1x"))
    assert run.returncode != 0 and "TFDIST_PRELOAD: '1x' is not a module name" in run.stderr, \
        run.stderr[-2000:]


def test_a_module_that_kills_the_server_on_import_is_said_with_its_last_words(tmp_path):
    write(tmp_path / "fatal.py", "import sys\nprint('cannot start here', file=sys.stderr)\n"
                                 "import os\nos._exit(7)\n")
    script = write(tmp_path / "noop.py", "pass\n")
    run = launch(tmp_path, script, preload="fatal",
                 env=dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(tmp_path)))
    assert run.returncode != 0
    assert "the server ended before it was ready: cannot start here" in run.stderr, \
        run.stderr[-2000:]


def test_a_server_that_ends_at_a_fork_is_said_with_its_last_words_at_once(tmp_path):
    write(tmp_path / "forkless.py", "import os, sys\n"
                                    "def fork():\n"
                                    "    print('no fork here', file=sys.stderr, flush=True)\n"
                                    "    os._exit(3)\n"
                                    "os.fork = fork\n")
    script = write(tmp_path / "noop.py", "pass\n")
    began = time.monotonic()
    run = launch(tmp_path, script, preload="forkless",
                 env=dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(tmp_path)))
    assert run.returncode != 0
    assert "the server ended before it forked the task: no fork here" in run.stderr, \
        run.stderr[-2000:]
    assert time.monotonic() - began < 30, "waited for a reply from a server that had ended"


def test_tasks_that_cannot_be_forked_are_started_with_exec(tmp_path):
    """A `python -c` task and a shell command are exec'd beside a forked one (a server and
    its parameter_server job alike), and the job succeeds."""
    out = tmp_path / "out"
    out.mkdir()
    code = ("import json, os, sys; i = json.loads(os.environ['TF_CONFIG'])['task']['index'];"
            "open(os.path.join(sys.argv[1], f'c{i}'), 'w').write(str('numpy' in sys.modules))")
    cfg = tmp_path / "job.yaml"
    cfg.write_text(TWO)
    run = subprocess.run([PY, "-m", "tfdist", "launch", str(cfg), "--preload", "numpy", "--",
                          PY, "-c", code, str(out)], capture_output=True, text=True,
                         timeout=TIMEOUT, cwd=tmp_path, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert run.returncode == 0, run.stderr[-2000:]
    assert (out / "c0").read_text() == (out / "c1").read_text() == "False"


def test_a_command_line_too_long_for_the_socket_is_execd_not_refused(tmp_path):
    """360 KB of arguments (over a Unix socket's message size; fine for exec): the tasks
    are exec'd (no preloaded module) with every byte of their arguments, the job succeeds."""
    out = tmp_path / "out"
    out.mkdir()
    script = write(tmp_path / "long.py", """\
        import json, os, sys
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        with open(os.path.join(sys.argv[1], f"w{index}"), "w") as f:
            f.write(f"{'numpy' in sys.modules} {sum(map(len, sys.argv[2:]))}")
        """)
    run = launch(tmp_path, script, out, *["x" * 120_000] * 3, preload="numpy")
    assert run.returncode == 0, run.stderr[-2000:]
    assert (out / "w0").read_text() == (out / "w1").read_text() == "False 360000"


def test_the_server_killed_mid_job_fails_the_job_and_a_restart_forks_from_a_new_one(tmp_path):
    """worker:0 SIGKILLs the server it was forked from during the first run: both tasks
    die with it; with --max-restarts 1 the job is restarted, forked from a new server,
    and succeeds; nothing is left behind."""
    out = tmp_path / "out"
    out.mkdir()
    script = write(tmp_path / "victim.py", """\
        import json, os, signal, sys, time
        out = sys.argv[1]
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        with open(os.path.join(out, f"servers-{index}"), "a") as f:
            f.write(f"{os.getppid()}\\n")
        first = not os.path.exists(os.path.join(out, "killed"))
        if first and index == 0:
            open(os.path.join(out, "killed"), "w").close()
            os.kill(os.getppid(), signal.SIGKILL)
        if first:
            time.sleep(60)
        """)
    began = time.monotonic()
    run = launch(tmp_path, script, out, options=("--max-restarts", "1"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert time.monotonic() - began < 50, "the tasks did not die with their server"
    servers = [(out / f"servers-{i}").read_text().split() for i in (0, 1)]
    assert len(servers[0]) == 2 and servers[0][0] != servers[0][1], servers
    assert servers[0][1] == servers[1][-1]  # the restarted tasks share the new server
    # (worker:1 may have died with the first server before it wrote its line)
    for pid in {p for s in servers for p in s}:
        assert not os.path.exists(f"/proc/{pid}"), f"server {pid} left behind"


def test_a_restart_forks_from_the_same_server(tmp_path):
    """worker:1 fails once; --max-restarts 1 restarts the whole job, its tasks forked from
    the server of the first run (no second import: the restart's sweep spares it)."""
    out = tmp_path / "out"
    out.mkdir()
    script = write(tmp_path / "once.py", NAMES + textwrap.dedent("""\
        listed = ",".join(os.listdir(names))
        with open(os.path.join(out, f"servers-{index}"), "a") as f:
            f.write(f"{os.getppid()} {os.getpid()} {listed}\\n")
        failed = os.path.join(out, "failed")
        if index == 1 and not os.path.exists(failed):
            open(failed, "w").close()
            sys.exit(1)
        """))
    run = launch(tmp_path, script, out, options=("--max-restarts", "1"))
    assert run.returncode == 0 and "restarting the whole job (1/1)" in run.stderr, \
        run.stderr[-2000:]
    runs = [[line.split() for line in (out / f"servers-{i}").read_text().splitlines()]
            for i in (0, 1)]
    assert len(runs[1]) == 2 and len({line[0] for task in runs for line in task}) == 1, runs
    last = {runs[0][-1][1], runs[1][-1][1]}  # the restart's two tasks
    for server, pid, listed in runs[0][-1:] + runs[1][-1:]:
        assert pid in listed.split(",") and set(listed.split(",")) <= last, runs  # the ended gone


def test_a_task_that_tampers_with_the_servers_names_costs_only_the_names(tmp_path):
    """worker:0 removes the server's tasks/ (its own and its sibling's PID files) and puts a
    file in its place, then fails: the server neither stops nor loses an exit; the restart's
    tasks run without a name file (it cannot be written) and the job succeeds."""
    out = tmp_path / "out"
    out.mkdir()
    script = write(tmp_path / "tamper.py", NAMES + textwrap.dedent("""\
        with open(os.path.join(out, f"runs-{index}"), "a") as f:
            f.write(f"{os.getppid()} {os.path.isdir(names)}\\n")
        if index == 0 and os.path.isdir(names):
            shutil.rmtree(names)
            open(names, "w").close()
            sys.exit(1)
        """))
    run = launch(tmp_path, script, out, options=("--max-restarts", "1"))
    assert run.returncode == 0 and "restarting the whole job (1/1)" in run.stderr, \
        run.stderr[-2000:]
    runs = [(out / f"runs-{i}").read_text().split() for i in (0, 1)]
    assert runs[0] == [runs[0][0], "True", runs[0][0], "False"], runs  # one server
    assert runs[1][-2:] == [runs[0][0], "False"], runs


def test_a_sigterm_to_the_launcher_stops_forked_tasks_and_the_server(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = write(tmp_path / "wait.py", """\
        import json, os, sys, time
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        with open(os.path.join(sys.argv[1], f"pid-{index}"), "w") as f:
            f.write(f"{os.getpid()} {os.getppid()}")
        time.sleep(120)
        """)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(TWO)
    launcher = subprocess.Popen([PY, "-m", "tfdist", "launch", str(cfg), "--preload", "json",
                                 "--grace-seconds", "2", "--", PY, script, str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=tmp_path, env=dict(os.environ, TMPDIR=str(tmp_path)))
    try:
        deadline = time.monotonic() + 60
        while len(list(out.glob("pid-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = {int(p) for f in out.glob("pid-*") for p in f.read_text().split()}
        assert len(pids) == 3, pids  # two tasks, one server
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 143, err[-2000:]
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]


TRAIN = """\
import json, os, sys
preloaded = "tensorflow" in sys.modules
import numpy as np
import keras
import tfdist

strategy = tfdist.get_strategy("multi_worker_mirrored")
keras.utils.set_random_seed(0)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
x = np.random.RandomState(1).rand(64, 4).astype("float32")
model.fit(x, x.sum(1, keepdims=True), batch_size=16, epochs=2, shuffle=False, verbose=0)
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
np.savez(os.path.join(sys.argv[1], f"w{index}-{preloaded}.npz"), *model.get_weights())
"""


def test_two_workers_train_the_same_weights_preloaded_or_not(tmp_path):
    """TensorFlow and Keras preloaded: the 2-worker job's weights are those of the same job
    with every task exec'd, on both workers."""
    out = tmp_path / "out"
    out.mkdir()
    script = write(tmp_path / "train.py", TRAIN)
    env = dict(os.environ, TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3")
    for preload in ("tensorflow,keras", ""):
        run = launch(tmp_path, script, out, preload=preload, env=env, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    weights = {p.stem: np.load(p) for p in out.glob("*.npz")}
    assert sorted(weights) == ["w0-False", "w0-True", "w1-False", "w1-True"], sorted(weights)
    reference = weights["w0-False"]
    for name, found in weights.items():
        for key in reference.files:
            np.testing.assert_array_equal(found[key], reference[key], err_msg=name)
