"""Checkpoints that a kill at any moment cannot lose, in a directory shared with whatever
else is there: written apart, made durable, then switched to — the previous good one kept
until the new one is complete — and only the store's own files ever removed.

A store is a directory holding one sub-directory per checkpoint (`checkpoint-<serial>`),
each complete before it gets that name, a pointer file `latest` naming the newest, and,
when the store belongs to a run, `run.json` naming it (`tfdist.checkpoint.layout`). Saving
writes a new checkpoint into a temporary sub-directory, fsyncs every file and the
directory, renames it into place, then replaces `latest` (`tfdist.checkpoint.writing`): a
kill before the switch leaves the previous checkpoint as `latest`, a kill after leaves the
new one. Older checkpoints are removed after the switch, keeping `keep` of them
(`tfdist.checkpoint.removal`).

One run per directory: every checkpoint's metadata names its run and serial, a store of
another run refuses the directory in one line (`claim`, `check_run`:
`tfdist.checkpoint.run_record`), and one writer at a time holds the directory's lock
(`tfdist.checkpoint.lock`: a killed writer cannot leave it held). Every file is read as
hostile input (`tfdist.checkpoint.files`): regular files only, sizes bounded, names the
store did not write named and left alone. Loading tries the newest first; one that cannot
be read (truncated, corrupt) is reported in one line naming its file, and the previous is
used (`tfdist.checkpoint.reading`). Pure Python: the caller supplies what writes and reads
the files.
"""

import functools
import os

from tfdist.checkpoint import layout, lock, reading, removal, run_record, writing
from tfdist.checkpoint.errors import CheckpointError
from tfdist.checkpoint.files import UnsafeFile
from tfdist.checkpoint.json_values import json_text
from tfdist.config import checks
from tfdist.config.checks import check_arguments

#: keep >= 2: the previous good checkpoint is kept until a new one is complete.
ARGUMENTS = {"directory": checks.path, "keep": functools.partial(checks.integer, minimum=2)}


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
        run_record.check_argument(run)
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
        layout.make_directory(self.directory)
        try:
            self._lock = lock.acquire(self.directory, self.run_id)
        except UnsafeFile as error:
            raise CheckpointError(str(error)) from None
        try:
            self.check_run()
            run_record.record(self.directory, self.run)
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
        layout.check_directory(self.directory)
        run_record.check(self.directory, self.run)

    def recorded_run(self):
        """The run recorded in the directory (`run.json`), or None."""
        return run_record.recorded(self.directory)

    # --- save, load, remove ---------------------------------------------------------

    def save(self, write, metadata):
        """Writes a checkpoint: `write(path)` fills the new checkpoint's directory `path`;
        `metadata` (JSON-ready) is stored beside. Returns the new checkpoint's path."""
        self.claim()
        serial = layout.next_serial(self.directory, self.run_id)
        text = json_text({**metadata, layout.OWN: {"run": self.run_id, "serial": serial}})
        final = writing.write_checkpoint(self.directory, serial, write, text)
        removal.prune(self.directory, self.run_id, self.keep)
        return final

    def candidates(self):
        """Checkpoint names, newest first: `latest` first, then the others by serial."""
        return layout.candidates(self.directory)

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
        return reading.load(self.directory, self.run_id, read, warn, self._named)

    def remove(self):
        """Removes what this store wrote — its checkpoints, `latest`, `run.json`, its
        temporary files and its lock — and nothing else: not the directory, not another
        file in it."""
        if not os.path.isdir(self.directory):
            return
        self.claim()
        removal.remove_own(self.directory, self.run_id)
        self.release(remove_lock=True)
