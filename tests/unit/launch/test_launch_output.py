"""What a person reads under `tfdist launch`: prefixed lines (progress bars included), no
"crashed" line when every task succeeded, a one-line summary at the end.

The renderer and the report filter are tested with injected times and the bytes Keras'
`Progbar` and TensorFlow really write (captured from TF 2.21 / Keras 3.15); the launcher
with small `python -c` tasks, and once with a real two-worker `model.fit`.
"""

import contextlib
import io
import re
import signal
import types

import pytest

from test_launch import TWO_WORKERS, env, run_launch, task, token  # noqa: F401
from tfdist.launch.rendering import LineRenderer
from tfdist.launch.shutdown_reports import ShutdownReports
from tfdist.launch.summary import summary
from tfdist.step_times_line import StepTimesLine

CONTROL = re.compile(rb"[\r\b\x1b]")
FINAL_BAR = r"(\d+)/\1 ━{20} \d+s \d+[mu]?s/step - loss: \S+"  # Keras, colours gone


def keras_progbar_bytes(target, steps=None):
    """What Keras' Progbar of `target` steps writes for its first `steps` updates
    (all by default; verbose=1), as bytes."""
    import keras

    written = io.StringIO()
    with contextlib.redirect_stdout(written):
        bar = keras.utils.Progbar(target, interval=0)
        for step in range(1, (steps or target) + 1):
            bar.update(step, [("loss", 1.0 / step)])
    return written.getvalue().encode()


def render(renderer, chunks, times):
    lines = []
    for chunk, now in zip(chunks, times):
        lines += renderer.feed(chunk, now)
    return lines + renderer.flush()


# --- progress bars ---------------------------------------------------------------------------

def test_a_keras_progress_bar_becomes_one_clean_line_with_its_final_state():
    data = keras_progbar_bytes(30)
    assert data.count(b"\r") == 30 and b"\b" in data and b"\x1b[" in data  # Keras redraws
    chunks = [data[i:i + 7] for i in range(0, len(data), 7)]  # escapes cut across chunks
    lines = render(LineRenderer(1 << 16), chunks, [0.0] * len(chunks))

    assert len(lines) == 1, lines
    assert re.fullmatch(FINAL_BAR, lines[0].decode()) and lines[0].startswith(b"30/30 ")
    assert b"loss: 0.0333" in lines[0]  # Keras' final value: 1/30


def test_a_keras_bar_in_progress_shows_its_remaining_part_without_colours():
    renderer = LineRenderer(1 << 16, interval=5.0)
    assert renderer.feed(keras_progbar_bytes(10, steps=4), 0.0) == []
    (line,) = renderer.tick(5.0)
    done = int(20 * 4 / 10)  # Keras' bar is 20 characters wide
    assert re.fullmatch(rf" 4/10 ━{{{done}}}─{{{20 - done}}} \S+ \S+/step - loss: 0\.5208",
                        line.decode()), line  # (1 + 1/2 + 1/3 + 1/4) / 4


def test_a_long_redraw_shows_its_latest_state_at_most_every_interval():
    """A step every 0.3 s for 60 s: a state every 5 s or more, then the final state."""
    renderer = LineRenderer(1 << 16, interval=5.0)
    shown = []
    for step in range(1, 201):
        now = step * 0.3
        end = b"\n" if step == 200 else b""
        for line in renderer.feed(b"\b" * 30 + b"\r" + f"step {step}/200".encode() + end, now):
            shown.append((now, line))
    times = [now for now, _ in shown]
    assert shown[-1][1] == b"step 200/200"
    assert all(b - a >= 5.0 for a, b in zip(times[:-2], times[1:-1]))
    assert 10 <= len(shown) <= 60 / 5 + 1
    for now, line in shown[:-1]:  # the state written at that moment, no older one
        assert line == f"step {round(now / 0.3)}/200".encode()


def test_a_quiet_redrawing_line_is_shown_when_due_and_only_once():
    renderer = LineRenderer(1 << 16, interval=5.0)
    assert renderer.feed(b"\r1/9 working", 0.0) == []
    assert renderer.tick(4.9) == []
    assert renderer.tick(5.0) == [b"1/9 working"]
    assert renderer.tick(11.0) == []  # unchanged: not repeated
    assert renderer.feed(b"\r9/9 done   \n", 12.0) == [b"9/9 done"]


def test_colours_are_kept_for_a_terminal_and_cursor_moves_always_dropped():
    data = [b"\x1b[2K\x1b[1Ab", b"\x1b[1mold\x1b[0m\x1b]0;title\x07\n"]
    assert render(LineRenderer(99), data, [0, 0]) == [b"bold"]
    assert render(LineRenderer(99, keep_colour=True), data, [0, 0]) == [
        b"b\x1b[1mold\x1b[0m"]


def test_backspace_overwrites_and_plain_bytes_pass_unchanged():
    data = [b"ab\xffc\b\bXY\n", "naïve\tline\n".encode("latin-1"), b"crlf\r\n", b"tail"]
    assert render(LineRenderer(99), data, [0] * 4) == [
        b"abXY", "naïve\tline".encode("latin-1"), b"crlf", b"tail"]


def test_a_long_line_is_cut_into_pieces():
    assert render(LineRenderer(8), [b"x" * 20, b"y" * 4 + b"\n"], [0, 0]) == [
        b"x" * 8, b"x" * 8, b"xxxxyyyy"]


# --- TensorFlow's peer-gone reports ----------------------------------------------------------

# Verbatim from a two-worker MultiWorkerMirroredStrategy run (TF 2.21): worker:0 (the
# coordination service's host) after worker:1 finished 25 s earlier, and worker:1 after
# worker:0 finished first.
LEADER_REPORT = [
    b"E0000 00:00:1795609981.617679   12153 base_collective_executor.cc:252] "
    b"BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from /job:worker/task:1: "
    b"The following tasks are unhealthy (stopped sending heartbeats):",
    b"/job:worker/replica:0/task:1",
    b"The tasks have crashed. Check the task logs for an earlier error, or scheduler events "
    b"(e.g. preemption, eviction) to debug further. [type.googleapis.com/tensorflow."
    b"CoordinationServiceError='\\\"\\n\\n\\x06worker\\x10\\x01']",
]
FOLLOWER_REPORT = [
    b"E0000 00:00:1795610033.937018   16065 base_collective_executor.cc:252] "
    b"BaseCollectiveExecutor::StartAbort UNAVAILABLE: Failed to send RPC to coordination "
    b"service. Either the leader task was preempted/died/restarted unexpectedly or this task "
    b"is experiencing network issues. Check earlier logs from 1) this task, 2) the leader "
    b"(usually slice 0 task 0), and 3) cluster scheduler to debug further.",
    b"Additional GRPC error information from remote target /job:worker/replica:0/task:0 "
    b"while calling /tensorflow.CoordinationService/Heartbeat:",
    b':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect '
    b'to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:35187: Failed to connect to '
    b'remote host: Connection refused"}',
]


@pytest.mark.parametrize("report", [LEADER_REPORT, FOLLOWER_REPORT], ids=["leader", "follower"])
def test_peer_gone_reports_are_held_and_other_lines_pass(report):
    reports = ShutdownReports()
    before, after = [b"Epoch 2/2", b"/job:worker/replica:0/task:1"], [b"done", b"bye"]
    assert reports.filter(before) == before  # a task name alone is no report
    assert reports.filter(report[:1]) == []
    assert reports.filter(report[1:] + after) == after
    assert reports.take() == report
    assert reports.take() == []


# --- the summary -----------------------------------------------------------------------------

def fake_task(name, code, stopped=False, hung=False, restarts=0):
    return types.SimpleNamespace(name=name, poll=lambda: code, proc=object(), stopped=stopped,
                                 hung=hung, restarts=restarts)


def test_the_summary_names_each_task_the_first_failure_and_the_signal():
    ok = [fake_task("chief:0", 0), fake_task("worker:0", 0), fake_task("ps:0", -15, True)]
    assert summary(ok, restarts=0, seconds=41.25) == (
        "job succeeded: 3 tasks (chief:0 0, worker:0 0, ps:0 stopped), 0 restarts, 41.2 s")
    failed = fake_task("worker:1", -9)
    assert summary([fake_task("worker:0", -15, True), failed], restarts=1, seconds=5,
                   failed=failed) == (
        "job failed, worker:1 first (killed by SIGKILL): 2 tasks (worker:0 stopped, "
        "worker:1 SIGKILL), 1 restart, 5.0 s")
    hung = fake_task("worker:0", -9, hung=True)
    assert summary([hung], restarts=0, seconds=1, failed=hung).startswith(
        "job failed, worker:0 first (hung, killed): 1 task (worker:0 SIGKILL)")
    assert summary([fake_task("worker:0", -2, True)], restarts=0, seconds=1,
                   signum=signal.SIGINT).startswith("job stopped by SIGINT: 1 task")


def test_the_summary_carries_the_last_step_times_figures():
    ok = [fake_task("chief:0", 0), fake_task("worker:0", 0)]
    whole = StepTimesLine(steps=120, slowest="worker:0", compute=0.123, lead=0.354,
                          median=0.091, share=0.224, whole_run=True)
    assert summary(ok, restarts=0, seconds=41.25, step_times=whole) == (
        "job succeeded: 2 tasks (chief:0 0, worker:0 0), 0 restarts, 41.2 s; step times "
        "(whole run, 120 steps): worker:0 slowest (+35% computing), the others waited 22% of "
        "their step time")
    failed = fake_task("worker:0", 3)
    last = StepTimesLine(steps=1, slowest="chief:0", compute=2.0, lead=1.0, median=1.0,
                         share=0.5)
    assert summary([fake_task("chief:0", -15, True), failed], restarts=0, seconds=5,
                   failed=failed, step_times=last).endswith(
        "5.0 s; step times (last report, 1 step): chief:0 slowest (+100% computing), the "
        "others waited 50% of their step time")


# --- under the launcher ----------------------------------------------------------------------

BAR_TASK = """
    started = time.monotonic()
    width = 0
    for step in range(1, 301):
        bar = f"\\x1b[1m{step}/300\\x1b[0m \\x1b[32m" + "=" * (step // 15) + "\\x1b[0m - loss: 0.5"
        sys.stdout.write("\\b" * width + "\\r" + bar + ("\\n" if step == 300 else ""))
        width = len(bar)
        time.sleep(0.005)
    report("seconds", str(time.monotonic() - started))
    print("after the bar")
"""


@pytest.mark.multiprocess
def test_a_redrawn_bar_under_launch_is_prefixed_lines_with_its_final_state(
        tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, env=env, command=task(BAR_TASK, tmp_path))

    assert result.returncode == 0, result.stderr
    out = result.stdout.encode()
    assert not CONTROL.search(out), out[:300]
    lines = result.stdout.splitlines()
    assert all(re.match(r"\[worker:[01]\] ", line) for line in lines), lines
    for name in ("worker:0", "worker:1"):
        bar = [line for line in lines if line.startswith(f"[{name}] ") and "/300" in line]
        assert bar[-1] == f"[{name}] 300/300 {'=' * 20} - loss: 0.5"
        assert f"[{name}] after the bar" in lines
        seconds = float((tmp_path / f"{name}.seconds").read_text())
        assert len(bar) <= 1 + seconds / 5 + 1, bar  # at most a state per 5 s, + the final
    assert re.fullmatch(r"\[tfdist\] job succeeded: 2 tasks \(worker:0 0, worker:1 0\), "
                        r"0 restarts, \d+\.\d s\n", result.stderr), result.stderr


def step_times_task():
    """worker:0 prints two step-times lines (the shared formatter's), worker:1 then forged
    ones: the prefix alone, a terminal sequence for a name, a non-ASCII digit."""
    forged = ["tfdist step times", "tfdist step times over 3 steps: \x1b]52;c;AAAA\x07 "
              "slowest, computing 1.000 s a step (+10% on the others' median 0.900 s); the "
              "others waited 5% of their step time for it", "tfdist step times over \u0663 steps"]
    return f"""
        from tfdist.step_times_line import StepTimesLine, format_line
        if name == "worker:0":
            for steps, whole in ((4, False), (12, True)):
                print(format_line(StepTimesLine(steps=steps, slowest="worker:1", compute=0.25,
                                                lead=0.47, median=0.17, share=0.31,
                                                whole_run=whole)), flush=True)
            report("printed", "")
        else:
            wait_for("worker:0.printed")
            time.sleep(0.3)  # read after worker:0's lines
            print("\\n".join({forged!r}), flush=True)
    """


@pytest.mark.multiprocess
def test_the_summary_carries_the_last_step_times_line_and_ignores_forged_ones(
        tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, env=env, command=task(step_times_task(), tmp_path))

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "[worker:1] tfdist step times over 3 steps: \\x1b]52;c;AAAA\\x07 slowest, " \
           "computing 1.000 s a step (+10% on the others' median 0.900 s); the others waited " \
           "5% of their step time for it" in lines, lines  # shown escaped, as any line
    assert re.fullmatch(r"\[tfdist\] job succeeded: 2 tasks \(worker:0 0, worker:1 0\), "
                        r"0 restarts, \d+\.\d s; step times \(whole run, 12 steps\): worker:1 "
                        r"slowest \(\+47% computing\), the others waited 31% of their step "
                        r"time\n", result.stderr), result.stderr


def report_task(exit_code):
    lines = [line.decode() for line in LEADER_REPORT]
    return f"""
        if name == "worker:0":
            sys.stderr.write("".join(line + "\\n" for line in {lines!r}))
            sys.stderr.flush()
            print("still here", flush=True)
        if name == "worker:1":
            wait_for("worker:0.printed")
            sys.exit({exit_code})
        report("printed", "")
    """


@pytest.mark.multiprocess
def test_a_peer_gone_report_is_not_shown_when_every_task_succeeds(tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, env=env, command=task(report_task(0), tmp_path))

    assert result.returncode == 0, result.stderr
    assert "crashed" not in result.stdout + result.stderr
    assert "unhealthy" not in result.stdout
    assert "[worker:0] still here" in result.stdout.splitlines()
    assert ("[tfdist] worker:0: not shown: TF's 3-line report that a peer had stopped "
            "(logged when workers finish at different times; every task succeeded)"
            ) in result.stderr.splitlines()


@pytest.mark.multiprocess
def test_a_peer_gone_report_and_the_failure_are_shown_when_a_task_fails(tmp_path,
                                                                        write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, env=env, command=task(report_task(3), tmp_path))

    assert result.returncode == 3, result.stderr
    lines = result.stdout.splitlines()
    for line in LEADER_REPORT:
        assert "[worker:0] " + line.decode() in lines
    assert "not shown" not in result.stderr
    assert "[tfdist] worker:1 exited with code 3; stopping the other tasks" in result.stderr
    assert re.search(r"^\[tfdist\] job failed, worker:1 first \(exited with code 3\): 2 tasks "
                     r"\(worker:0 (0|stopped), worker:1 3\), 0 restarts, \d+\.\d s$",
                     result.stderr, re.M), result.stderr


@pytest.mark.multiprocess
def test_a_peer_gone_report_is_shown_when_a_task_failed_and_was_restarted(tmp_path,
                                                                          write_config, env):
    config = write_config(TWO_WORKERS)
    lines = [line.decode() for line in LEADER_REPORT]
    result = run_launch(config, "--max-restarts", "1", env=env, command=task(f"""
        if name == "worker:1" and not (out / "failed-once").exists():
            (out / "failed-once").touch()
            sys.exit(1)
        if name == "worker:0" and (out / "failed-once").exists():
            sys.stderr.write("".join(line + "\\n" for line in {lines!r}))
    """, tmp_path))

    assert result.returncode == 0, result.stderr
    assert "[worker:0] " + lines[-1] in result.stdout.splitlines()
    assert "not shown" not in result.stderr
    assert re.search(r"^\[tfdist\] job succeeded: 2 tasks \(worker:0 0, worker:1 0\), "
                     r"1 restart, ", result.stderr, re.M), result.stderr


@pytest.mark.multiprocess
def test_the_summary_counts_restarts_and_names_a_signal(tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, "--max-restarts", "1", env=env, command=task("""
        import signal
        if name == "worker:1":
            with open(out / "attempts", "a") as f:
                f.write("attempt\\n")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """, tmp_path))

    assert result.returncode == 137, result.stderr
    assert (tmp_path / "attempts").read_text() == "attempt\n" * 2
    summary_line = result.stderr.splitlines()[-1]
    assert re.fullmatch(r"\[tfdist\] job failed, worker:1 first \(killed by SIGKILL\): 2 tasks "
                        r"\(worker:0 stopped, worker:1 SIGKILL\), 1 restart, \d+\.\d s",
                        summary_line), result.stderr


# --- a real two-worker model.fit -------------------------------------------------------------

# worker:0 copies its stderr through a pipe it reads itself, so that it can stay until TF
# has logged that worker:1 (finished first) stopped sending heartbeats: the report that
# used to end a successful run with "The tasks have crashed".
FIT_TASK = """
    import threading
    if name == "worker:0":
        read_end, write_end = os.pipe()
        stderr = os.dup(2)
        os.dup2(write_end, 2)
        reported = threading.Event()

        def copy():
            seen = b""
            while data := os.read(read_end, 65536):
                os.write(stderr, data)
                seen = (seen + data)[-4096:]
                if b"stopped sending heartbeats" in seen:
                    reported.set()

        threading.Thread(target=copy, daemon=True).start()
    import numpy as np
    import keras
    import tensorflow as tf
    import tfdist

    strategy = tfdist.get_strategy("multi_worker_mirrored")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    data = tf.data.Dataset.from_tensor_slices(
        (np.ones((64, 4), "float32"), np.ones((64, 1), "float32"))).batch(8).repeat()
    model.fit(data, epochs=2, steps_per_epoch=3, verbose=1)
    if name == "worker:0":
        print("heartbeat report seen:", reported.wait(120), flush=True)
        os.dup2(stderr, 2)
        time.sleep(0.5)  # the copy thread passes on what is left in the pipe
"""


@pytest.mark.multiprocess
def test_a_two_worker_keras_fit_reads_cleanly_and_ends_without_a_crashed_line(
        tmp_path, write_config, env):
    config = write_config(TWO_WORKERS)
    result = run_launch(config, env=env, command=task(FIT_TASK, tmp_path), timeout=300)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert not CONTROL.search(result.stdout.encode())
    lines = result.stdout.splitlines()
    assert all(re.match(r"\[worker:[01]\] ", line) for line in lines), lines
    assert "[worker:0] heartbeat report seen: True" in lines  # the report was written...
    assert "crashed" not in result.stdout + result.stderr  # ...and not shown
    assert "worker:0: not shown: TF's 3-line report" in result.stderr
    for name in ("worker:0", "worker:1"):
        finals = [line for line in lines
                  if re.fullmatch(rf"\[{name}\] {FINAL_BAR}", line) and "3/3" in line]
        assert len(finals) == 2, lines  # one per epoch
    assert re.search(r"^\[tfdist\] job succeeded: 2 tasks \(worker:0 0, worker:1 0\), "
                     r"0 restarts, \d+\.\d s$", result.stderr, re.M), result.stderr
