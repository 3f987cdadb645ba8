"""Where a non-chief worker writes files that only the chief should keep."""

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile

import tensorflow as tf

from tfdist.strategies.task import is_chief, task_of


class WorkerScratch:
    """A private temporary directory for this task's throw-away copies of the chief's files.

    Every worker of a multi-worker job must take part in saving (reading distributed
    variables may need collectives), but only the chief may write the real path; the
    others write here, and `cleanup` removes it. The directory is made by
    `tempfile.mkdtemp`: an unpredictable name, mode 0700, so another local user can
    neither take the name first nor read the weights. Its prefix names the task and
    the chief's path, so a task that was killed before cleaning up removes its own
    leftovers (same prefix, same owner) when it is relaunched.
    """

    def __init__(self, chief_path):
        self.chief_path = os.path.abspath(chief_path)
        self.path = None

    def create(self, strategy):
        """Returns None on the chief, else a new, empty, private temporary directory."""
        if is_chief(strategy):
            return None
        task_type, task_id = task_of(strategy)
        digest = hashlib.sha1(self.chief_path.encode()).hexdigest()[:12]
        prefix = f"tfdist-{task_type}-{task_id}-{digest}-"
        _remove_own_leftovers(tempfile.gettempdir(), prefix)
        self.path = tempfile.mkdtemp(prefix=prefix)
        return self.path

    def redirect(self, path):
        """`path` inside the scratch directory (same file name)."""
        return os.path.join(self.path, os.path.basename(os.path.normpath(path)))

    @contextlib.contextmanager
    def removed_on_error(self):
        """Removes the scratch when the block raises (a failed check before training:
        Keras then calls no `on_train_end`)."""
        try:
            yield
        except BaseException:
            self.cleanup()
            raise

    def cleanup(self):
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


def _remove_own_leftovers(parent, prefix):
    """Removes directories `parent/prefix*` that this user owns (a killed task's scratch)."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)


def strategy_of(model):
    """The strategy a Keras 3 model was built under."""
    return getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
