"""What tfdist tells the user while training: the `tfdist` logger.

Decisions a run takes by itself (`compression: auto`'s choice, `warmup_steps: auto`'s
judgement, the islands' measured pace) are logged at INFO to the logger ``tfdist``, whose
own handler writes each as one line on the standard output of the time (the chief's
only, where the caller says so). Silence them with
``logging.getLogger("tfdist").setLevel(logging.WARNING)``, or send them elsewhere by
replacing its handlers; it does not propagate to the root logger (absl's), so a line is
not printed twice.
"""

import logging
import sys


class _CurrentStdout(logging.StreamHandler):
    """Writes to whatever `sys.stdout` is at the moment (a test's capture, a redirect)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):  # StreamHandler sets it once; the current one is used
        pass


logger = logging.getLogger("tfdist")
if not logger.handlers:
    logger.addHandler(_CurrentStdout())
    logger.setLevel(logging.INFO)
    logger.propagate = False


def say(message):
    """Logs one line at INFO to ``tfdist`` (the standard output by default)."""
    logger.info(message)
