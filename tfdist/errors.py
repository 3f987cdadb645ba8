"""The base of every error tfdist raises on purpose (imports nothing heavy), and how a
received value reads in a message (`shown`, `one_line`)."""

import math
import reprlib


class TfdistError(Exception):
    """Every error tfdist raises on purpose derives from this class.

    Such an error is bad input or a combination tfdist does not allow, never a bug; its
    message says what was expected. The command line reports it in one line with exit
    code 2. Subclasses keep a builtin base too (`ValueError`, `RuntimeError`...), so
    code that caught those still does.
    """


class UnsupportedError(TfdistError, ValueError):
    """This strategy does not allow that combination; the message says what does."""


class StrategyError(TfdistError, ValueError):
    """A strategy that cannot be built as asked (missing TF_CONFIG, devices too late...)."""


class UnsupportedByKerasError(TfdistError, NotImplementedError):
    """A Keras 3 entry point that cannot work under this strategy; the message says what does."""


def one_line(text):
    """`text` as one printable line: each non-printable character escaped as `repr` would.

    Newlines, tabs, escape sequences (``\\x1b[2J``), bidi and zero-width characters become
    ``\\n``, ``\\t``, ``\\x1b``, ``\\u202e``... so a message can neither split nor drive the
    terminal. Applying it twice gives the same text as once.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _Short(reprlib.Repr):
    """reprlib with room for real values; huge integers by their size (no conversion)."""

    def __init__(self):
        super().__init__()
        self.maxstring = self.maxother = 120
        self.maxlong, self.maxlevel = 60, 3
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = 8

    def repr_int(self, x, level):
        if x.bit_length() > 200:
            return f"<an integer of about {int(x.bit_length() * math.log10(2)):,} digits>"
        return super().repr_int(x, level)


_short = _Short()


def shown(value):
    """`repr(value)`, shortened for a message: at most a line, whatever the value."""
    return _short.repr(value)
