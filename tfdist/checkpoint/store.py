"""Checkpoints that a kill at any moment cannot lose: written apart, made durable, then
switched to — the previous good one kept until the new one is complete.

A store is a directory holding one sub-directory per checkpoint (`checkpoint-<serial>`),
each complete before it gets that name, and a pointer file `latest` naming the newest.
Saving writes a new checkpoint into a temporary sub-directory, fsyncs every file and
the directory, renames it into place, then replaces `latest` (write a temporary file,
fsync, `os.replace`, fsync the directory): a kill before the switch leaves the previous
checkpoint as `latest`, a kill after leaves the new one. Older checkpoints are removed
after the switch, keeping `keep` of them. Loading tries the newest first; one that cannot
be read (truncated, corrupt) is reported in one line naming its file, and the previous is
used. Pure Python: the caller supplies what writes and reads the files.
"""

import functools
import json
import os
import re
import shutil
import tempfile

from tfdist.config import checks
from tfdist.config.load import check_arguments
from tfdist.errors import TfdistError

#: keep >= 2: the previous good checkpoint is kept until a new one is complete.
ARGUMENTS = {"directory": checks.path, "keep": functools.partial(checks.integer, minimum=2)}

LATEST = "latest"
METADATA = "metadata.json"
_NAME = re.compile(r"^checkpoint-(\d{1,18})$")


class CheckpointError(TfdistError, ValueError):
    """No usable checkpoint, or one that does not fit; the message says which and why."""


class CheckpointStore:
    """Atomic checkpoints in `directory`.

    Args:
        directory: where the checkpoints live (created on the first save).
        keep: complete checkpoints kept (≥ 2: the newest and the one before it).
    """

    def __init__(self, directory, keep=2):
        checked = check_arguments("CheckpointStore", ARGUMENTS, directory=directory, keep=keep)
        self.directory, self.keep = checked["directory"], checked["keep"]

    def save(self, write, metadata):
        """Writes a checkpoint: `write(path)` fills the new checkpoint's directory `path`;
        `metadata` (JSON-ready) is stored beside. Returns the new checkpoint's path."""
        os.makedirs(self.directory, exist_ok=True)
        serial = max(self._serials(), default=0) + 1
        staging = tempfile.mkdtemp(prefix=".incomplete-", dir=self.directory)
        try:
            write(staging)
            with open(os.path.join(staging, METADATA), "w") as f:
                json.dump(metadata, f)
            _sync_tree(staging)
            final = os.path.join(self.directory, f"checkpoint-{serial}")
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _sync_dir(self.directory)
        _replace_text(os.path.join(self.directory, LATEST), os.path.basename(final) + "\n")
        self._prune()
        return final

    def candidates(self):
        """Complete checkpoints, newest first: `latest` first, then the others by serial."""
        names = [f"checkpoint-{s}" for s in sorted(self._serials(), reverse=True)]
        pointed = self._pointed()
        if pointed in names:
            names.remove(pointed)
            names.insert(0, pointed)
        return [os.path.join(self.directory, n) for n in names]

    def load(self, read, warn=print):
        """Calls `read(path, metadata)` on the newest checkpoint it can read, falling back
        to older ones (each failure reported by `warn` in one line naming the file).
        Returns (path, metadata, what `read` returned), or None if there is no checkpoint.

        Raises:
            CheckpointError: checkpoints exist but none can be read; or `read` raised a
                `CheckpointError` (the checkpoint does not fit: not retried elsewhere).
        """
        failures = []
        for path in self.candidates():
            try:
                with open(os.path.join(path, METADATA)) as f:
                    metadata = json.load(f)
                return path, metadata, read(path, metadata)
            except CheckpointError:
                raise
            except Exception as error:  # noqa: BLE001 (a damaged checkpoint: try the previous)
                failures.append(path)
                warn(f"tfdist: skipping checkpoint {path}: it cannot be read "
                     f"({_one_line(error)}); trying the previous one")
        if failures:
            raise CheckpointError(f"no usable checkpoint in {self.directory}: "
                                  f"{len(failures)} found, none can be read (see above)")
        return None

    def remove(self):
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- helpers --------------------------------------------------------------------

    def _serials(self):
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return [int(m.group(1)) for m in map(_NAME.match, names) if m]

    def _pointed(self):
        try:
            with open(os.path.join(self.directory, LATEST)) as f:
                return f.read(256).strip()
        except OSError:
            return None

    def _prune(self):
        """Removes checkpoints beyond `keep` and staging directories of killed saves."""
        kept = {os.path.basename(p) for p in self.candidates()[:self.keep]}
        for name in os.listdir(self.directory):
            if (_NAME.match(name) and name not in kept) or name.startswith(".incomplete-"):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)


def _one_line(error):
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


def _replace_text(path, text):
    """Writes `text` to `path` atomically and durably."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    _sync_dir(os.path.dirname(path))


def _sync_tree(path):
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        _sync_dir(root)


def _sync_dir(path):
    descriptor = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
