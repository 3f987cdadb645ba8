"""Which run a store's directory belongs to: the run recorded in its `run.json` (a JSON
object with an ``"id"`` and what helps a person recognise it), checked against the store's
before anything is read or written, and said in a few words when they differ."""

import os

from tfdist.checkpoint import files
from tfdist.checkpoint.errors import CheckpointError, one_line
from tfdist.checkpoint.json_values import json_text
from tfdist.checkpoint.layout import LATEST, METADATA_BYTES, RUN


def check_argument(run):
    """Raises ValueError unless `run` is None or a dict with a non-empty string ``"id"``."""
    if run is not None and not (isinstance(run, dict) and isinstance(run.get("id"), str)
                                and run["id"]):
        raise ValueError(f"run must be None or a dict with a string 'id'. Received: "
                         f"run={str(run)[:200]!r}")


def recorded(directory):
    """The run recorded in `directory` (`run.json`), or None."""
    path = os.path.join(directory, RUN)
    if not os.path.lexists(path):
        return None
    try:
        return files.read_json(path, METADATA_BYTES)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} cannot be read ({one_line(error)}); it is not a "
                              "run this store recorded: remove it or give another "
                              "directory") from None


def check(directory, run):
    """Raises CheckpointError if `directory` records a run other than `run` (None: any)."""
    if run is None:
        return
    theirs = recorded(directory)
    if theirs is not None and theirs.get("id") != run["id"]:
        raise CheckpointError(
            f"{directory} holds the backups of another run ({describe(theirs)}); "
            f"this run is {describe(run)}. Resume that run with its own command, "
            f"give this run another directory, or remove that run's backups "
            f"({os.path.join(directory, 'checkpoint-*')}, {LATEST}, {RUN})")


def record(directory, run):
    """Records `run` in `directory` (`run.json`) unless it is None or one is recorded."""
    path = os.path.join(directory, RUN)
    if run is not None and not os.path.lexists(path):
        files.replace_text(path, json_text(run) + "\n")


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
