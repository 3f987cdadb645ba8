"""The launcher's and the tasks' contract for a resize (`tfdist.launch.elastic`): the
signal that asks a task to stop at an agreed step, named in its environment, and the
places the tasks of each size hold in the whole cluster (`PLACES_ENV`), by which islands
given for the whole cluster are found in a smaller one (`tfdist.local_sgd.islands`).

SIGTERM would do for a task that trains, but also stops one that is not (building the
model, or after `fit`, whose backups are gone); the resize signal is only taken note of
there (`tfdist.strategies.sigterm_guard`) and honoured at the next training step, where
tfdist's preemption watch makes every worker save after the same step and exit 143.
"""

import os
import signal

from tfdist.limits import MAX_TASKS

NAME = "SIGUSR1"
ENV = "TFDIST_RESIZE_SIGNAL"
#: "P0,P1,.../M": the place in the whole cluster of M chief and worker tasks of each task of
#: this one (chief first, then the workers), e.g. "0,1,3/4" after the loss of place 2.
PLACES_ENV = "TFDIST_ELASTIC_PLACES"
MAX_PLACES_CHARS = 6 * MAX_TASKS + 6


def number():
    return getattr(signal, NAME)


def wanted(environ=None):
    """Whether the launcher named the resize signal in this process's environment."""
    return (os.environ if environ is None else environ).get(ENV) == NAME


def places_text(places, members):
    """`PLACES_ENV`'s value for tasks holding `places` of `members`."""
    return ",".join(map(str, places)) + f"/{members}"


def places(tasks, environ=None):
    """(places, members) of this job's `tasks` chief and worker tasks, as the launcher
    named them (`PLACES_ENV`), or None when it did not (a job of a fixed size).

    Raises:
        ValueError: a value that is not `places_text` of `tasks` distinct places of at most
            `MAX_TASKS` members in increasing order; it names the variable.
    """
    text = (os.environ if environ is None else environ).get(PLACES_ENV)
    if text is None:
        return None
    shown = text[:80] + ("..." if len(text) > 80 else "")
    listed, _, total = text.partition("/")
    numbers = listed.split(",")
    if len(text) > MAX_PLACES_CHARS or not all(
            n.isascii() and n.isdigit() and len(n) <= 5 for n in [*numbers, total]):
        raise ValueError(f"{PLACES_ENV} must be the places of this job's tasks in the whole "
                         f"cluster, then its size, e.g. 0,1,3/4. Received: {shown!r}")
    members, found = int(total), [int(n) for n in numbers]
    if not (len(found) == tasks and found == sorted(set(found)) and found[-1] < members
            <= MAX_TASKS):
        raise ValueError(f"{PLACES_ENV} must list {tasks} distinct places in increasing order, "
                         f"each below the cluster's size (at most {MAX_TASKS:,}): one per chief and "
                         f"worker task of this job. Received: {shown!r}")
    return found, members
