"""Checkpoints that a kill at any moment cannot lose, in a directory shared with whatever
else is there: written apart, made durable, then switched to — the previous good one kept
until the new one is complete — and only the store's own files ever removed.

A store is a directory holding one sub-directory per checkpoint (`checkpoint-<serial>`),
each complete before it gets that name, a pointer file `latest` naming the newest, and,
when the store belongs to a run, `run.json` naming it. Saving writes a new checkpoint into
a temporary sub-directory, fsyncs every file and the directory, renames it into place,
then replaces `latest` (a temporary file created exclusively, fsync, `os.replace`, fsync
the directory): a kill before the switch leaves the previous checkpoint as `latest`, a
kill after leaves the new one. Older checkpoints are removed after the switch, keeping
`keep` of them.

One run per directory: every checkpoint's metadata names its run and serial, a store of
another run refuses the directory in one line (`claim`, `check_run`), and one writer at
a time holds the directory's lock (`tfdist.checkpoint.lock`: a killed writer cannot leave
it held). Every file is read as hostile input (`tfdist.checkpoint.files`): regular files
only, sizes bounded, names the store did not write named and left alone. Loading tries
the newest first; one that cannot be read (truncated, corrupt) is reported in one line
naming its file, and the previous is used. Pure Python: the caller supplies what writes
and reads the files.
"""

import functools
import json
import math
import os
import re
import shutil
import tempfile

from tfdist.checkpoint import files, lock
from tfdist.checkpoint.files import STAGING_PREFIX, TEMPORARY_PREFIX, UnsafeFile
from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.errors import TfdistError

#: keep >= 2: the previous good checkpoint is kept until a new one is complete.
ARGUMENTS = {"directory": checks.path, "keep": functools.partial(checks.integer, minimum=2)}

LATEST = "latest"
METADATA = "metadata.json"
RUN = "run.json"
#: The store's own part of each checkpoint's metadata.
OWN = "checkpoint"
METADATA_BYTES = 1 << 20
_POINTER_BYTES = 256
_NAME = re.compile(r"^checkpoint-(\d{1,18})$")


class CheckpointError(TfdistError, ValueError):
    """No usable checkpoint, or one that does not fit; the message says which and why."""


class CheckpointStore:
    """Atomic checkpoints in `directory`, for one run.

    Args:
        directory: where the checkpoints live (created on the first save).
        keep: complete checkpoints kept (≥ 2: the newest and the one before it).
        run: the run the checkpoints belong to: a JSON object with an ``"id"`` (a string)
            and anything that helps a person recognise it (saved as `run.json`); None: a
            store of no particular run (it takes any checkpoint).
    """

    def __init__(self, directory, keep=2, run=None):
        checked = check_arguments("CheckpointStore", ARGUMENTS, directory=directory, keep=keep)
        self.directory, self.keep = checked["directory"], checked["keep"]
        if run is not None and not (isinstance(run, dict) and isinstance(run.get("id"), str)
                                    and run["id"]):
            raise ValueError(f"run must be None or a dict with a string 'id'. Received: "
                             f"run={str(run)[:200]!r}")
        self.run = run
        self._lock = None
        self._named = set()  # entries named once as not this store's

    @property
    def run_id(self):
        return None if self.run is None else self.run["id"]

    # --- one run, one writer ----------------------------------------------------------

    def claim(self):
        """Makes this store the directory's writer: takes its lock (`LockedByAnother`
        if another run holds it) and records the run (`CheckpointError` if the directory
        holds another run's checkpoints). Saving claims first; `release` lets go."""
        if self._lock is not None:
            return self
        self._make_directory()
        try:
            self._lock = lock.acquire(self.directory, self.run_id)
        except UnsafeFile as error:
            raise CheckpointError(str(error)) from None
        try:
            self.check_run()
            if self.run is not None and not os.path.lexists(os.path.join(self.directory, RUN)):
                files.replace_text(os.path.join(self.directory, RUN),
                                   json_text(self.run) + "\n")
        except BaseException:
            self.release()
            raise
        return self

    def release(self, remove_lock=False):
        if self._lock is not None:
            self._lock.release(remove_file=remove_lock)
            self._lock = None

    def check_run(self):
        """Raises CheckpointError if the directory's checkpoints belong to another run (or
        it is not a directory). A reader's check: it takes no lock."""
        if os.path.lexists(self.directory) and not os.path.isdir(self.directory):
            raise CheckpointError(f"{self.directory} is not a directory; give a directory "
                                  "for the backups")
        if self.run is None:
            return
        theirs = self.recorded_run()
        if theirs is not None and theirs.get("id") != self.run_id:
            raise CheckpointError(
                f"{self.directory} holds the backups of another run ({describe(theirs)}); "
                f"this run is {describe(self.run)}. Resume that run with its own command, "
                f"give this run another directory, or remove that run's backups "
                f"({os.path.join(self.directory, 'checkpoint-*')}, {LATEST}, {RUN})")

    def recorded_run(self):
        """The run recorded in the directory (`run.json`), or None."""
        path = os.path.join(self.directory, RUN)
        if not os.path.lexists(path):
            return None
        try:
            return files.read_json(path, METADATA_BYTES)
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{path} cannot be read ({one_line(error)}); it is not a "
                                  "run this store recorded: remove it or give another "
                                  "directory") from None

    # --- save, load, remove ---------------------------------------------------------

    def save(self, write, metadata):
        """Writes a checkpoint: `write(path)` fills the new checkpoint's directory `path`;
        `metadata` (JSON-ready) is stored beside. Returns the new checkpoint's path."""
        self.claim()
        serial = max((s for s, _ in self._own()), default=0) + 1
        while os.path.lexists(self._path(serial)):  # a name that is not this store's
            serial += 1
        text = json_text({**metadata, OWN: {"run": self.run_id, "serial": serial}})
        staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.directory)
        try:
            write(staging)
            with open(os.path.join(staging, METADATA), "x") as f:
                f.write(text)
            files.sync_tree(staging)
            final = self._path(serial)
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        files.sync_dir(self.directory)
        files.replace_text(os.path.join(self.directory, LATEST), os.path.basename(final) + "\n")
        self._prune()
        return final

    def candidates(self):
        """Checkpoint names, newest first: `latest` first, then the others by serial."""
        names = [f"checkpoint-{s}" for s in sorted(self._serials(), reverse=True)]
        pointed = self._pointed()
        if pointed in names:
            names.remove(pointed)
            names.insert(0, pointed)
        return [os.path.join(self.directory, n) for n in names]

    def load(self, read, warn=print):
        """Calls `read(path, metadata)` on the newest checkpoint of this run it can read,
        falling back to older ones (each failure reported by `warn` in one line naming the
        file; a checkpoint of another run or not written by a store is named and left
        alone). Returns (path, metadata, what `read` returned), or None if there is none.

        Raises:
            CheckpointError: checkpoints exist but none can be read; another run's
                directory; or `read` raised a `CheckpointError` (the checkpoint does not
                fit: not retried elsewhere).
        """
        self.check_run()
        failures = []
        for path in self.candidates():
            try:
                metadata = self._metadata(path)
            except CheckpointError as error:
                self._name_once(path, warn, str(error))
                continue
            except Exception as error:  # noqa: BLE001 (a damaged checkpoint: the previous)
                failures.append(path)
                warn(f"tfdist: skipping checkpoint {path}: it cannot be read "
                     f"({one_line(error)}); trying the previous one")
                continue
            try:
                return path, metadata, read(path, metadata)
            except CheckpointError:
                raise
            except Exception as error:  # noqa: BLE001
                failures.append(path)
                warn(f"tfdist: skipping checkpoint {path}: it cannot be read "
                     f"({one_line(error)}); trying the previous one")
        if failures:
            raise CheckpointError(f"no usable checkpoint in {self.directory}: "
                                  f"{len(failures)} found, none can be read (see above)")
        return None

    def remove(self):
        """Removes what this store wrote — its checkpoints, `latest`, `run.json`, its
        temporary files and its lock — and nothing else: not the directory, not another
        file in it."""
        if not os.path.isdir(self.directory):
            return
        self.claim()
        own = {name for _, name in self._own()}
        pointed = self._pointed()
        recorded = self.recorded_run()
        for name in own:
            shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if self._remove_staging(name):
                continue
            if name.startswith(TEMPORARY_PREFIX) \
                    or (name == LATEST and self._points_to_own(pointed, own)) \
                    or (name == RUN and recorded is not None
                        and recorded.get("id") == self.run_id):
                _unlink_quietly(path)
        self.release(remove_lock=True)

    # --- helpers --------------------------------------------------------------------

    def _make_directory(self):
        try:
            os.makedirs(self.directory, exist_ok=True)
        except FileExistsError:
            raise CheckpointError(f"{self.directory} is not a directory; give a directory "
                                  "for the backups") from None
        if not os.path.isdir(self.directory):
            raise CheckpointError(f"{self.directory} is not a directory; give a directory "
                                  "for the backups")

    def _path(self, serial):
        return os.path.join(self.directory, f"checkpoint-{serial}")

    def _serials(self):
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return [int(m.group(1)) for m in map(_NAME.match, names) if m]

    def _metadata(self, path):
        """A checkpoint's metadata; CheckpointError if the store did not write it for this
        run (another error: damaged)."""
        if os.path.islink(path) or not os.path.isdir(path):
            raise CheckpointError(f"{path} is not a checkpoint directory the store wrote")
        metadata = files.read_json(os.path.join(path, METADATA), METADATA_BYTES)
        own = metadata.get(OWN)
        serial = int(_NAME.match(os.path.basename(path)).group(1))
        if not isinstance(own, dict) or own.get("serial") != serial:
            raise CheckpointError(f"{path} was not written by a checkpoint store")
        if self.run is not None and own.get("run") != self.run_id:
            raise CheckpointError(f"{path} belongs to another run ({own.get('run')!r})")
        return metadata

    def _own(self):
        """(serial, name) of the checkpoints this store wrote for its run."""
        own = []
        for serial in self._serials():
            try:
                self._metadata(self._path(serial))
            except Exception:  # noqa: BLE001 (not ours, or damaged: left alone)
                continue
            own.append((serial, f"checkpoint-{serial}"))
        return own

    def _pointed(self):
        try:
            return files.read_text(os.path.join(self.directory, LATEST), _POINTER_BYTES).strip()
        except OSError:
            return None

    def _points_to_own(self, pointed, own):
        """Whether `latest` is the store's: it names one of `own` (or a name now gone)."""
        path = os.path.join(self.directory, LATEST)
        if os.path.islink(path) or not os.path.isfile(path) or not pointed:
            return False
        return pointed in own or (_NAME.match(pointed) is not None and not os.path.lexists(
            os.path.join(self.directory, pointed)))

    def _prune(self):
        """Removes this run's checkpoints beyond `keep` (the newest kept) and the staging
        directories of its killed saves (under the lock: no other writer's)."""
        own = sorted(self._own(), reverse=True)
        pointed = self._pointed()
        kept = {name for _, name in own[:self.keep]} | {pointed}
        for _, name in own:
            if name not in kept:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        for name in os.listdir(self.directory):
            self._remove_staging(name)

    def _remove_staging(self, name):
        """Removes `name` if it is the staging directory of a killed save (under the lock:
        no other writer's); whether it was one."""
        path = os.path.join(self.directory, name)
        if not (name.startswith(STAGING_PREFIX) and os.path.isdir(path)
                and not os.path.islink(path)):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True

    def _name_once(self, path, warn, why):
        if path not in self._named:
            self._named.add(path)
            warn(f"tfdist: leaving {path} alone: {why}")


def describe(run):
    """A run in a few words, for a message: its id and what it recorded of itself."""
    parts = [f"run {run.get('id')!s:.40}"]
    for key in ("command", "model", "started", "host"):
        value = run.get(key)
        if value:
            value = " ".join(map(str, value)) if isinstance(value, list) else str(value)
            # a command differs from another at its end (the flags): keep the end
            parts.append(f"{key} {value if len(value) <= 200 else '...' + value[-200:]}")
    return ", ".join(parts)


def json_text(value):
    """`value` as JSON that reads back as itself (`check_json`), or a CheckpointError
    naming where it is not (the store raises it before anything is written)."""
    try:
        check_json("a backup's metadata", value)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return json.dumps(value, allow_nan=False)


def check_json(what, value, depth=0, at=""):
    """Raises ValueError unless `value` is JSON that reads back as itself: finite numbers,
    strings, booleans, None, lists, and dicts with string keys, at most 64 deep. `at`: where
    in the value it is (said in the error)."""
    where = f" (at {at})" if at else ""
    if depth > 64:
        raise ValueError(f"{what} must be JSON values at most 64 deep")
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be JSON values (finite numbers, strings, lists, "
                             f"dicts): {value!r} is not a JSON number{where}")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json(what, item, depth + 1, f"{at}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{what} must be JSON values (finite numbers, strings, "
                                 f"lists, dicts with string keys): the key {key!r} is a "
                                 f"{type(key).__name__}{where}")
            check_json(what, item, depth + 1, f"{at}[{key!r}]")
        return
    raise ValueError(f"{what} must be JSON values (finite numbers, strings, lists, dicts): "
                     f"{type(value).__name__} is not{where}")


def one_line(error):
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass
