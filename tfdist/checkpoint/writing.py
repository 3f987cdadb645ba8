"""How a checkpoint is written so that a kill at any moment cannot lose it: into a
temporary sub-directory, every file and the directory fsynced, renamed into place, then
`latest` replaced (a temporary file created exclusively, fsync, `os.replace`, fsync the
directory). A kill before the switch leaves the previous checkpoint as `latest`, a kill
after leaves the new one."""

import os
import shutil
import tempfile

from tfdist.checkpoint import files, layout
from tfdist.checkpoint.files import STAGING_PREFIX


def write_checkpoint(directory, serial, write, text):
    """Writes checkpoint `serial`: `write(path)` fills its directory, `text` is its
    metadata; then switches `latest` to it. Returns its path."""
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory)
    try:
        write(staging)
        with open(os.path.join(staging, layout.METADATA), "x") as f:
            f.write(text)
        files.sync_tree(staging)
        final = layout.path(directory, serial)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files.sync_dir(directory)
    files.replace_text(os.path.join(directory, layout.LATEST), os.path.basename(final) + "\n")
    return final
