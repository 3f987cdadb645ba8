"""One task of a local job: a child process in its own process group, output prefixed."""

import ctypes
import functools
import os
import select
import signal
import subprocess
import threading
import time

from tfdist.launch.rendering import LineRenderer
from tfdist.launch.shutdown_reports import ShutdownReports
from tfdist.step_times_line import PREFIX, parse_line

_STEP_TIMES = PREFIX.encode()
MAX_LINE = 64 * 1024  # bytes of a task's line; a longer one is cut into pieces
READ_SIZE = 64 * 1024
_TICK_MS = 1000  # how often a quiet task's progress bar is looked at
_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def child_setup(launcher_pid):
    """In the child, before exec: own process group, in the launcher's session; die with
    the launcher on Linux (and at once if the launcher already died between fork and
    here). Not a session of its own: Linux's scheduler shares the CPU fairly between
    sessions (autogroups), so a session per task would give a job of N tasks N shares
    against every other session on the machine, whatever their nice values."""
    os.setpgid(0, 0)
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != launcher_pid:
            os._exit(137)


class TaskProcess:
    """A task's process; its output goes to `sink` as ``[job:i] line``.

    Output is read in bounded chunks and rendered into lines by
    `tfdist.launch.rendering.LineRenderer` (progress bars become periodic lines; a line
    longer than `MAX_LINE` bytes is cut into prefixed pieces, so no output can make the
    launcher's memory grow). TF's reports that a peer has gone are held in `reports`
    (`tfdist.launch.shutdown_reports`) until the launcher knows whether the job failed.
    The last well-formed step-times line it printed (`tfdist.step_times_line`) is kept in
    `step_times`, as (time.monotonic() when read, `StepTimesLine`), across restarts.

    Args:
        name: the task name, e.g. ``worker:1``.
        argv: the command to run.
        env: the complete environment of the child.
        sink: the `Sink` shared by all tasks (the launcher's stdout).
        is_server: the task hosts a TF server that only stops when told to.
        preloader: a `tfdist.launch.preload.Preloader` to fork the process from, where it
            can (else it is started with exec).
    """

    def __init__(self, name, argv, env, sink, is_server=False, preloader=None):
        self.name, self.argv, self.env, self.is_server = name, argv, env, is_server
        self._preloader = preloader
        self._sink = sink
        self.proc = None
        self._reader = None
        self.restarts = 0
        self.last_progress = time.monotonic()
        self._cpu_ticks = 0
        self.hung = False
        self.group_killed = False  # the leader exited and its group was killed
        self.stopped = False  # the launcher told it to stop while it ran
        self.reports = ShutdownReports()
        self.step_times = None
        self._waiting_for_output_room = False

    def start(self):
        """Starts (or restarts) the process.

        Raises:
            OSError: the command cannot be executed (not found, E2BIG, EMFILE...).
            LaunchError: the preloader failed (`tfdist.launch.preload`).
        """
        forked = self._preloader and self._preloader.popen(self.argv, self.env, self.name)
        self.proc = forked or subprocess.Popen(
            self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, preexec_fn=functools.partial(child_setup, os.getpid()))
        self._reader = threading.Thread(target=self._pump, args=(self.proc.stdout,),
                                        name=f"output of {self.name}", daemon=True)
        self._reader.start()
        self.last_progress, self._cpu_ticks, self.hung = time.monotonic(), 0, False
        self.group_killed = self.stopped = False

    def _pump(self, stream):
        renderer = LineRenderer(MAX_LINE, keep_colour=self._sink.is_terminal)
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            while True:
                try:
                    if not poller.poll(_TICK_MS):
                        self._emit(renderer.tick(time.monotonic()))
                        continue
                    data = os.read(fd, READ_SIZE)
                except OSError:
                    break
                if not data:
                    break
                self.last_progress = time.monotonic()
                self._emit(renderer.feed(data, self.last_progress))
            self._emit(renderer.flush())
        finally:
            stream.close()

    def _emit(self, lines):
        """Prints `lines` (not TF's peer-gone reports: they are held)."""
        lines = self.reports.filter(lines)
        if not lines:
            return
        self._note_step_times(lines)
        self._waiting_for_output_room = True  # not hung: waiting for our stdout
        try:
            self._sink.put(self._prefixed(lines))
        finally:
            self._waiting_for_output_room = False
            self.last_progress = time.monotonic()

    def _note_step_times(self, lines):
        """Keeps the last step-times line of `lines` that parses (malformed ones are
        printed as any line is, and otherwise ignored)."""
        for line in reversed(lines):
            found = parse_line(line.decode("utf-8", "replace")) if _STEP_TIMES in line else None
            if found is not None:
                self.step_times = (time.monotonic(), found)
                return

    def _prefixed(self, lines):
        prefix = f"[{self.name}] ".encode()
        return b"".join(prefix + line + b"\n" for line in lines)

    def release_reports(self, keep):
        """Prints (`keep`) or drops the peer-gone reports held so far; returns how many
        lines were dropped."""
        held = self.reports.take()
        if keep and held:
            self._sink.put(self._prefixed(held), block=False)
        return 0 if keep else len(held)

    def poll(self):
        """The exit code, or None while running (negative: killed by that signal)."""
        return self.proc.poll() if self.proc else None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def signal_group(self, sig):
        """Sends `sig` to the task's whole process group (its children too)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def seconds_without_progress(self):
        """Seconds since the task last printed a line or used CPU time (its whole
        process group): a task blocked on a dead peer does neither."""
        ticks = _group_cpu_ticks(self.proc.pid) if self.proc else 0
        if self._waiting_for_output_room:
            self.last_progress = time.monotonic()
        if ticks != self._cpu_ticks:
            self._cpu_ticks, self.last_progress = ticks, time.monotonic()
        return time.monotonic() - self.last_progress

    def wait_output(self, timeout=2.0):
        """Waits for the output pump to drain (after the process has exited)."""
        if self._reader is not None:
            self._reader.join(timeout)

    def kill_group_after_exit(self):
        """Once the leader has exited, SIGKILLs what is left of its process group (its
        children), so a restart or the job's end leaves none of them behind."""
        if self.proc is not None and not self.group_killed and self.poll() is not None:
            self.group_killed = True
            self.signal_group(signal.SIGKILL)


def exit_code(returncode):
    """A shell-style exit code: a signal-killed child (-9) becomes 128 + 9."""
    return 128 - returncode if returncode < 0 else returncode


def _group_cpu_ticks(pgid):
    """User + system CPU ticks of every live process in process group `pgid` (Linux)."""
    total = 0
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state ppid pgrp ...
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total
