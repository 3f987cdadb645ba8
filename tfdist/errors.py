"""The base of every error tfdist raises on purpose (imports nothing heavy)."""


class TfdistError(Exception):
    """Every error tfdist raises on purpose derives from this class.

    Such an error is bad input or a combination tfdist does not allow, never a bug; its
    message says what was expected. The command line reports it in one line with exit
    code 2. Subclasses keep a builtin base too (`ValueError`, `RuntimeError`...), so
    code that caught those still does.
    """


class UnsupportedError(TfdistError, ValueError):
    """This strategy does not allow that combination; the message says what does."""
