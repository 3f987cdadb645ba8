"""The launcher's error."""

from tfdist.errors import TfdistError


class LaunchError(TfdistError, RuntimeError):
    """A job that cannot start: a command that does not exist, a port in use..."""
