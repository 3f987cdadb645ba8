"""The text the language model reads: Python's own standard library, on every machine
without a download — a fixed list of its source files, read as bytes and hashed.

Training reads `TRAIN_FILES`, validation the held-out `VALIDATION_FILES` (other modules,
so the validation loss measures generalisation, not memorisation). The hashes of
`PINNED` say whether this interpreter's files are the ones the published numbers were
measured on; another Python release reads its own versions of the same files (the run
records the hash it read).
"""

import hashlib
import os
import sys
import sysconfig

TRAIN_FILES = ("argparse.py", "collections/__init__.py", "json/decoder.py", "json/encoder.py",
               "textwrap.py", "string.py", "functools.py", "dataclasses.py", "enum.py",
               "pathlib.py", "shlex.py", "difflib.py", "heapq.py", "bisect.py", "csv.py",
               "calendar.py", "random.py", "inspect.py")
VALIDATION_FILES = ("statistics.py", "fractions.py")
#: (Python release) -> sha256 of the training text, of the validation text.
PINNED = {(3, 11, 7): ("ae53522f3143e098b8313a649923d3777219bac3b7f648c4bf19bead15a01325",
                       "bb7bed54083616ecd6b8eeaab13aff1e95de66fcbf9c50bfd7a67843b4fb5f51")}


def read(split, root=None):
    """(bytes of the split's files, one after another; their sha256).

    Raises:
        FileNotFoundError: a listed file is missing (a stripped-down Python).
    """
    root = root or sysconfig.get_paths()["stdlib"]
    files = TRAIN_FILES if split == "train" else VALIDATION_FILES
    text = b"".join(_read(os.path.join(root, name)) for name in files)
    return text, hashlib.sha256(text).hexdigest()


def pinned(split, digest):
    """Whether `digest` is the pinned text of this Python release (None: none pinned)."""
    hashes = PINNED.get(tuple(sys.version_info[:3]))
    return None if hashes is None else digest == hashes[0 if split == "train" else 1]


def _read(path):
    with open(path, "rb") as f:
        return f.read()
