"""The one error type every config problem raises."""

from tfdist.errors import TfdistError, one_line


class ConfigError(TfdistError, ValueError):
    """A problem with a tfdist config: the message names file, line, key and expectation.

    Formatted like a compiler diagnostic, on one printable line (file name and keys with
    newlines or escape sequences are escaped, see `tfdist.errors.one_line`):
    ``job.yaml:4: cluster.worker[1]: expected "host:port" ... Received: 'localhost'``.

    Attributes:
        file: path of the config file, or None for in-memory configs.
        line: 1-based line number where YAML gives one, else None.
        key: dotted key path such as ``cluster.worker[1]``, or None for the whole file.
        reason: the message without the location prefix.
    """

    def __init__(self, reason, *, file=None, line=None, key=None):
        self.file, self.line, self.key, self.reason = file, line, key, reason
        location = ":".join(str(p) for p in (file and clip(str(file), 4096), line)
                            if p is not None)
        parts = [p for p in (location, clip(key) if key else key, reason) if p]
        super().__init__(one_line(": ".join(parts)))


def clip(text, limit=160):
    """`text`, with its middle left out when longer than `limit` (a key for a message)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}...{text[-half:]}"


def format_path(path):
    """('cluster', 'worker', 1) -> 'cluster.worker[1]'."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or None
