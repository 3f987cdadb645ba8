"""What `tfdist launch`'s options resolve to: checked, and filled in from the config
(``elastic:``) and the environment (``TFDIST_PRELOAD``) where not given (`Launcher`)."""

import functools
import os

from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.config.sections.elastic import ELASTIC_KEYS
from tfdist.launch.errors import LaunchError
from tfdist.launch.preload import ENV as PRELOAD_ENV
from tfdist.launch.preload import modules
from tfdist.launch.resizing import elastic_places

MAX_GRACE_SECONDS = 3600.0  # an hour to stop: more would make Ctrl-C look ignored
MAX_HANG_SECONDS = 7 * 24 * 3600.0  # a week; 0 switches hang detection off

#: The launcher's options (``tfdist launch --max-restarts/--grace-seconds/--hang-seconds``),
#: checked by the config loader's checks.
OPTIONS = {
    "max_restarts": functools.partial(checks.integer, minimum=0, maximum=10**10 - 1),
    "grace_seconds": functools.partial(checks.number, minimum=0, maximum=MAX_GRACE_SECONDS),
    "hang_seconds": functools.partial(checks.number, minimum=0, maximum=MAX_HANG_SECONDS),
    **ELASTIC_KEYS,  # --min-workers, --rejoin-seconds: as the config's elastic: section
}


def elastic_options(config, only_task, min_workers, rejoin_seconds, discover):
    """(The places of an elastic job or None, its discovery command or None): the
    arguments, else the config's ``elastic:`` section."""
    given = config.elastic
    if min_workers is None and given is not None:
        min_workers = given.min_workers
    if rejoin_seconds is None:
        rejoin_seconds = given.rejoin_seconds if given is not None else 60.0
    if min_workers is not None:
        check_options(min_workers=min_workers, rejoin_seconds=rejoin_seconds)
    places = elastic_places(config, min_workers, rejoin_seconds, only_task)
    if discover is None and given is not None:
        discover = given.discover
    elif discover is not None:
        discover = check_arguments("launch", ELASTIC_KEYS, discover=discover)["discover"]
    if discover is not None and places is None:
        raise LaunchError("--discover is for an elastic job: give --min-workers K too (or "
                          "an elastic: section in the config)")
    return places, discover


def preload_modules(preload):
    """The module names of the ``preload`` option, else of ``TFDIST_PRELOAD``."""
    if preload is None:
        return modules(os.environ.get(PRELOAD_ENV), PRELOAD_ENV)
    if isinstance(preload, str):
        return modules(preload, "preload")
    if not all(isinstance(name, str) for name in preload):
        raise LaunchError(f"preload: expected module names, got {preload!r}")
    return modules(",".join(preload), "preload") if preload else ()


def check_options(**options):
    check_arguments("launch", OPTIONS, **options)
