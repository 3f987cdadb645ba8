"""What the launcher needs of the operating system's limits: enough open files for the
job's tasks, and a one-line reason when a task cannot be started."""

import errno
import resource

from tfdist.launch import reaper
from tfdist.launch.errors import LaunchError

FILES_PER_TASK = 3  # its output pipe; while starting, the exec-error pipe; a probed port
FILES_SPARE = 32


def ensure_open_files(tasks):
    """Raises the soft open-files limit as far as `tasks` tasks need (up to the hard
    limit); returns the previous limits to restore, or None if unchanged.

    Raises:
        LaunchError: even the hard limit is too low.
    """
    need = reaper.open_files() + FILES_PER_TASK * tasks + FILES_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        raise LaunchError(
            f"{tasks} tasks need about {need} open files, but the open-files limit is "
            f"{soft} (hard limit {hard}); raise it, e.g. with `ulimit -n {need}`")
    set_open_files((need, hard))
    return soft, hard


def set_open_files(limits):
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    except (OSError, ValueError):
        pass


def start_failure(task, error):
    """The one-line reason `task` could not be started."""
    reason = error.strerror or str(error)
    if error.errno in (errno.EMFILE, errno.ENFILE):
        hint = "; raise the open-files limit (ulimit -n)"
    elif error.errno == errno.E2BIG:
        size = sum(len(k) + len(v) + 2 for k, v in task.env.items())
        size += sum(len(a) + 1 for a in task.argv)
        hint = (f"; its command line and environment are {size} bytes "
                f"(TF_CONFIG alone {len(task.env.get('TF_CONFIG', ''))})")
    elif error.errno == errno.EAGAIN:
        hint = "; the process limit (ulimit -u) or memory is exhausted"
    else:
        hint = ""
    return f"{task.name}: cannot run {task.argv[0]!r}: {reason}{hint}"
