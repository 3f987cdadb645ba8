"""Terminal output as tokens, parsed chunk by chunk (a token may be cut across chunks).

A token is a ``(kind, bytes)`` pair; the kinds (ECMA-48 for the sequences):

- ``text``: printable ASCII, tab, valid UTF-8 characters but U+0080–U+009F, and bytes from
  0xA0 that start no valid character (invalid UTF-8, kept as they are);
- ``layout``: a run of ``\\n``, ``\\r``, ``\\b``;
- ``csi``: ``ESC [``, at most `CSI_PARAMS` parameter bytes (0x30–0x3F), at most
  `CSI_INTERMEDIATES` intermediate bytes (0x20–0x2F), a final byte (0x40–0x7E);
- ``string``: OSC, DCS, SOS, PM or APC (``ESC ]``, ``P``, ``X``, ``^``, ``_``), a body of at
  most `STRING_MAX` bytes that are neither C0 controls nor DEL, then BEL or ``ESC \\``;
- ``esc``: ESC, at most two intermediate bytes, a final byte (0x30–0x7E): ``ESC c``,
  ``ESC ( 0``, ``ESC # 8``, ``ESC 7``...;
- ``c0``: a run of C0 controls or DEL, or an ESC that starts none of the above (stray,
  unfinished, over-long: what follows it is parsed again as usual, so a sequence costs
  at most its bound and a newline always ends it);
- ``c1``: a run of C1 controls: bytes 0x80–0x9F outside a valid character (8-bit C1) or
  U+0080–U+009F encoded in UTF-8.

`escape` writes any token as printable text.
"""

import re

CSI_PARAMS, CSI_INTERMEDIATES = 240, 8  # a CSI sequence has at most 251 bytes
STRING_MAX = 4096

UTF8_CHAR = (rb"\xc2[\xa0-\xbf]|[\xc3-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]"
             rb"|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]"
             rb"|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
             rb"|\xf4[\x80-\x8f][\x80-\xbf]{2}")  # well-formed, no C1 (U+0080-U+009F)
_CSI = rb"\[[\x30-\x3f]{0,%d}[\x20-\x2f]{0,%d}" % (CSI_PARAMS, CSI_INTERMEDIATES)
_STRING = rb"[\]PX^_][^\x00-\x1f\x7f]{0,%d}" % STRING_MAX


def _grammar(final):
    """The token pattern; unless `final`, data may go on: a ``partial`` token at the end
    is whatever could still become a longer token."""
    unfinished = rb"[\xc2-\xf4][\x80-\xbf]{0,2}\Z"  # a character the next chunk may end
    invalid = rb"(?!\xc2[\x80-\x9f]" + (b"" if final else b"|" + unfinished) + rb")[\xa0-\xff]"
    partial = b"" if final else (rb"|(?P<partial>\x1b(?:" + _CSI + b"|" + _STRING +
                                 rb"\x1b?|[\x20-\x2f]{1,2})?\Z|" + unfinished + b")")
    return re.compile(
        rb"(?P<text>(?:[\t\x20-\x7e]+|" + UTF8_CHAR + b"|" + invalid + rb")+)"
        rb"|(?P<layout>[\n\r\x08]+)"
        rb"|(?P<csi>\x1b" + _CSI + rb"[\x40-\x7e])"
        rb"|(?P<string>\x1b" + _STRING + rb"(?:\x07|\x1b\\))"
        rb"|(?P<esc>\x1b(?:[\x20-\x2f]{1,2}[\x30-\x7e]|[\x30-\x4f\x51-\x57\x59\x5a\x5c\x60-\x7e]))"
        + partial +
        rb"|(?P<c0>[\x00-\x07\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]+|\x1b+(?=\x1b)|\x1b)"
        rb"|(?P<c1>[\x80-\x9f]+|(?:\xc2[\x80-\x9f])+)")


_FINAL, _OPEN = _grammar(final=True), _grammar(final=False)
_CODES = [b"\\x%02x" % byte if byte < 0x20 or 0x7f <= byte < 0xa0 else bytes([byte])
          for byte in range(256)]


def tokens(data):
    """The tokens of `data`, a complete output."""
    return [(m.lastgroup, m.group()) for m in _FINAL.finditer(data)]


class Tokenizer:
    """The tokens of an output fed chunk by chunk: the same whatever the chunks are."""

    def __init__(self):
        self._carry = b""  # the start of a token cut by the end of a chunk (bounded)

    def feed(self, data):
        found = [(m.lastgroup, m.group()) for m in _OPEN.finditer(self._carry + data)]
        self._carry = found.pop()[1] if found and found[-1][0] == "partial" else b""
        return found

    def finish(self):
        """The tokens of what is held when the output ends."""
        data, self._carry = self._carry, b""
        return tokens(data)


def escape(kind, token):
    """`token` as printable text: text as it is; each control as ``\\xNN``, a C1 control
    encoded in UTF-8 as ``\\u00NN``; a string's body escaped the same way."""
    if kind == "text":
        return token
    if kind == "string":
        return b"\\x1b" + b"".join(escape(*t) for t in tokens(token[1:]))
    if token[:1] == b"\xc2":  # C1 controls encoded in UTF-8
        return b"".join(b"\\u%04x" % byte for byte in token[1::2])
    return b"".join(map(_CODES.__getitem__, token))
