"""Where a non-chief worker writes files that only the chief should keep."""

import os
import shutil
import tempfile

from tfdist.strategies.task import is_chief, task_of


class WorkerScratch:
    """A temporary directory for this task's throw-away copies of the chief's files.

    Every worker of a multi-worker job must take part in saving (reading distributed
    variables may need collectives), but only the chief may write the real path; the
    others write here, and `cleanup` removes it.
    """

    def __init__(self):
        self.path = None

    def create(self, strategy):
        """Returns None on the chief, else a new temporary directory for this task."""
        if is_chief(strategy):
            return None
        task_type, task_id = task_of(strategy)
        self.path = tempfile.mkdtemp(prefix=f"tfdist-{task_type}-{task_id}-")
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
    import tensorflow as tf

    return getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
