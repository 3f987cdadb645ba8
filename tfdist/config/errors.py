"""The one error type every config problem raises."""

from tfdist.errors import TfdistError


class ConfigError(TfdistError, ValueError):
    """A problem with a tfdist config: the message names file, line, key and expectation.

    Formatted like a compiler diagnostic, on one line:
    ``job.yaml:4: cluster.worker[1]: expected "host:port" ... Received: 'localhost'``.

    Attributes:
        file: path of the config file, or None for in-memory configs.
        line: 1-based line number where YAML gives one, else None.
        key: dotted key path such as ``cluster.worker[1]``, or None for the whole file.
        reason: the message without the location prefix.
    """

    def __init__(self, reason, *, file=None, line=None, key=None):
        self.file, self.line, self.key, self.reason = file, line, key, reason
        location = ":".join(str(p) for p in (file, line) if p is not None)
        parts = [p for p in (location, key, reason) if p]
        super().__init__(": ".join(parts))
