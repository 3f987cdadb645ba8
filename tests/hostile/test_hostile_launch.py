"""`tfdist launch` in a hostile environment: real launcher processes, each case checked
for its exit code, a quiet stderr (no traceback) and that nothing is left behind (no
process carrying the test's token, nothing in the TMPDIR the launcher was given).

Cases: a stdout nobody reads while a signal arrives (SIGTERM, SIGINT, SIGHUP); a stdout
closed after one line; an ASCII locale with non-ASCII output; 120 MB without a newline;
a progress bar redrawn a million times on one line; a parameter_server restart whose
failed task left a child; grandchildren that call setsid (with and without the launch's
tag) on failure and on success; a signal during setup; a SIGKILLed launcher cleaned up
by the next launch; out-of-range options; an open-files limit that is too low (and one
that can be raised); a command line too big to start.
"""

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from test_launch import (PRELUDE, PY, TWO_WORKERS, alive, assert_gone, cli, env,  # noqa: F401
                         processes_with, task, token, wait_for_pids)

pytestmark = pytest.mark.multiprocess

TIMEOUT = 60


# --- helpers -------------------------------------------------------------------------------

@pytest.fixture
def launch_env(env, tmp_path):
    """The launcher's environment with a TMPDIR of its own (checked empty at the end)."""
    tmpdir = tmp_path / "launcher-tmp"
    tmpdir.mkdir()
    env["TMPDIR"] = str(tmpdir)
    return env


def assert_nothing_left(env, token, timeout=10):
    """No process carries the token; the launcher's TMPDIR is empty."""
    deadline = time.monotonic() + timeout
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(token) == [], "processes left behind"
    assert os.listdir(env["TMPDIR"]) == [], "temporary files left behind"


def assert_quiet(err):
    assert "Traceback" not in err, err
    assert "Exception" not in err, err


def wrapped(patch, *argv):
    """argv of a launcher whose module is patched first (a seam to pause or reroute it)."""
    code = (f"import sys\n{textwrap.dedent(patch)}\n"
            "from tfdist.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    return [PY, "-c", code, *argv]


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def kill_and_fail(proc, message):
    proc.kill()
    proc.wait()
    pytest.fail(message)


def wait_exit(proc, timeout):
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_and_fail(proc, f"launcher did not exit within {timeout}s")


# --- 1. the launcher's own output ----------------------------------------------------------

CHATTY = """
    report("pid", str(os.getpid()))
    line, written = b"y" * 999 + b"\\n", 0
    while True:
        os.write(1, line)
        written += len(line)
        if written % (1 << 14) < len(line):  # often: a task may block after 64 KiB
            report("written", str(written))
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                       (signal.SIGHUP, 129)],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_works_while_stdout_is_not_read(tmp_path, write_config, launch_env, token,
                                                 sig, code):
    """stdout is a pipe nobody reads (a paused pager): the tasks' output backs up until
    they block, and the launcher still stops on a signal within grace + a few seconds."""
    config = write_config(TWO_WORKERS)
    proc = subprocess.Popen(cli(config, "--grace-seconds", "2", "--hang-seconds", "3",
                                command=task(CHATTY, tmp_path)),
                            env=launch_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        pids = wait_for_pids(tmp_path, ["worker:0.pid", "worker:1.pid"], proc)

        def blocked():  # the tasks wrote MBs and then stopped: the whole path is full
            sizes = [(tmp_path / f"worker:{i}.written") for i in range(2)]
            if not all(p.exists() for p in sizes):
                return False
            before = [p.read_text() for p in sizes]
            time.sleep(1.0)
            return before == [p.read_text() for p in sizes]

        wait_until(blocked, 30, "the tasks to block on the unread stdout")
        time.sleep(3.5)  # longer than --hang-seconds: waiting for stdout is not hung
        sent = time.monotonic()
        proc.send_signal(sig)
        returncode = wait_exit(proc, 20)
        elapsed = time.monotonic() - sent
        err = proc.stderr.read().decode()
    finally:
        proc.stdout.close()
        proc.stderr.close()
    assert returncode == code, err
    assert elapsed < 2 + 6, elapsed
    assert f"received {sig.name}" in err
    assert "hung" not in err, err
    assert_quiet(err)
    assert_gone(pids.values())
    assert_nothing_left(launch_env, token)


def test_stdout_closed_after_one_line(tmp_path, write_config, launch_env, token):
    """``tfdist launch ... | head -1``: one notice on stderr, no traceback, the tasks go on
    (not taken for hung) and the launcher exits with the tasks' code."""
    config = write_config(TWO_WORKERS)
    proc = subprocess.Popen(cli(config, "--hang-seconds", "2", command=task("""
        deadline = time.monotonic() + 5
        n = 0
        while time.monotonic() < deadline:
            print("line", n, "x" * 200)
            n += 1
        report("done", str(n))
        if name == "worker:1":  # the failing task ends last: the launcher then stops
            wait_for("worker:0.done")  # the others, and worker:0 may have started late
        sys.exit(5 if name == "worker:1" else 0)
    """, tmp_path)), env=launch_env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    returncode = wait_exit(proc, TIMEOUT)
    err = proc.stderr.read().decode()
    proc.stderr.close()

    assert first.startswith((b"[worker:0] line", b"[worker:1] line")), first
    assert returncode == 5, err
    assert (tmp_path / "worker:0.done").exists() and (tmp_path / "worker:1.done").exists()
    assert "hung" not in err, err
    assert_quiet(err)
    assert len(re.findall(r"cannot write to stdout", err)) == 1, err
    assert "worker:1 exited with code 5" in err
    assert_nothing_left(launch_env, token)


def test_non_ascii_output_under_an_ascii_locale_arrives_intact(tmp_path, write_config,
                                                                launch_env, token):
    config = write_config("strategy: mirrored\n")
    launch_env["PYTHONIOENCODING"] = "ascii"
    payload = "héllo ✓ 日本 \U0001F600".encode() + b" \xff\xfe not utf-8"
    result = subprocess.run(cli(config, command=task(f"""
        sys.stdout.buffer.write({payload!r} + b"\\n")
        sys.stdout.buffer.flush()
        print("later output")
    """, tmp_path)), env=launch_env, cwd=tmp_path, capture_output=True, timeout=TIMEOUT)

    err = result.stderr.decode(errors="replace")
    assert result.returncode == 0, err
    assert result.stdout.splitlines() == [b"[main] " + payload, b"[main] later output"]
    assert_quiet(err)
    assert_nothing_left(launch_env, token)


HOSTILE_OUTPUT = (b"\x1bc reset\n\x1b#8 fill\n\x1b(0 charset\n\x1b7 save \x1b8 restore\n"
                  b"\xc2\x9b2J c1\n\x1b\x1b[K[2J assembled\n\x1b]5\x1b[K2;c;eA==\x07 osc52\n"
                  b"\x1b] stray\nnext line\n" + b"\b" * 100 + b"backspaced\n"
                  b"\x1b[31mred\x1b[0m\nunfinished \x1b[")
SGR = re.compile(rb"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_a_tasks_terminal_controls_never_reach_the_launchers_output(tmp_path, write_config,
                                                                     launch_env, token,
                                                                     terminal):
    """A task writes resets, fills, charset switches, C1 controls, sequences that would
    be assembled by deleting the one between their bytes, a stray OSC, backspaces before
    the prefix and an unfinished sequence at its end: the launcher's output (a pipe, or a
    terminal) holds none of them — only colours, and only on a terminal — every line
    starts with the task's prefix and the printable text arrives."""
    import pty

    config = write_config("strategy: mirrored\n")
    argv = cli(config, command=task(f"""
        os.write(1, {HOSTILE_OUTPUT!r})
    """, tmp_path))
    if terminal:
        master, slave = pty.openpty()
        proc = subprocess.Popen(argv, env=launch_env, cwd=tmp_path, stdout=slave,
                                stderr=subprocess.PIPE)
        os.close(slave)
        out = b""
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: the launcher closed the terminal
                break
            if not data:
                break
            out += data
        os.close(master)
        err = proc.stderr.read().decode(errors="replace")
        proc.wait(TIMEOUT)
        out = out.replace(b"\r\n", b"\n")  # the terminal's own line discipline
    else:
        result = subprocess.run(argv, env=launch_env, cwd=tmp_path, capture_output=True,
                                timeout=TIMEOUT)
        proc, out, err = result, result.stdout, result.stderr.decode(errors="replace")
    assert proc.returncode == 0, err
    kept = SGR.sub(b"", out) if terminal else out
    assert not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]", kept), out
    assert (SGR.findall(out) != []) == terminal
    lines = kept.decode().splitlines()
    assert all(line.startswith("[main] ") for line in lines), lines
    text = "\n".join(lines)
    for word in ("reset", "fill", "charset", "save", "restore", "c1", "assembled", "osc52",
                 "stray", "next line", "backspaced", "red", "unfinished"):
        assert word in text, (word, text)
    assert_nothing_left(launch_env, token)


def test_a_huge_line_is_cut_into_pieces_in_bounded_memory(tmp_path, write_config,
                                                          launch_env, token):
    """120 MB without a newline (a progress bar): pieces of at most 64 KiB, every byte
    arrives, the launcher's peak memory stays far below the output's size."""
    config = write_config("strategy: mirrored\n")
    megabytes = 120
    proc = subprocess.Popen(cli(config, command=task(f"""
        block = b"x" * (1 << 20)
        for _ in range({megabytes}):
            os.write(1, block)
        os.write(1, b"\\nend\\n")
    """, tmp_path)), env=launch_env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    prefix = b"[main] "
    peak, pending, payload, pieces, longest, last = 0, b"", 0, 0, 0, b""
    try:
        while True:
            data = os.read(proc.stdout.fileno(), 1 << 20)
            try:
                with open(f"/proc/{proc.pid}/status") as f:
                    peak = max(peak, int(f.read().split("VmHWM:")[1].split()[0]))
            except (OSError, IndexError):
                pass
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                assert line.startswith(prefix), line[:80]
                pieces += 1
                longest = max(longest, len(line) - len(prefix))
                if line != prefix + b"end":
                    payload += len(line) - len(prefix)
                last = line
        returncode = wait_exit(proc, TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err = proc.stderr.read().decode()
        proc.stdout.close()
        proc.stderr.close()

    assert returncode == 0, err
    assert pending == b"" and last == prefix + b"end"
    assert payload == megabytes << 20
    assert longest == 64 * 1024 and pieces >= (megabytes << 20) // (64 * 1024)
    assert 0 < peak < 150 * 1024, f"launcher peak RSS {peak} kB"
    assert_quiet(err)
    assert_nothing_left(launch_env, token)


def test_a_bar_redrawn_a_million_times_is_a_few_lines_in_bounded_memory(tmp_path,
                                                                        write_config,
                                                                        launch_env, token):
    """A progress bar redrawn 10^6 times on one line (32 MB of \\b, \\r and states) ends
    as its final state, the launcher's memory stays far below the output's size."""
    config = write_config("strategy: mirrored\n")
    proc = subprocess.Popen(cli(config, command=task("""
        for k in range(1000):
            os.write(1, b"".join(b"\\b" * 16 + b"\\r" + b"%7d/1000000" % (k * 1000 + i)
                                 for i in range(1, 1001)))
        os.write(1, b"\\n")
    """, tmp_path)), env=launch_env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    peak = [0]

    def watch():
        while proc.poll() is None:
            try:
                with open(f"/proc/{proc.pid}/status") as f:
                    peak[0] = max(peak[0], int(f.read().split("VmHWM:")[1].split()[0]))
            except (OSError, IndexError):
                pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    watcher.join()

    assert proc.returncode == 0, err
    lines = out.decode().splitlines()
    assert lines[-1] == "[main] 1000000/1000000"
    assert all(re.fullmatch(r"\[main\] +\d+/1000000", line) for line in lines), lines
    assert len(lines) < 20
    assert 0 < peak[0] < 150 * 1024, f"launcher peak RSS {peak[0]} kB"
    assert_quiet(err.decode())
    assert_nothing_left(launch_env, token)


# --- 2. processes and temporary directories left behind -------------------------------------

# Server tasks (worker, ps) run the user's command instead of a TF server: the launcher's
# restart logic is the same, without starting TensorFlow.
NO_TF_SERVERS = """
import tfdist.launch.task_set as task_set
task_set.task_argv = lambda strategy, job, command, python="python": list(command)
"""


def test_parameter_server_restart_kills_the_failed_tasks_children(tmp_path, write_config,
                                                                  launch_env, token):
    config = write_config("""
        cluster: {chief: 1, worker: 1, ps: 1}
        strategy: parameter_server
    """)
    command = task("""
        if name != "chief:0":
            time.sleep(60)
        if not (out / "chief:0.child").exists():  # first attempt: leave a child, fail
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            report("child", str(child.pid))
            sys.exit(7)
        old = int((out / "chief:0.child").read_text())
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{old}") and time.monotonic() < deadline:
            with open(f"/proc/{old}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        report("old_child_gone", str(time.monotonic() < deadline))
    """, tmp_path)
    result = subprocess.run(
        wrapped(NO_TF_SERVERS, "launch", config, "--max-restarts", "1", "--grace-seconds",
                "2", "--", *command),
        env=launch_env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)

    assert result.returncode == 0, result.stderr
    assert "chief:0 exited with code 7; restarting it (1/1)" in result.stderr
    assert (tmp_path / "chief:0.old_child_gone").read_text() == "True"
    assert_quiet(result.stderr)
    assert_nothing_left(launch_env, token)


@pytest.mark.parametrize("outcome", ["failure", "success"])
def test_grandchildren_that_call_setsid_are_killed(tmp_path, write_config, launch_env, token,
                                                   outcome):
    """worker:0 starts two grandchildren in sessions of their own: one keeps the launch's
    environment, one clears it (found only as an orphan the launcher adopted)."""
    config = write_config(TWO_WORKERS)
    result = subprocess.run(cli(config, "--grace-seconds", "2", command=task(f"""
        sleeper = [sys.executable, "-c", "import os, time; os.setsid(); time.sleep(60)"]
        if name == "worker:0":
            tagged = subprocess.Popen(sleeper)
            bare = subprocess.Popen(sleeper, env={{}})
            report("tagged", str(tagged.pid))
            report("bare", str(bare.pid))
            time.sleep(0.5)  # both have called setsid
            report("started", "")
        if "{outcome}" == "failure":
            if name == "worker:1":
                wait_for("worker:0.started")
                sys.exit(3)
            time.sleep(60)
    """, tmp_path)), env=launch_env, cwd=tmp_path, capture_output=True, text=True,
        timeout=TIMEOUT)

    assert result.returncode == (3 if outcome == "failure" else 0), result.stderr
    assert_quiet(result.stderr)
    grandchildren = wait_for_pids(tmp_path, ["worker:0.tagged", "worker:0.bare"])
    assert_gone(grandchildren.values())
    assert_nothing_left(launch_env, token)


@pytest.mark.parametrize("stage, made", [("check_resolvable", False), ("cluster_dict", True)],
                         ids=["resolving-hosts", "picking-ports"])
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_setup_removes_everything(tmp_path, write_config, launch_env, token,
                                                  sig, code, stage, made):
    """The signal arrives while the launcher resolves hosts (one of the checks that can
    refuse the job: nothing is made yet) or picks the tasks' ports (its directory exists)."""
    config = write_config(TWO_WORKERS)
    marker = tmp_path / "in-setup"
    pause = f"""
        import os, pathlib, time
        import tfdist.launch.task_set as task_set
        def slow(cluster, **kwargs):
            pathlib.Path({str(marker)!r}).write_text(" ".join(os.listdir(os.environ["TMPDIR"])))
            time.sleep(60)
        task_set.{stage} = slow
    """
    proc = subprocess.Popen(wrapped(pause, "launch", config, "--", *task("pass", tmp_path)),
                            env=launch_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: marker.exists() or proc.poll() is not None, 30, "setup")
        assert marker.read_text().startswith("tfdist-launch-") == made, marker.read_text()
        sent = time.monotonic()
        proc.send_signal(sig)
        returncode = wait_exit(proc, 15)
        elapsed = time.monotonic() - sent
        err = proc.stderr.read()
    finally:
        proc.stdout.close()
        proc.stderr.close()
    assert returncode == code, err
    assert elapsed < 5
    assert f"received {sig.name}" in err
    assert_quiet(err)
    assert_nothing_left(launch_env, token)


def test_after_a_sigkilled_launcher_the_next_launch_cleans_up(tmp_path, write_config,
                                                              launch_env, token):
    config = write_config(TWO_WORKERS)
    proc = subprocess.Popen(cli(config, command=task("""
        if name == "worker:0":
            grandchild = subprocess.Popen(
                [sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])
            report("grandchild", str(grandchild.pid))
        report("pid", str(os.getpid()))
        time.sleep(600)
    """, tmp_path)), env=launch_env, cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    # they sleep past any load on the machine (CI once saw a 60 s sleep end mid-test); the
    # `env` fixture kills whatever carries the token if the test fails first
    pids = wait_for_pids(tmp_path, ["worker:0.pid", "worker:1.pid", "worker:0.grandchild"],
                         proc)
    proc.kill()
    proc.wait()
    assert_gone([pids["worker:0.pid"], pids["worker:1.pid"]])  # PR_SET_PDEATHSIG
    grandchild = pids["worker:0.grandchild"]
    assert alive(grandchild)  # what cannot be prevented...
    (stale,) = os.listdir(launch_env["TMPDIR"])
    assert stale.startswith(f"tfdist-launch-{proc.pid}-")

    # a launch that is refused changes nothing and says one line (CI saw the cleanup's
    # line before a refusal)
    refused = subprocess.run(cli(config, "--task", "worker:0", command=[PY, "-c", "pass"]),
                             env=launch_env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=TIMEOUT)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--task" in refused.stderr and alive(grandchild), refused.stderr
    assert os.listdir(launch_env["TMPDIR"]) == [stale]

    # a launch with another TMPDIR (a parallel test, another user's job) is not ours to
    # clean: CI saw a parallel test's launch kill this grandchild
    elsewhere = dict(launch_env, TMPDIR=str(tmp_path / "elsewhere"))
    os.mkdir(elsewhere["TMPDIR"])
    other = subprocess.run(cli(config, command=[PY, "-c", "pass"]), env=elsewhere,
                           cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert other.returncode == 0 and "cleaned up" not in other.stderr, other.stderr
    assert alive(grandchild) and os.listdir(launch_env["TMPDIR"]) == [stale]

    result = subprocess.run(cli(config, command=[PY, "-c", "pass"]), env=launch_env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)

    assert result.returncode == 0, result.stderr  # ...is cleaned by the next launch
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and re.fullmatch(
        r"\[tfdist\] cleaned up after launchers that were killed: removed 1 stale "
        r"directory and [1-9]\d* leftover process(es)?", lines[0]), result.stderr
    assert lines[1].startswith("[tfdist] job succeeded: 2 tasks (worker:0 0, worker:1 0)")
    assert_gone([grandchild])
    assert_nothing_left(launch_env, token)


# --- 3. and 4. options and limits -----------------------------------------------------------

@pytest.mark.parametrize("option, value", [
    ("--grace-seconds", "nan"), ("--grace-seconds", "inf"), ("--grace-seconds", "-5"),
    ("--grace-seconds", "1e9"), ("--hang-seconds", "nan"), ("--hang-seconds", "inf"),
    ("--hang-seconds", "-1"), ("--hang-seconds", "1e999"),
])
def test_out_of_range_options_are_one_line(tmp_path, write_config, launch_env, token,
                                           option, value):
    config = write_config(TWO_WORKERS)
    result = subprocess.run(cli(config, option, value, command=task('(out / "ran").touch()',
                                                                     tmp_path)),
                            env=launch_env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and option.strip("-").replace("-", "_") in lines[0], lines
    assert_quiet(result.stderr)
    assert not (tmp_path / "ran").exists()
    assert_nothing_left(launch_env, token)


def _open_files_limit(soft, hard):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_open_files_limit_too_low_for_the_job_is_one_line(tmp_path, write_config,
                                                             launch_env, token):
    config = write_config("cluster: {worker: 40}\nstrategy: multi_worker_mirrored\n")
    result = subprocess.run(cli(config, command=task('(out / "ran").touch()', tmp_path)),
                            env=launch_env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=TIMEOUT, preexec_fn=_open_files_limit(48, 48))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "ulimit -n" in lines[0] and "40 tasks" in lines[0], lines
    assert_quiet(result.stderr)
    assert not (tmp_path / "ran").exists()
    assert_nothing_left(launch_env, token)


def test_a_low_soft_open_files_limit_is_raised_to_what_the_job_needs(tmp_path, write_config,
                                                                     launch_env, token):
    config = write_config("cluster: {worker: 40}\nstrategy: multi_worker_mirrored\n")
    true = shutil.which("true")
    result = subprocess.run(cli(config, command=[true]), env=launch_env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=TIMEOUT,
                            preexec_fn=_open_files_limit(48, 4096))
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"\[tfdist\] job succeeded: 40 tasks \((worker:\d+ 0, ){39}worker:39 0\), "
                        r"0 restarts, \d+\.\d s\n", result.stderr), result.stderr
    assert_nothing_left(launch_env, token)


def _exec_size(env):
    """Bytes an environment takes in execve's 128 KiB budget (strings and pointers)."""
    return sum(len(k) + len(v) + 2 + 8 for k, v in env.items())


def test_a_command_too_big_to_start_is_one_line_naming_the_task(tmp_path, write_config,
                                                                launch_env, token):
    """The launcher's environment fills execve's budget to 8 KB short (with a stack limit
    of 512 KiB the budget is Linux's floor, 128 KiB); a task adds an 18 KB TF_CONFIG for
    1,000 tasks and cannot start (E2BIG): one line naming the task, nothing left."""
    budget = 128 * 1024
    config = write_config("cluster: {worker: 1000}\nstrategy: multi_worker_mirrored\n")
    launch_env["PADDING"] = ""
    launch_env["PADDING"] = "x" * (budget - 8000 - _exec_size(launch_env))

    def limits():
        resource.setrlimit(resource.RLIMIT_STACK, (512 * 1024, 512 * 1024))

    result = subprocess.run(cli(config, command=[shutil.which("true")]),
                            env=launch_env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=TIMEOUT, preexec_fn=limits)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and re.search(r"worker:0: cannot run .*true.*too long",
                                         lines[0]), lines
    assert_quiet(result.stderr)
    assert_nothing_left(launch_env, token)


# --- 5. an elastic job under hostile timing ---------------------------------------------------

THREE_WORKERS = "cluster: {worker: 3}\nstrategy: multi_worker_mirrored\n"
#: A stand-in elastic task: logs "<members> <name>" at each start; worker:2 is lost (SIGKILL)
#: once; at the size of 2 each task answers the resize signal by `ANSWER` (a name -> what
#: it does); a task started after one "finished" marks that it trained again.
ELASTIC_TASK = """
    import signal
    members = len(tf_config["cluster"]["worker"])
    with open(out / "starts", "a") as f:
        f.write(f"{members} {name}\\n")
    if (out / "worker:0.finished").exists():
        report("retrained", "1")
        sys.exit(0)
    asked = []
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
    if members == 3 and name == "worker:2" and not (out / "worker:2.lost").exists():
        report("lost", "1")
        os.kill(os.getpid(), signal.SIGKILL)
    report("pid", str(os.getpid()))
    while not asked or members == 3:
        time.sleep(0.05)
        print("step", flush=True)
    ANSWER
"""


def elastic_task(answer, tmp_path):
    return task(ELASTIC_TASK.replace("ANSWER", textwrap.dedent(answer).strip().replace(
        "\n", "\n    ")), tmp_path)


def generations(tmp_path):
    """The sizes the tasks were started at, one entry per start."""
    return [int(line.split()[0]) for line in (tmp_path / "starts").read_text().splitlines()]


def test_a_place_back_as_the_survivors_finish_ends_the_job_without_training_again(
        tmp_path, write_config, launch_env, token):
    """The lost place's time comes as the two survivors end: worker:0 finishes training
    (exits 0: its fit is over, the backup gone with it) while worker:1 answers the resize
    signal (143). Every step was trained: the job is done, no third generation starts
    from step 0."""
    config = write_config(THREE_WORKERS)
    run = subprocess.run(cli(config, "--min-workers", "2", "--rejoin-seconds", "0.5",
                             "--grace-seconds", "2", command=elastic_task("""
        if name == "worker:0":
            report("finished", "1")
            sys.exit(0)
        time.sleep(0.3)  # the finished one is seen first
        sys.exit(143)
    """, tmp_path)), env=launch_env, cwd=tmp_path, capture_output=True, text=True,
        timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    assert generations(tmp_path) == [3, 3, 3, 2, 2], run.stderr
    assert not any(p.name.endswith(".retrained") for p in tmp_path.iterdir())
    assert "the job is done" in run.stderr and "job succeeded" in run.stderr
    assert_quiet(run.stderr)
    assert_nothing_left(launch_env, token)


def test_a_sigterm_during_the_agreed_stop_wins_within_the_grace(tmp_path, write_config,
                                                                launch_env, token):
    """worker:0 answers the resize signal, worker:1 ignores it (and SIGTERM): while the
    launcher waits for it (a minute), a SIGTERM to the launcher stops the job within its
    grace (2 s) plus a little, and no next generation starts."""
    config = write_config(THREE_WORKERS)
    proc = subprocess.Popen(cli(config, "--min-workers", "2", "--rejoin-seconds", "0.5",
                                "--grace-seconds", "2", command=elastic_task("""
        if name == "worker:0":
            report("answered", "1")
            sys.exit(143)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.05)
    """, tmp_path)), env=launch_env, cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        wait_for_pids(tmp_path, ["worker:0.answered"], proc, timeout=TIMEOUT)
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        returncode = wait_exit(proc, 30)
        elapsed = time.monotonic() - sent
        err = proc.stderr.read()
    finally:
        proc.stderr.close()
    assert returncode == 143, err
    assert elapsed < 2 + 4, elapsed
    assert generations(tmp_path) == [3, 3, 3, 2, 2], err
    assert "received SIGTERM" in err and "going on with 3" not in err.split("asking")[-1]
    assert_quiet(err)
    assert_nothing_left(launch_env, token)


def test_a_hung_discover_command_dies_with_a_sigkilled_launcher(tmp_path, write_config,
                                                                 launch_env, token):
    """--discover runs a command that never answers (its run is due once a place is lost
    and its time to come back has come); the launcher is SIGKILLed meanwhile: the command
    dies with it (PR_SET_PDEATHSIG), as the tasks do."""
    config = write_config(THREE_WORKERS)
    hung = tmp_path / "discover.pid"
    discover = (f"{PY} -c \"import os, time; open('{hung}.tmp', 'w').write(str(os.getpid())); "
                f"os.replace('{hung}.tmp', '{hung}'); time.sleep(600)\"")
    proc = subprocess.Popen(cli(config, "--min-workers", "2", "--rejoin-seconds", "0.5",
                                "--discover", discover,
                                command=elastic_task("sys.exit(143)", tmp_path)),
                            env=launch_env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    pids = wait_for_pids(tmp_path, ["discover.pid", "worker:0.pid", "worker:1.pid"], proc,
                         timeout=TIMEOUT)
    try:
        assert alive(pids["discover.pid"])
        proc.kill()
        proc.wait()
        assert_gone(pids.values())
    finally:  # it carries no token: the `env` fixture would not find it
        if alive(pids["discover.pid"]):
            os.kill(pids["discover.pid"], signal.SIGKILL)
