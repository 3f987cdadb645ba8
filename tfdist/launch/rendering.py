"""A task's raw output as lines a person can read in a log: progress bars that redraw
themselves become periodic lines; terminal controls are dropped or shown as text.

A task under `tfdist launch` writes to a pipe, yet Keras' `Progbar` still redraws (it
treats every POSIX process as a terminal): each update is ``\\b`` * width, ``\\r`` and the
new state, with colour codes, and a newline only when the epoch ends. Passed on as is,
the redraws would overwrite the ``[worker:N]`` prefix in a terminal and pile up, ``\\r``
after ``\\r``, on one line of a log file; other controls a task writes (hostile or not)
could reset, retitle or scramble the terminal, or write to its clipboard.

The output is first parsed into tokens (`tfdist.launch.terminal_tokens`), then each token
is kept, dropped whole or shown as text, so dropping one can never join the bytes around
it into a new sequence. Rules (the same whether the launcher's stdout is a terminal or
not, colours aside):

- Kept (an allow-list): text (UTF-8; invalid bytes pass as they are unless they are C1
  controls), tabs, and for a terminal only colour sequences ``ESC [`` digits and ``;``
  ``m`` of at most 32 bytes; a line holding colours then ends with a reset, so none
  reaches the next line. Keras draws the done and the remaining part of its bar with one
  character, ``━``, in two colours; without colours the remaining part is drawn with ``─``.
- Redraws: a carriage return starts the line's new state: the text after the last ``\\r``
  is what the line shows; ``\\b`` moves the cursor back (never before the line's start)
  and what follows overwrites. An output line holds no ``\\r``, ``\\b`` nor cursor move.
  A redrawn line is shown as its latest state at most every `PROGRESS_SECONDS` (first
  when it has been redrawing that long), and always in its final state, when its newline
  arrives; trailing blanks (a bar's padding) are dropped.
- Dropped silently: any other complete CSI sequence (cursor moves, erases, modes; what
  progress bars write) and OSC 0/1/2 (window titles).
- Shown as text, so nothing printable a task wrote is lost: every other control, as
  ``\\xNN`` (``\\u00NN`` for a C1 control encoded in UTF-8): other OSC strings (e.g. 52,
  the clipboard) and DCS/SOS/PM/APC strings, ESC sequences (``ESC c``, ``ESC ( 0``...),
  C0 controls (BEL, VT, FF, SO, SI, DEL...), C1 controls. An ESC that starts no complete
  sequence (unfinished at the end of the output, cut by a newline, a CSI over 251 bytes,
  a string over 4096) is shown as ``\\x1b`` and what follows it is read as text.
- Memory stays bounded whatever a task writes: a line longer than `max_line` bytes is cut
  into pieces (between characters, never inside a colour sequence), and an unfinished
  sequence is held across chunks only up to its bound.
"""

import re

from tfdist.launch.terminal_tokens import UTF8_CHAR, Tokenizer, escape

PROGRESS_SECONDS = 5.0

_ALLOWED_COLOUR = re.compile(rb"\x1b\[[0-9;]{0,29}m")  # at most 32 bytes
_COLOURS = re.compile(rb"\x1b\[[0-9;]*m")  # in a line: the colours kept
_RESET = b"\x1b[0m"
_TITLE = re.compile(rb"\x1b\][012];")
_KERAS_WHITE = b"\x1b[37m"  # Keras' colour for the remaining part of its bar
_DONE, _REMAINING = "━".encode(), "─".encode()
_BAR_RUN = re.compile(b"(?:" + re.escape(_DONE) + b")*")
_TRAILING = re.compile(rb"(?:[ \t]|m[0-9;]*\[\x1b)*")  # blanks and colours, reversed
_CELL = re.compile(rb"\x1b\[[0-9;]*m|\x08|" + UTF8_CHAR + rb"|.", re.S)


class LineRenderer:
    """Turns one task's output, chunk by chunk, into complete lines (bytes, no newline).

    Args:
        max_line: the longest line in bytes; longer ones are cut into pieces.
        keep_colour: keep colour sequences (the launcher writes to a terminal).
        interval: seconds between two shown states of a redrawn line.
    """

    def __init__(self, max_line, *, keep_colour=False, interval=PROGRESS_SECONDS):
        self.max_line, self.keep_colour, self.interval = max_line, keep_colour, interval
        self._tokens = Tokenizer()
        self._remaining = False  # in the remaining part of a Keras bar (no colours)
        self._new_line()

    def _new_line(self):
        self._line = b""  # the current line since its last \r
        self._last_state = b""  # its last non-blank state before that \r
        self._redrawn = False
        self._due = None  # while it redraws: when its state may be shown next
        self._shown = None  # its state shown last

    def feed(self, data, now):
        """The lines completed (or due to be shown) by `data`, read at time `now`."""
        return self._render(self._tokens.feed(data), now) + self.tick(now)

    def tick(self, now):
        """The latest state of a redrawing line if it is due at `now`, else nothing."""
        if not self._redrawn or now < self._due:
            return []
        self._due = now + self.interval
        state = self._state()
        if not state or state == self._shown:
            return []
        self._shown = state
        return self._pieces(state)

    def flush(self):
        """The rest of the output, when the task's output ends."""
        lines = self._render(self._tokens.finish(), 0.0)
        shows = self._redrawn or _COLOURS.sub(b"", self._line)  # not colours alone
        return lines + self._end_line(b"") if shows else lines

    def _render(self, tokens, now):
        data = b"".join(self._filter(kind, token) for kind, token in tokens)
        *complete, rest = data.split(b"\n")
        lines = []
        for text in complete:
            lines += self._end_line(text)
        self._take(rest, now)
        return lines + self._cut_long_line()

    def _filter(self, kind, token):
        """What is left of a token: bytes whose only controls are \\n, \\r, \\b and kept
        colour sequences."""
        if kind == "text":
            return self._keras_remaining(token)
        self._remaining = not self.keep_colour and token == _KERAS_WHITE
        if kind == "layout":
            return token
        if kind == "csi":
            return token if self.keep_colour and _ALLOWED_COLOUR.fullmatch(token) else b""
        if kind == "string" and _TITLE.match(token):
            return b""
        return escape(kind, token)

    def _keras_remaining(self, text):
        if not self._remaining:
            return text
        end = _BAR_RUN.match(text).end()
        self._remaining = end == len(text)  # the bar may go on in the next token
        return text[:end].replace(_DONE, _REMAINING) + text[end:]

    def _take(self, text, now):
        """Adds `text` (no newline) to the current line."""
        *redrawn, self._line = (self._line + text).split(b"\r")
        if not redrawn:
            return
        if not self._redrawn:
            self._redrawn, self._due = True, now + self.interval
        for state in reversed(redrawn):
            state = _trim(_shown(state))
            if state:
                self._last_state = state
                break

    def _state(self):
        return _trim(_shown(self._line)) or self._last_state

    def _end_line(self, text):
        """The pieces of the current line, ended by a newline or by the end of output."""
        self._take(text, 0.0)
        line = self._state() if self._redrawn else _shown(self._line)
        skip = self._redrawn and line == self._shown
        self._new_line()
        return [] if skip else self._pieces(line)

    def _cut_long_line(self):
        """The leading pieces of a current line longer than `max_line`; the last piece
        stays the current line, the cursor where \\b's put it (not before its start)."""
        if len(self._line) <= self.max_line:
            return []
        line = _overwrite(self._line)
        shown = line.rstrip(b"\b")
        *pieces, rest = self._split(shown)
        self._line = rest + b"\b" * min(len(line) - len(shown), len(rest))
        return [self._end_colour(piece) for piece in pieces]

    def _pieces(self, line):
        return [self._end_colour(piece) for piece in self._split(line)]

    def _split(self, line):
        """`line` (no controls but colours) in pieces of at most `max_line` bytes."""
        pieces, start = [], 0
        while len(line) - start > self.max_line:
            end = _cut(line, start, self.max_line)
            pieces.append(line[start:end])
            start = end
        return pieces + [line[start:]]

    def _end_colour(self, line):
        if self.keep_colour and b"\x1b" in line and not line.endswith(_RESET):
            return line + _RESET
        return line


def _cut(line, start, size):
    """Where to end the piece of `line` from `start` (more than `size` bytes are left):
    at most `size` bytes on, neither inside a UTF-8 character nor a colour sequence (a
    colour sequence at `start` is kept whole). Read: the bytes up to `start + size` and a
    colour sequence across it (whole: tokens are), so the same whatever the chunks."""
    end = start + size
    esc = line.rfind(b"\x1b", max(start, end - 32), end)  # a colour has <= 32 bytes
    if esc >= 0 and line.index(b"m", esc) >= end:
        return esc if esc > start else line.index(b"m", esc) + 1
    lead = end
    while lead > max(start + 1, end - 3) and 0x80 <= line[lead] < 0xc0:
        lead -= 1
    return lead if lead < end and line[lead] >= 0xc2 else end


def _trim(state):
    """`state` without its trailing blanks (colour sequences among them stay), or b""
    when it shows nothing: the same with or without colours."""
    end = len(state) - _TRAILING.match(state[::-1]).end()
    return state[:end] + state[end:].translate(None, b" \t") if end else b""


def _shown(text):
    """What a terminal shows for `text` (no \\n, no \\r)."""
    return _overwrite(text).rstrip(b"\b")


def _overwrite(text):
    """`text` (no \\n, no \\r) where each \\b moved the cursor back (not before the start)
    and what followed overwrote; then a \\b per cell the cursor is left of the end.
    Colour sequences take no cell; bytes pass unchanged when there is no \\b."""
    if b"\b" not in text.rstrip(b"\b"):  # Keras ends each state with \b's
        return text
    cells, cursor, colour = [], 0, b""  # cells: [colours before it, character]
    for item in _CELL.findall(text):
        if item == b"\b":
            cursor = max(0, cursor - 1)
        elif item[:1] == b"\x1b":
            colour += item
        elif cursor < len(cells):
            cells[cursor] = [cells[cursor][0] + colour, item]
            colour, cursor = b"", cursor + 1
        else:
            cells.append([colour, item])
            colour, cursor = b"", cursor + 1
    return b"".join(c + char for c, char in cells) + colour + b"\b" * (len(cells) - cursor)
