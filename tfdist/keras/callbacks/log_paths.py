"""Where a log callback writes: refused before the first training step when it cannot.

Keras' `TensorBoard` and `CSVLogger` find a bad place late: a disk that fills up during
the run loses the events without a word, or, once the writer's queue (10 events) is full,
fails in TensorFlow's words over several lines (TensorFlow 2.21's writer reports a failed
write to a flush only, not to `close`, and Keras' callback never flushes); the CSV file's
`[Errno 28]` names no path. Here the shape of a path is checked at construction
(`check_place`: pure, no file system change), the place is written once before training
(`probe_directory`, `probe_file`: a file created, written, synced and removed), and a
write that fails during the run names the file and the reason in one line (`writing`).
Paths of TensorFlow's other file systems (``gs://``...) are left to it.
"""

import contextlib
import os
import stat
import tempfile

from tfdist.config.yaml_source import Source
from tfdist.errors import shown
from tfdist.keras.written import writing


def local(path):
    """Whether `path` is on the local file system (not ``scheme://``)."""
    return "://" not in str(path)


def check_place(caller, key, path, directory):
    """ConfigError unless `path` can be a directory (`directory`) or a file: an existing
    path of the other kind, or an ancestor that exists and is not a directory, is refused."""
    if not local(path):
        return
    full = os.path.abspath(path)
    if os.path.exists(full):
        if os.path.isdir(full) != directory:
            raise _refused(caller, key, path, f"{shown(full)} is {_kind(full)}, not "
                                              f"{'a directory' if directory else 'a file'}")
        return
    above = os.path.dirname(full)
    while not os.path.lexists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise _refused(caller, key, path, f"{shown(above)} is {_kind(above)}, so "
                                          f"{shown(full)} cannot be made under it")


def probe_directory(caller, key, given, folder=None, what=None):
    """Makes the directory `folder` (by default `given`, the argument `key`'s value) and
    writes, syncs and removes a file in it; a ConfigError naming it (`what` says whose
    it is), the system's reason and `given` if not."""
    folder = given if folder is None else folder
    if not local(folder):
        return
    with _probing(caller, key, given, f"cannot write in {shown(folder)}", what):
        os.makedirs(folder, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".tfdist-probe-", dir=folder)
        try:
            os.write(handle, b"\0")
            os.fsync(handle)
        finally:
            os.close(handle)
            os.remove(probe)


def probe_file(caller, key, given, path=None, what=None):
    """`probe_directory` of the folder of the file `path` (by default `given`), unless it
    is a device (its own place), then an empty write to it if it exists (a device such as
    /dev/full refuses even that; a FIFO without a reader is refused, not waited for)."""
    full = os.path.abspath(given if path is None else path)
    if not local(full):
        return
    exists = os.path.exists(full)
    if not exists or stat.S_ISREG(os.stat(full).st_mode):
        probe_directory(caller, key, given, os.path.dirname(full), what)
    if exists:
        with _probing(caller, key, given, f"cannot write {shown(full)}", what):
            handle = os.open(full, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            try:
                os.write(handle, b"")
            finally:
                os.close(handle)


@contextlib.contextmanager
def _probing(caller, key, given, doing, what):
    try:
        yield
    except OSError as e:
        raise _refused(caller, key, given, f"{doing}{f' ({what})' if what else ''}: "
                                           f"{e.strerror or e}") from None


@contextlib.contextmanager
def ending_on_error(callback, caller, path):
    """`writing`, for a hook of `callback` during `fit`: as `fit` calls no `on_train_end`
    after a callback raised, the callback then ends its run itself (closes its files,
    removes its scratch). Not for `on_train_end` itself."""
    try:
        with writing(caller, path):
            yield
    except OSError:
        with contextlib.suppress(OSError):  # the same write fails again on closing
            callback.on_train_end()
        raise


def _refused(caller, key, path, reason):
    return Source.of_call(caller).error((key,), f"{reason}. Received: {key}={shown(path)}")


def _kind(path):
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken symbolic link"
    return ("a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file")
