"""The error of the cluster package."""

from tfdist.errors import TfdistError


class ClusterError(TfdistError, ValueError):
    """A cluster that cannot be used or described as asked: a malformed address or
    TF_CONFIG, a port in use, a task the cluster does not have, a count without ports..."""
