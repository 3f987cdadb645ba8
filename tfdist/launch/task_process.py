"""One task of a local job: a child process in its own process group, output prefixed."""

import ctypes
import os
import signal
import subprocess
import threading
import time

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _child_setup():
    """In the child, before exec: own process group; die with the launcher on Linux."""
    os.setsid()
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class TaskProcess:
    """A task's process; its output lines are written to `out` as ``[job:i] line``.

    Args:
        name: the task name, e.g. ``worker:1``.
        argv: the command to run.
        env: the complete environment of the child.
        out: a text stream shared by all tasks; `lock` serialises writes to it.
        is_server: the task hosts a TF server that only stops when told to.
    """

    def __init__(self, name, argv, env, out, lock, is_server=False):
        self.name, self.argv, self.env, self.is_server = name, argv, env, is_server
        self._out, self._lock = out, lock
        self.proc = None
        self._reader = None
        self.restarts = 0
        self.last_progress = time.monotonic()
        self._cpu_ticks = 0
        self.hung = False

    def start(self):
        """Starts (or restarts) the process.

        Raises:
            OSError: the command cannot be executed (e.g. not found).
        """
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     preexec_fn=_child_setup)
        self._reader = threading.Thread(target=self._pump, args=(self.proc.stdout,),
                                        name=f"output of {self.name}", daemon=True)
        self._reader.start()
        self.last_progress, self._cpu_ticks, self.hung = time.monotonic(), 0, False

    def _pump(self, stream):
        prefix = f"[{self.name}] "
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.last_progress = time.monotonic()
            with self._lock:
                self._out.write(prefix + line + "\n")
                self._out.flush()
        stream.close()

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
        if ticks != self._cpu_ticks:
            self._cpu_ticks, self.last_progress = ticks, time.monotonic()
        return time.monotonic() - self.last_progress

    def wait_output(self, timeout=2.0):
        """Waits for the output pump to drain (after the process has exited)."""
        if self._reader is not None:
            self._reader.join(timeout)


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
