"""The process `tfdist launch --preload` forks its tasks from (`tfdist.launch.preload`).

    python -m tfdist.launch.preload_server MODULES FD

imports the comma-separated MODULES once, says so on the socket FD, then forks a task for
each request that comes in on it, as a server of a zygote would (Android's zygote, the
"forkserver" of Python's multiprocessing). A request is one message: JSON
``{"argv": [...], "env": {...}, "cwd": ...}`` with the file descriptor the task's output
goes to; the answer is ``{"pid": N}``. When a task ends, ``{"exit": N, "code": C}`` (C
negative: the signal that killed it, as `subprocess.Popen.returncode`). The server ends
when the launcher closes its end; its tasks die with it (``PR_SET_PDEATHSIG``).

A forked task is in a fresh process's state as far as Python lets it be: its own process
group, its argv, environment, working directory, ``sys.path[0]``, stdin ``/dev/null``, stdout
and stderr the given descriptor, default SIGTERM and SIGINT, NumPy's and Python's global
generators and ``tempfile``'s directory drawn anew, its name (``/proc/PID/comm``) the
task's, e.g. ``worker:1``. What it shares with its siblings
and cannot be reset: the modules imported and whatever they read at import (the launcher
only forks a task whose environment equals the server's but for `PER_TASK`), and Python's
hash seed (``PYTHONHASHSEED``: the order of a set of strings is the same in every task).
Its command line and ``/proc/PID/environ`` are the server's (``os.environ`` is the task's),
and a program may rename itself (absl's ``app.run`` does): a process finds a task by the
file ``tasks/PID`` in the server's ``TMPDIR``, which holds the task's name while it runs
(best effort: where it cannot be written, the task runs without it).
"""

import ctypes
import gc
import json
import os
import runpy
import select
import signal
import socket
import sys
import tempfile
import traceback

from tfdist.launch.task_process import child_setup

_PR_SET_NAME = 15
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None
MESSAGE_BYTES = 1 << 20  # a request (argv + environment) larger than this is refused
_REAP_SECONDS = 0.05
_NAMES = os.path.join(tempfile.gettempdir(), "tasks")  # tasks/PID: the name of a task running


def main(argv):
    modules, sock = argv[1].split(","), socket.socket(fileno=int(argv[2]))
    try:
        for name in modules:
            __import__(name)
    except BaseException as e:  # noqa: BLE001 - any failure of an import is said, whole
        _send(sock, {"error": f"import {name} failed: "
                              f"{traceback.format_exception_only(e)[-1].strip()}"})
        return 1
    _send(sock, {"ready": modules})
    gc.freeze()  # the imported objects stay out of the tasks' collections: fewer pages copied
    request = _serve(sock)
    if request is None:
        return 0
    return _run(request)


def _serve(sock):
    """Forks a task per request; returns the request in the task, None in the server once
    the launcher has gone."""
    tasks, server = set(), os.getpid()
    while True:
        readable, _, _ = select.select([sock], [], [], _REAP_SECONDS)
        _report_exits(sock, tasks)
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
        except OSError:
            data, fds = b"", []
        if not data:
            return None
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            sock.close()
            _become_task(request, fds[0], server)
            return request
        for fd in fds:
            os.close(fd)
        try:
            os.setpgid(pid, pid)  # also here: a signal to its group right after works
        except OSError:
            pass
        tasks.add(pid)
        _list(pid, request["name"])
        _send(sock, {"pid": pid})


def _report_exits(sock, tasks):
    for pid in list(tasks):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            tasks.discard(pid)
            _list(pid, None)
            _send(sock, {"exit": pid, "code": -os.WTERMSIG(status) if os.WIFSIGNALED(status)
                         else os.WEXITSTATUS(status)})


def _list(pid, name):
    """``tasks/PID`` written with `name`, or removed (None); best effort: a task that
    removed the directory, a full disk, cost the name's file only, never the server."""
    path = os.path.join(_NAMES, str(pid))
    try:
        if name is None:
            os.remove(path)
            return
        os.makedirs(_NAMES, exist_ok=True)
        with open(path, "w") as f:
            f.write(name)
    except OSError:
        pass


def _become_task(request, output_fd, server):
    """This forked process made into the task `request` describes (before its code runs)."""
    child_setup(server)
    _name(request["name"])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    for fd in (null, output_fd):
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    tempfile.tempdir = None
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _name(name):
    """The process's name (``/proc/PID/comm``, what ``ps -o comm``, ``top`` and ``pkill``
    show): the task's, e.g. ``worker:1`` (its command line and ``/proc/PID/environ``
    are the server's: a forked process cannot change them)."""
    if _prctl is not None:
        _prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _run(request):
    """Runs the task's script (or ``-m`` module) as `python` would run it as ``__main__``;
    its exit code."""
    kind, target, args = request["kind"], request["target"], request["args"]
    if kind == "module":
        sys.path[0] = os.getcwd()
        sys.argv = [target, *args]
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        sys.argv = [target, *args]
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - printed as Python prints an uncaught one
        traceback.print_exception(type(e), e, _from_the_task(e.__traceback__))
        return 1
    return 0


def _from_the_task(tb):
    """`tb` without its first frames of this module and runpy: the traceback Python prints
    for the script run directly."""
    while tb is not None and tb.tb_next is not None and (
            tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
            or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        tb = tb.tb_next
    return tb


def _send(sock, message):
    sock.send(json.dumps(message).encode())  # a SOCK_SEQPACKET: one message per send


if __name__ == "__main__":
    sys.exit(main(sys.argv))
