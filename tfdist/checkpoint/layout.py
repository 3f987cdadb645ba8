"""What a store's directory holds, and which of it is the store's own: one sub-directory
per checkpoint (`checkpoint-<serial>`, its `metadata.json` naming the run and serial it was
written for), the pointer file `latest` naming the newest, and `run.json` naming the run.
A name the store did not write for its run is never taken for one of its own."""

import os
import re

from tfdist.checkpoint import files
from tfdist.checkpoint.errors import CheckpointError

LATEST = "latest"
METADATA = "metadata.json"
RUN = "run.json"
#: The store's own part of each checkpoint's metadata.
OWN = "checkpoint"
METADATA_BYTES = 1 << 20
_POINTER_BYTES = 256
_NAME = re.compile(r"^checkpoint-(\d{1,18})$")


def check_directory(directory):
    """Raises CheckpointError if `directory` exists and is not a directory."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise CheckpointError(_not_a_directory(directory))


def make_directory(directory):
    """Creates `directory` if it is missing; CheckpointError if it is not a directory."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError:
        raise CheckpointError(_not_a_directory(directory)) from None
    if not os.path.isdir(directory):
        raise CheckpointError(_not_a_directory(directory))


def path(directory, serial):
    return os.path.join(directory, f"checkpoint-{serial}")


def serials(directory):
    """The serials of the directory's checkpoint names, whoever wrote them."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [int(m.group(1)) for m in map(_NAME.match, names) if m]


def pointed(directory):
    """The name `latest` holds, or None if it cannot be read."""
    try:
        return files.read_text(os.path.join(directory, LATEST), _POINTER_BYTES).strip()
    except OSError:
        return None


def newest_first(found, latest):
    """The checkpoint names of the serials `found`, newest first: the one `latest` names
    first, then the others by serial."""
    names = [f"checkpoint-{s}" for s in sorted(found, reverse=True)]
    if latest in names:
        names.remove(latest)
        names.insert(0, latest)
    return names


def candidates(directory):
    """The paths of the directory's checkpoints, newest first (`newest_first`)."""
    return [os.path.join(directory, n) for n in newest_first(serials(directory),
                                                             pointed(directory))]


def metadata(path, run_id):
    """A checkpoint's metadata; CheckpointError if the store did not write it for the run
    `run_id` (None: any run), another error if it is damaged."""
    if os.path.islink(path) or not os.path.isdir(path):
        raise CheckpointError(f"{path} is not a checkpoint directory the store wrote")
    found = files.read_json(os.path.join(path, METADATA), METADATA_BYTES)
    own = found.get(OWN)
    serial = int(_NAME.match(os.path.basename(path)).group(1))
    if not isinstance(own, dict) or own.get("serial") != serial:
        raise CheckpointError(f"{path} was not written by a checkpoint store")
    if run_id is not None and own.get("run") != run_id:
        raise CheckpointError(f"{path} belongs to another run ({own.get('run')!r})")
    return found


def own(directory, run_id):
    """(serial, name) of the checkpoints the store wrote for the run `run_id`."""
    found = []
    for serial in serials(directory):
        try:
            metadata(path(directory, serial), run_id)
        except Exception:  # noqa: BLE001 (not ours, or damaged: left alone)
            continue
        found.append((serial, f"checkpoint-{serial}"))
    return found


def next_serial(directory, run_id):
    """The serial of the run's next checkpoint: after its newest, past any name taken."""
    serial = max((s for s, _ in own(directory, run_id)), default=0) + 1
    while os.path.lexists(path(directory, serial)):  # a name that is not this store's
        serial += 1
    return serial


def points_to_own(directory, latest, names):
    """Whether `latest` is the store's: a regular file naming one of `names` (its own
    checkpoints) or a checkpoint name now gone."""
    at = os.path.join(directory, LATEST)
    if os.path.islink(at) or not os.path.isfile(at) or not latest:
        return False
    return latest in names or (_NAME.match(latest) is not None and not os.path.lexists(
        os.path.join(directory, latest)))


def _not_a_directory(directory):
    return f"{directory} is not a directory; give a directory for the backups"
