"""Which checkpoint a store loads: the newest of its run that can be read, falling back to
older ones. One that cannot be read (truncated, corrupt) is reported in one line naming
it, and the previous is tried; one the store did not write for its run is named once and
left alone; one that does not fit (`read` raises CheckpointError) ends the search."""

from tfdist.checkpoint import layout
from tfdist.checkpoint.errors import CheckpointError, one_line


def load(directory, run_id, read, warn, named):
    """`(path, metadata, read(path, metadata))` of the newest readable checkpoint of the
    run `run_id` (None: any), or None if there is none. `named`: the paths already named
    as not the store's (each is named by `warn` once, then added).

    Raises:
        CheckpointError: checkpoints exist but none can be read, or `read` raised one.
    """
    failures = []
    for path in layout.candidates(directory):
        try:
            metadata = layout.metadata(path, run_id)
        except CheckpointError as error:
            _name_once(path, warn, str(error), named)
            continue
        except Exception as error:  # noqa: BLE001 (a damaged checkpoint: the previous)
            failures.append(path)
            warn(_skipping(path, error))
            continue
        try:
            return path, metadata, read(path, metadata)
        except CheckpointError:
            raise
        except Exception as error:  # noqa: BLE001
            failures.append(path)
            warn(_skipping(path, error))
    if failures:
        raise CheckpointError(f"no usable checkpoint in {directory}: "
                              f"{len(failures)} found, none can be read (see above)")
    return None


def _skipping(path, error):
    return (f"tfdist: skipping checkpoint {path}: it cannot be read ({one_line(error)}); "
            "trying the previous one")


def _name_once(path, warn, why, named):
    if path not in named:
        named.add(path)
        warn(f"tfdist: leaving {path} alone: {why}")
