"""Finding and ending every process a launch started, and what a killed launcher left.

Why a child subreaper and an environment tag, not a cgroup: a cgroup would contain every
descendant for sure, but creating one needs a delegated, writable cgroup-v2 subtree
(systemd's ``Delegate=``, root, or a container that grants it), which a user running
``tfdist launch`` from a shell, a CI job or a notebook usually does not have; and it
would still need the same clean-up for a SIGKILLed launcher. `PR_SET_CHILD_SUBREAPER`
(Linux >= 3.4) needs no privilege: a descendant whose parent dies (a grandchild that
called ``setsid`` and was left by its task) is reparented to the launcher instead of
init, so it stays in the launcher's process tree. Every task's environment carries
``TFDIST_LAUNCH_DIR=<the launch's private directory>``, which children inherit; the
sweep kills every process of this user that carries the tag, their descendants, and the
orphans the launcher adopted, then reaps those of them that are its own children (by pid:
never ``waitpid(-1)``, which would steal `subprocess`'s children).

Limits: processes are found through ``/proc`` (Linux only; elsewhere nothing is swept);
a descendant that both replaced its environment (``env -i``) and left the launcher's tree
through a double fork while the launcher was not a subreaper, or that runs as another user
(setuid), is not found; a process that forks faster than a sweep round can outrun it
(the sweep makes bounded rounds).
"""

import ctypes
import os
import re
import shutil
import signal
import stat as stat_module
import time

ENV_TAG = "TFDIST_LAUNCH_DIR"
DIR_PREFIX = "tfdist-launch-"
# tfdist-launch-<launcher pid>-<its start time in clock ticks>-<random>
_DIR_NAME = re.compile(re.escape(DIR_PREFIX) + r"(\d+)-(\d+)-[0-9a-z_]+\Z")
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_SWEEP_ROUNDS = 20

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def enable_subreaper():
    """Makes this process a child subreaper; returns the previous setting (None if the
    system has no subreapers)."""
    if _prctl is None:
        return None
    previous = ctypes.c_int(0)
    if _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
        return None
    if _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return None
    return previous.value


def restore_subreaper(previous):
    if _prctl is not None and previous is not None:
        _prctl(_PR_SET_CHILD_SUBREAPER, previous, 0, 0, 0)


def start_time(pid):
    """The start time of `pid` in clock ticks since boot, or None if it does not exist."""
    stat = _stat(pid)
    return stat[19] if stat else None


def dir_name(token):
    """The name of a launch's private directory: it names this launcher (pid and start
    time, so a reused pid is not mistaken for it)."""
    return f"{DIR_PREFIX}{os.getpid()}-{start_time(os.getpid()) or 0}-{token}"


def _stat(pid):
    """The fields after "(comm)" of /proc/PID/stat (state is [0], ppid [1]), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return [fields[0].decode()] + [int(x) for x in fields[1:]]
    except (OSError, IndexError, ValueError):
        return None


def _table():
    """{pid: (ppid, state, start time)} of every process visible in /proc."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if entry.isdigit():
            stat = _stat(entry)
            if stat:
                table[int(entry)] = (stat[1], stat[0], stat[19])
    return table


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"\0" + f.read()
    except OSError:
        return b""


def _tag_value(environ):
    """The value of ENV_TAG in a raw environment, or None."""
    key = b"\0" + ENV_TAG.encode() + b"="
    at = environ.find(key)
    if at < 0:
        return None
    value = environ[at + len(key):].split(b"\0", 1)[0]
    return os.fsdecode(value)


def _descendants(table, roots):
    children = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        for child in children.get(pid, ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def children():
    """The pids of this process's children."""
    me = os.getpid()
    return {pid for pid, (ppid, _, _) in _table().items() if ppid == me}


def sweep(launch_dir, *, adopted_besides=None, keep=()):
    """Kills every process of the launch `launch_dir` and reaps those that are our children.

    Taken: processes whose environment carries ``TFDIST_LAUNCH_DIR=launch_dir``, their
    descendants, and (when `adopted_besides` is given) children of this process that are
    not in it, with their descendants: orphans adopted as subreaper, even if they dropped
    the tag. Children in `adopted_besides` (`subprocess`'s own, which it waits for itself,
    and the host's) are never waited for here. The processes in `keep` are spared (the
    preloading process between restarts), not their other descendants. Returns how many
    processes were killed.
    """
    me, killed = os.getpid(), set()
    spare = set(adopted_besides or ())
    for _ in range(_SWEEP_ROUNDS):
        table = _table()
        roots = {pid for pid in table if pid != me and _tag_value(_environ(pid)) == launch_dir}
        if adopted_besides is not None:
            roots |= {pid for pid, (ppid, _, _) in table.items()
                      if ppid == me and pid not in spare}
        roots -= set(keep)
        targets = (roots | _descendants(table, roots)) - {me} - set(keep)
        live = {pid for pid in targets if table[pid][1] not in "ZX"}
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed |= live
        _reap({pid for pid in targets if table[pid][0] == me} - spare)
        if not live:
            break
        time.sleep(0.02)
    return len(killed)


def reap_adopted(spare):
    """Reaps exited children of this process that `subprocess` does not know (`spare`
    are its pids): orphans that exited after being adopted as subreaper."""
    me = os.getpid()
    _reap({pid for pid, (ppid, state, _) in _table().items()
           if ppid == me and state == "Z" and pid not in spare})


def _reap(pids):
    for pid in pids:
        deadline = time.monotonic() + 1.0
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours (any more)
                break
            except OSError:
                break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.01)


def _launcher_alive(pid, started):
    stat = _stat(pid)
    if stat is not None:
        return stat[19] == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # cannot tell: keep its files
        return True
    return True  # exists but /proc is hidden: keep its files


def clean_stale(tmp_root):
    """Removes what launchers that died without cleaning up (SIGKILL, power loss) left:
    their private directories under `tmp_root` (this user's only) and every process whose
    environment still carries the tag of a dead launcher whose directory was under
    `tmp_root` (a launch with another TMPDIR, e.g. a parallel test, is left alone).

    Returns:
        (directories removed, processes killed).
    """
    dead = _dead_launch_dirs(tmp_root)
    killed = _kill_tagged_by_dead(tmp_root)
    dirs = 0
    for path in dead:
        shutil.rmtree(path, ignore_errors=True)
        dirs += not os.path.lexists(path)
    return dirs, killed


def _dead_launch_dirs(tmp_root):
    """The private directories under `tmp_root` of this user's launchers that are dead."""
    uid, dead = os.getuid(), []
    try:
        entries = os.listdir(tmp_root)
    except OSError:
        entries = []
    for entry in entries:
        match = _DIR_NAME.match(entry)
        if not match:
            continue
        path = os.path.join(tmp_root, entry)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid == uid and _is_dir(st.st_mode) and not _launcher_alive(int(match[1]),
                                                                            int(match[2])):
            dead.append(path)
    return dead


def _kill_tagged_by_dead(tmp_root):
    """SIGKILLs every process (but this one) tagged by a dead launcher under `tmp_root`;
    returns how many."""
    me, killed = os.getpid(), 0
    for pid in _table():
        if pid == me:
            continue
        tag = _tag_value(_environ(pid))
        if tag is None:
            continue
        match = _DIR_NAME.match(os.path.basename(tag))
        if (match and os.path.dirname(tag) == tmp_root
                and not _launcher_alive(int(match[1]), int(match[2]))):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def _is_dir(mode):
    return stat_module.S_ISDIR(mode)


def open_files():
    """How many file descriptors this process has open (a guess where /proc is absent)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 16


__all__ = ["ENV_TAG", "children", "clean_stale", "dir_name", "enable_subreaper", "open_files",
           "reap_adopted", "restore_subreaper", "start_time", "sweep"]
