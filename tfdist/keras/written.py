"""A failed write, told in one line: which caller, which file, the system's reason and
what follows from it. Python's OSError and TensorFlow's OpError name no caller (the OpError
over several lines); h5py names its file over two lines; Keras' `.keras` zip names none.
Shared by the log callbacks (`tfdist.keras.callbacks.log_paths`), `ModelCheckpoint` and the
backups."""

import contextlib
import errno
import os

import tensorflow as tf

_REASONS = {os.strerror(n): n for n in errno.errorcode}
LOG_ENDS = "the log ends before this write"


@contextlib.contextmanager
def writing(caller, path, ends=LOG_ENDS):
    """Turns a failed write (Python's OSError, TensorFlow's OpError, both naming no caller
    and the OpError several lines; h5py's names its file over two lines, Keras' `.keras`
    zip none) into one OSError line naming `caller`, the path, the system's reason and
    what follows from it (`ends`)."""
    try:
        yield
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else (e.strerror or str(e))
        raise written_error(caller, path, e.errno, reason.splitlines()[0], ends) from e
    except tf.errors.OpError as e:  # "{{function_node ...}} <file>; No space left on device"
        head, _, reason = e.message.splitlines()[0].rpartition("; ")
        file = head.rpartition("}} ")[2].strip() or path
        raise written_error(caller, file, _REASONS.get(reason.strip()), reason.strip(),
                            ends) from e


def written_error(caller, path, number, reason, ends=LOG_ENDS):
    message = f"{caller}() could not write {path}: {reason}; {ends}"
    return OSError(message) if number is None else OSError(number, message)
