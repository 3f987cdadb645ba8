"""Where a non-chief worker writes files that only the chief should keep."""

import hashlib
import os
import shutil
import tempfile

import tensorflow as tf

from tfdist.strategies.task import is_chief, task_of


class WorkerScratch:
    """A temporary directory for this task's throw-away copies of the chief's files.

    Every worker of a multi-worker job must take part in saving (reading distributed
    variables may need collectives), but only the chief may write the real path; the
    others write here, and `cleanup` removes it. The directory's name depends only on
    the task and the chief's path, so a task that was killed before cleaning up finds
    and empties it when it is relaunched.
    """

    def __init__(self, chief_path):
        self.chief_path = os.path.abspath(chief_path)
        self.path = None

    def create(self, strategy):
        """Returns None on the chief, else an empty temporary directory for this task."""
        if is_chief(strategy):
            return None
        task_type, task_id = task_of(strategy)
        digest = hashlib.sha1(self.chief_path.encode()).hexdigest()[:12]
        self.path = os.path.join(tempfile.gettempdir(), f"tfdist-{task_type}-{task_id}-{digest}")
        shutil.rmtree(self.path, ignore_errors=True)
        os.makedirs(self.path)
        return self.path

    def redirect(self, path):
        """`path` inside the scratch directory (same file name)."""
        return os.path.join(self.path, os.path.basename(os.path.normpath(path)))

    def cleanup(self):
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


def strategy_of(model):
    """The strategy a Keras 3 model was built under."""
    return getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
