"""The elastic: section: how few workers a job may go on with, and when a lost one returns."""

import functools

from tfdist.config import checks
from tfdist.config.schema import ElasticConfig

#: A day: a lost worker is offered back at most this long after its loss (the delay
#: doubles each time the same place is lost again, up to this).
MAX_REJOIN_SECONDS = 24 * 3600.0
ELASTIC_KEYS = {
    "min_workers": functools.partial(checks.integer, minimum=1),
    "rejoin_seconds": functools.partial(checks.number, minimum=0,
                                        maximum=MAX_REJOIN_SECONDS),
}


def elastic(source, path, value):
    """``elastic: {min_workers: K, rejoin_seconds: S}`` (min_workers required)."""
    checks.mapping(source, path, value, tuple(ELASTIC_KEYS), "min_workers and rejoin_seconds")
    if "min_workers" not in value:
        raise source.error(path, "missing key 'min_workers': the fewest workers the job may "
                                 "go on with (the cluster's size is the most)")
    options = {key: ELASTIC_KEYS[key](source, path + (key,), v) for key, v in value.items()}
    return ElasticConfig(**options)
