"""The elastic: section: how few workers a job may go on with, and when a lost one returns."""

import functools
import shlex

from tfdist.config import checks
from tfdist.config.schema import ElasticConfig

#: A day: a lost worker is offered back at most this long after its loss (the delay
#: doubles each time the same place is lost again, up to this).
MAX_REJOIN_SECONDS = 24 * 3600.0
MAX_DISCOVER_CHARS = 4096


def discover_command(source, path, value):
    """A command line (split as a shell would, nothing run through one) -> its argv tuple."""
    text = checks.string(source, path, value)
    if len(text) > MAX_DISCOVER_CHARS:
        raise source.error(path, f"expected a command of at most {MAX_DISCOVER_CHARS} "
                                 f"characters. Received: {len(text):,}")
    if "\0" in text:
        raise source.error(path, "expected a command line without NUL characters")
    try:
        argv = tuple(shlex.split(text))
    except ValueError as e:
        raise source.error(path, f"expected a command line ({e}). "
                                 f"Received: {checks.shown(text)}") from None
    if not argv:
        raise source.error(path, "expected a command that prints how many workers can run "
                                 f"now. Received: {checks.shown(text)}")
    return argv


def min_workers_problem(min_workers, members):
    """Why `min_workers` does not fit a cluster of `members` chief and worker tasks (the
    most the job runs with), or None: the config's check and the launcher's (for
    --min-workers) in one place."""
    if min_workers > members:
        return (f"min_workers is more than the cluster has ({members} chief and worker tasks, "
                f"the most the job runs with). Received: min_workers={min_workers}")
    return None


ELASTIC_KEYS = {
    "min_workers": functools.partial(checks.integer, minimum=1),
    "rejoin_seconds": functools.partial(checks.number, minimum=0,
                                        maximum=MAX_REJOIN_SECONDS),
    "discover": discover_command,
}


def elastic(source, path, value):
    """``elastic: {min_workers: K, rejoin_seconds: S, discover: COMMAND}`` (min_workers
    required)."""
    checks.mapping(source, path, value, tuple(ELASTIC_KEYS),
                   "min_workers, rejoin_seconds and discover")
    if "min_workers" not in value:
        raise source.error(path, "missing key 'min_workers': the fewest workers the job may "
                                 "go on with (the cluster's size is the most)")
    options = {key: ELASTIC_KEYS[key](source, path + (key,), v) for key, v in value.items()}
    return ElasticConfig(**options)
