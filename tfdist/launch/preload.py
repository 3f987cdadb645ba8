"""`tfdist launch --preload tensorflow,keras`: tasks forked from one process that imported
those modules, instead of each importing them (about 4 s of CPU for TensorFlow and Keras:
a job of 4 workers imports them once, and a restarted task starts without importing).

The process is `tfdist.launch.preload_server`, started at the first task. A task is forked
from it only when it would run the same interpreter the same way: its argv is that
Python with at most ``-u``, then a script or ``-m module`` (what `tfdist launch` runs for a
``python train.py`` command and for parameter_server's TF servers), and its environment
equals the one the server started with but for `PER_TASK` (what the launcher sets per task),
and the two fit one message on the socket (a command line of hundreds of kilobytes does not).
Any other task is started with ``exec`` as without the option. What forked tasks share
(Python's hash seed, the imported modules' state): `tfdist.launch.preload_server`.

The default of ``--preload`` is the environment variable ``TFDIST_PRELOAD`` (a
comma-separated list; empty: off).
"""

import errno
import functools
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading

from tfdist import resize_signal
from tfdist.launch.errors import LaunchError
from tfdist.launch.task_process import child_setup

ENV = "TFDIST_PRELOAD"
#: what the launcher sets per task: a task may differ from the server only in these
PER_TASK = frozenset({"TF_CONFIG", "TMPDIR", "TEMP", "TMP", resize_signal.ENV,
                      resize_signal.PLACES_ENV})
READY_SECONDS = 600.0  # the imports' time, on a machine as loaded as a test suite's
REPLY_SECONDS = 60.0
MAX_TEXT = 4096  # characters of the comma-separated names
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def modules(text, source):
    """The module names of a comma-separated `text` (None or empty: ()).

    Raises:
        LaunchError: a name that is not a dotted Python identifier, naming `source`.
    """
    if not text or not text.strip():
        return ()
    if len(text) > MAX_TEXT:
        raise LaunchError(f"{source}: {len(text)} characters of module names; at most "
                          f"{MAX_TEXT}")
    names = tuple(name.strip() for name in text.split(","))
    for name in names:
        if not _MODULE.match(name):
            raise LaunchError(f"{source}: {name!r} is not a module name; give Python "
                              f"modules separated by commas, e.g. tensorflow,keras. "
                              f"Received: {text!r}"[:2000])
    return names


def entry(argv, env):
    """(python, kind, target, args) of a task `argv` a server can fork — kind "module"
    (``-m target``) or "script" — else None."""
    python = shutil.which(argv[0], path=env.get("PATH")) if argv else None
    rest = list(argv[1:])
    while rest and rest[0] == "-u":
        rest.pop(0)
    if python is None or not rest or not os.path.basename(python).startswith("python"):
        return None
    if rest[0] == "-m" and len(rest) > 1:
        return os.path.abspath(python), "module", rest[1], rest[2:]
    if rest[0].startswith("-"):
        return None
    return os.path.abspath(python), "script", rest[0], rest[1:]


def _shared(env):
    return {k: v for k, v in env.items() if k not in PER_TASK}


class Preloader:
    """The server the tasks of one launch are forked from (started at the first task).

    Args:
        modules: the module names to import once.
        tmpdir: the launch's directory (the server's TMPDIR and its log).
    """

    def __init__(self, modules, tmpdir):
        self.modules, self.tmpdir = tuple(modules), tmpdir
        self.proc = None
        self._python = self._env = self._sock = None
        self._lock = threading.Lock()
        self._replies, self._forked, self._gone = queue.Queue(), set(), threading.Event()
        self._codes, self._ended = {}, {}

    def popen(self, argv, env, name):
        """A `ForkedProcess` for the task named `name`, or None when it is not one to fork
        (`entry`).

        Raises:
            LaunchError: the server could not import the modules or stopped answering.
        """
        found = entry(argv, env)
        if found is None:
            return None
        python, kind, target, args = found
        with self._lock:
            if self.proc is None or self.proc.poll() is not None or self._gone.is_set():
                self.close()  # a gone server's socket and process (its end may be seen first)
                self._start(python, env)
            if python != self._python or _shared(env) != self._env:
                return None
            return self._fork(dict(kind=kind, target=target, args=args, env=env,
                                   cwd=os.getcwd(), name=name))

    def _start(self, python, env):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        path = os.path.join(self.tmpdir, "preload")
        os.makedirs(path, exist_ok=True)
        log = self._log = os.path.join(self.tmpdir, "preload.log")
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [python, "-m", "tfdist.launch.preload_server", ",".join(self.modules),
                 str(theirs.fileno())], pass_fds=[theirs.fileno()],
                env=dict(_shared(env), TMPDIR=path, TEMP=path, TMP=path),  # no TF_CONFIG
                stdin=subprocess.DEVNULL,
                stdout=out, stderr=out, preexec_fn=functools.partial(child_setup, os.getpid()))
        theirs.close()
        self._python, self._env, self._sock = python, _shared(env), ours
        ours.settimeout(READY_SECONDS)
        try:
            said = json.loads(ours.recv(1 << 16) or b"{}")
        except (OSError, ValueError):
            said = {}
        ours.settimeout(None)
        if "ready" not in said:
            self.close()
            raise LaunchError(f"--preload {','.join(self.modules)}: "
                              f"{said.get('error') or _tail(log)}")
        # this server's own: a gone one's last word and its tasks stay its own
        self._replies, self._forked, self._gone = queue.Queue(), set(), threading.Event()
        threading.Thread(target=self._read, name="preload server", daemon=True,
                         args=(ours, self._replies, self._forked, self._gone)).start()

    def _fork(self, request):
        read, write = os.pipe()
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], [write])
        except OSError as e:
            os.close(read)
            if e.errno == errno.EMSGSIZE:  # over the socket's buffer: exec'd instead
                return None
            raise LaunchError(f"--preload: the server did not take a task ({e})") from None
        finally:
            os.close(write)
        try:
            pid = self._replies.get(timeout=REPLY_SECONDS)
        except queue.Empty:
            pid = None
        if pid is None:
            os.close(read)
            if self._gone.is_set():
                raise LaunchError(f"--preload: {_tail(self._log, 'before it forked the task')}")
            raise LaunchError(f"--preload: the server (pid {self.proc.pid}) forked no task "
                              f"within {REPLY_SECONDS:g}s")
        self._ended.setdefault(pid, threading.Event())  # its exit may have come first
        self._forked.add(pid)
        return ForkedProcess(pid, os.fdopen(read, "rb", buffering=0), self)

    def _read(self, sock, replies, forked, gone):
        """The server's messages: each fork's pid, each task's end; when it is gone, every
        task it had is taken as killed (they die with it)."""
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            said = json.loads(data)
            if "pid" in said:
                replies.put(said["pid"])
            elif "exit" in said:
                self._end(said["exit"], said["code"])
        gone.set()
        for pid in list(forked):
            self._end(pid, -signal.SIGKILL)
        replies.put(None)

    def _end(self, pid, code):
        self._codes.setdefault(pid, code)
        self._ended.setdefault(pid, threading.Event()).set()

    def code(self, pid):
        return self._codes.get(pid)

    def wait(self, pid, timeout):
        if not self._ended[pid].wait(timeout):
            raise subprocess.TimeoutExpired("preloaded task", timeout)
        return self._codes[pid]

    def close(self):
        """Ends the server (its tasks have ended: it just exits) and waits for it."""
        if self._sock is not None:
            try:  # shutdown, not only close: it wakes the reader thread blocked in recv
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ForkedProcess:
    """The part of `subprocess.Popen` a task uses, for a task the server forked."""

    def __init__(self, pid, stdout, server):
        self.pid, self.stdout, self._server = pid, stdout, server

    @property
    def returncode(self):
        return self._server.code(self.pid)

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self._server.wait(self.pid, timeout)

    def send_signal(self, sig):
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self):
        self.send_signal(signal.SIGKILL)


def _tail(path, when="before it was ready", lines=5):
    try:
        with open(path, errors="replace") as f:
            said = [line.rstrip() for line in f if line.strip()]
    except OSError:
        said = []
    ended = f"the server ended {when}"
    return ended + (": " + " | ".join(said[-lines:]) if said else "")
