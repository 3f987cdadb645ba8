"""Which files a store removes: only its own — its run's checkpoints beyond those kept,
the staging directories of its killed saves, and, when the run's backups are removed,
`latest` (if it names one of them), `run.json` (if it records this run) and its temporary
files. Never the directory, never a name it did not write. Called under the lock: no
other writer's files are in the middle of being written."""

import os
import shutil

from tfdist.checkpoint import layout, run_record
from tfdist.checkpoint.files import STAGING_PREFIX, TEMPORARY_PREFIX


def beyond_keep(own, latest, keep):
    """The names of `own` ((serial, name) pairs) to remove: all but the `keep` newest and
    the one `latest` names."""
    own = sorted(own, reverse=True)
    kept = {name for _, name in own[:keep]} | {latest}
    return [name for _, name in own if name not in kept]


def prune(directory, run_id, keep):
    """Removes the run's checkpoints beyond `keep` (the newest kept) and the staging
    directories of its killed saves."""
    own = layout.own(directory, run_id)
    for name in beyond_keep(own, layout.pointed(directory), keep):
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    for name in os.listdir(directory):
        remove_staging(directory, name)


def remove_own(directory, run_id):
    """Removes what the store wrote for the run `run_id`: its checkpoints, `latest`,
    `run.json` and its temporary files (the lock is its holder's to remove)."""
    own = {name for _, name in layout.own(directory, run_id)}
    latest = layout.pointed(directory)
    recorded = run_record.recorded(directory)
    for name in own:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    for name in os.listdir(directory):
        if remove_staging(directory, name):
            continue
        if name.startswith(TEMPORARY_PREFIX) \
                or (name == layout.LATEST and layout.points_to_own(directory, latest, own)) \
                or (name == layout.RUN and recorded is not None
                    and recorded.get("id") == run_id):
            _unlink_quietly(os.path.join(directory, name))


def remove_staging(directory, name):
    """Removes `name` if it is the staging directory of a killed save; whether it was
    one."""
    path = os.path.join(directory, name)
    if not (name.startswith(STAGING_PREFIX) and os.path.isdir(path)
            and not os.path.islink(path)):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass
