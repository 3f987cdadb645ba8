"""A store's files read and written as hostile input: regular files only (a FIFO or a device
is named, never waited on), sizes bounded before anything is loaded, symlinks never
followed, temporary names created exclusively."""

import errno
import json
import os
import stat
import tempfile

from tfdist.errors import TfdistError

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(TfdistError, OSError):
    """A file of a store that is not what the store wrote (not a regular file, too large)."""


def open_regular(path, limit):
    """A binary file object of the regular file `path` (not followed through a symlink,
    opened without blocking) of at most `limit` bytes.

    Raises:
        UnsafeFile: `path` is a symlink, a FIFO, a device, a directory or too large.
        OSError: it cannot be opened (missing, unreadable).
    """
    try:
        descriptor = os.open(path, _READ)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeFile(f"{path} is a symlink; a store reads only its own files") from None
        raise
    try:
        info = os.fstat(descriptor)
        check_regular(path, info, limit)
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def check_regular(path, info, limit):
    """Raises UnsafeFile unless `info` (an os.stat result of `path`) is a regular file of at
    most `limit` bytes."""
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFile(f"{path} is not a regular file ({_kind(info.st_mode)}); "
                         "a store reads only the files it wrote")
    if info.st_size > limit:
        raise UnsafeFile(f"{path} holds {info.st_size} bytes, more than the {limit} this "
                         "file can hold")


def check_path(path, limit):
    """`check_regular` of `path` itself (not followed through a symlink), for a file that a
    library opens by name."""
    check_regular(path, os.lstat(path), limit)


def read_json(path, limit):
    """The JSON object in the regular file `path` (at most `limit` bytes; no NaN or
    infinity)."""
    with open_regular(path, limit) as f:
        text = f.read(limit + 1)
    value = json.loads(text, parse_constant=_refuse_constant)
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def read_text(path, limit):
    with open_regular(path, limit) as f:
        return f.read(limit + 1).decode("utf-8", errors="replace")


def replace_text(path, text):
    """Writes `text` to `path` atomically and durably, through a temporary file created
    exclusively (never through a symlink planted under its name)."""
    directory = os.path.dirname(path) or "."
    descriptor, temporary = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, dir=directory)
    try:
        with os.fdopen(descriptor, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)  # a rename replaces a symlink, never its target
    except BaseException:
        _unlink_quietly(temporary)
        raise
    sync_dir(directory)


#: The prefix of every temporary name a store creates (`tempfile`: unpredictable, exclusive).
TEMPORARY_PREFIX = ".tfdist-tmp-"
STAGING_PREFIX = ".incomplete-"


def sync_tree(path):
    for root, _, files in os.walk(path):
        for name in files:
            with open_regular(os.path.join(root, name), float("inf")) as f:
                os.fsync(f.fileno())
        sync_dir(root)


def sync_dir(path):
    descriptor = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _refuse_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _kind(mode):
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"
