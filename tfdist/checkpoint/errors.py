"""The error of the checkpoint package, and an error said in one short line."""

from tfdist.errors import TfdistError


class CheckpointError(TfdistError, ValueError):
    """No usable checkpoint, or one that does not fit; the message says which and why."""


def one_line(error):
    """`error`'s message on one line of at most 300 characters (its type's name if it has
    none), for a line naming a file that cannot be read."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]
