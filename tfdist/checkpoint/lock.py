"""One writer per store directory: an advisory lock that a killed writer cannot leave held.

The lock is `flock` on the file `.lock` in the directory: the kernel (and NFS, where Linux
maps it to a byte-range lock) releases it when its holder dies, however it dies. The file
says who holds it (pid, host, run, since when), for the refusal's one line. Inside one
process a directory has one lock, shared by the stores of the same run.
"""

import errno
import fcntl
import json
import os
import socket
import threading
import time

from tfdist.checkpoint.files import UnsafeFile, check_regular, read_json

LOCK = ".lock"
_HOLDER_BYTES = 4096
_held = {}          # realpath of a directory -> _Lock held by this process
_held_guard = threading.Lock()


class LockedByAnother(UnsafeFile):
    """Another run writes this directory now."""


class _Lock:
    def __init__(self, directory, descriptor, run_id):
        self.directory, self.descriptor, self.run_id, self.users = directory, descriptor, \
            run_id, 1

    def release(self, remove_file=False):
        """One user lets go; the last closes the lock. `remove_file` (the run's backups are
        removed: it is done with the directory) lets go for every user of this process,
        such as a run interrupted in it that never ended."""
        with _held_guard:
            self.users = 0 if remove_file else self.users - 1
            if self.users > 0 or self.descriptor is None:
                return
            _held.pop(os.path.realpath(self.directory), None)
            if remove_file:
                try:
                    os.unlink(os.path.join(self.directory, LOCK))
                except OSError:
                    pass
            os.close(self.descriptor)
            self.descriptor = None


def acquire(directory, run_id):
    """The lock of `directory` for the run `run_id` (None: any), without waiting.

    Raises:
        LockedByAnother: another process (or another run of this one) holds it.
        UnsafeFile: `.lock` is a symlink or not a regular file.
    """
    key = os.path.realpath(directory)
    with _held_guard:
        held = _held.get(key)
        if held is not None:
            return _share(held, directory, run_id)
        descriptor = _lock_file(directory, os.path.join(directory, LOCK))
        _write_holder(descriptor, run_id)
        lock = _held[key] = _Lock(directory, descriptor, run_id)
        return lock


def _share(held, directory, run_id):
    """The lock this process holds, one more user of it if it is held for `run_id`."""
    if held.run_id != run_id:
        raise LockedByAnother(f"{directory} is in use by another run of this process "
                              f"(run {held.run_id}); give this run another directory")
    held.users += 1
    return held


def _lock_file(directory, path):
    """A descriptor of the lock file `path` of `directory`, locked without waiting."""
    while True:
        descriptor = _open_lock_file(path)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LockedByAnother(f"{directory} is in use by another run "
                                      f"({_holder(path)}): only one run writes a backup "
                                      "directory at a time; give this run another "
                                      "directory") from None
            raise
        # the holder before us may have removed the file as it let go: lock the file that
        # is at the path now
        if _is_at(descriptor, path):
            return descriptor
        os.close(descriptor)


def _is_at(descriptor, path):
    """Whether the open file `descriptor` is the file at `path` now."""
    try:
        return os.fstat(descriptor).st_ino == os.lstat(path).st_ino
    except FileNotFoundError:
        return False


def _open_lock_file(path):
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeFile(f"{path} is a symlink; the lock is a file of the store's own") \
                from None
        raise
    try:
        check_regular(path, os.fstat(descriptor), float("inf"))
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _write_holder(descriptor, run_id):
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "run": run_id,
              "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(holder).encode(), 0)


def _holder(path):
    try:
        holder = read_json(path, _HOLDER_BYTES)
        return (f"pid {holder.get('pid')} on {holder.get('host')}, run {holder.get('run')}, "
                f"since {holder.get('since')}")[:300]
    except (OSError, ValueError):
        return "holder unknown"
