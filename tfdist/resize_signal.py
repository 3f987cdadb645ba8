"""The launcher's and the tasks' contract for a resize (`tfdist.launch.elastic`): the
signal that asks a task to stop at an agreed step, named in its environment.

SIGTERM would do for a task that trains, but also stops one that is not (building the
model, or after `fit`, whose backups are gone); the resize signal is only taken note of
there (`tfdist.strategies.sigterm_guard`) and honoured at the next training step, where
tfdist's preemption watch makes every worker save after the same step and exit 143.
"""

import os
import signal

NAME = "SIGUSR1"
ENV = "TFDIST_RESIZE_SIGNAL"


def number():
    return getattr(signal, NAME)


def wanted(environ=None):
    """Whether the launcher named the resize signal in this process's environment."""
    return (os.environ if environ is None else environ).get(ENV) == NAME
