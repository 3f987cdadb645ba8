"""A task's raw output as lines a person can read in a log: progress bars that redraw
themselves become periodic lines, terminal control sequences go.

A task under `tfdist launch` writes to a pipe, yet Keras' `Progbar` still redraws (it
treats every POSIX process as a terminal): each update is ``\\b`` * width, ``\\r`` and the
new state, with colour codes, and a newline only when the epoch ends. Passed on as is,
the redraws would overwrite the ``[worker:N]`` prefix in a terminal and pile up, ``\\r``
after ``\\r``, on one line of a log file.

Rules (the same whether the launcher's stdout is a terminal or not):

- A carriage return starts the line's new state: the text after the last ``\\r`` is what
  the line shows; ``\\b`` moves the cursor back, and what follows overwrites.
- A redrawn line is shown as its latest state at most every `PROGRESS_SECONDS` (first
  when it has been redrawing that long), and always in its final state, when its newline
  arrives; trailing blanks (a bar's padding) are dropped.
- Escape sequences that move the cursor or erase (``ESC [ ... K``, ``ESC [ ... A``, OSC
  titles) are removed; colours (``ESC [ ... m``) are kept only for a terminal. Keras
  draws the done and the remaining part of its bar with one character, ``━``, in two
  colours; without colours the remaining part is drawn with ``─``.
- Any other byte passes unchanged (no decoding); a line longer than `max_line` bytes is
  cut into pieces, so memory stays bounded whatever a task writes.
"""

import re

PROGRESS_SECONDS = 5.0

# CSI (ESC [ params intermediates final), OSC (ESC ] ... BEL or ESC \), two-byte ESC x.
_ESCAPE = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_UNFINISHED_ESCAPE = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*)?\Z")
_LONGEST_CARRY = 256  # an unfinished escape sequence longer than this is passed on as text
_KERAS_REMAINING = re.compile(rb"\x1b\[37m((?:\xe2\x94\x81)+)")  # white "━"s


class LineRenderer:
    """Turns one task's output, chunk by chunk, into complete lines (bytes, no newline).

    Args:
        max_line: the longest line in bytes; longer ones are cut into pieces.
        keep_colour: keep colour sequences (the launcher writes to a terminal).
        interval: seconds between two shown states of a redrawn line.
    """

    def __init__(self, max_line, *, keep_colour=False, interval=PROGRESS_SECONDS):
        self.max_line, self.keep_colour, self.interval = max_line, keep_colour, interval
        self._carry = b""  # an escape sequence cut by the end of a chunk
        self._new_line()

    def _new_line(self):
        self._line = b""  # the current line since its last \r
        self._last_state = b""  # its last non-blank state before that \r
        self._redrawn = False
        self._due = None  # while it redraws: when its state may be shown next
        self._shown = None  # its state shown last

    def feed(self, data, now):
        """The lines completed (or due to be shown) by `data`, read at time `now`."""
        data = self._strip_escapes(self._carry + data)
        *complete, rest = data.split(b"\n")
        lines = []
        for text in complete:
            lines += self._end_line(text)
        self._take(rest, now)
        return lines + self._cut_long_line() + self.tick(now)

    def tick(self, now):
        """The latest state of a redrawing line if it is due at `now`, else nothing."""
        if not self._redrawn or now < self._due:
            return []
        self._due = now + self.interval
        state = self._state()
        if not state or state == self._shown:
            return []
        self._shown = state
        return [state]

    def flush(self):
        """The rest of the output, when the task's output ends."""
        text, self._carry = self._carry, b""
        if not (text or self._line or self._redrawn):
            return []
        return self._end_line(text)

    def _strip_escapes(self, data):
        self._carry = b""
        if b"\x1b" not in data:
            return data
        unfinished = _UNFINISHED_ESCAPE.search(data, max(0, len(data) - _LONGEST_CARRY))
        if unfinished:
            data, self._carry = data[:unfinished.start()], data[unfinished.start():]
        if not self.keep_colour:
            data = _KERAS_REMAINING.sub(lambda m: m[1].replace("━".encode(), "─".encode()),
                                        data)
        return _ESCAPE.sub(self._replacement, data)

    def _replacement(self, match):
        sequence = match.group()
        is_colour = sequence[1:2] == b"[" and sequence[-1:] == b"m"
        return sequence if self.keep_colour and is_colour else b""

    def _take(self, text, now):
        """Adds `text` (no newline) to the current line."""
        *redrawn, self._line = (self._line + text).split(b"\r")
        if not redrawn:
            return
        if not self._redrawn:
            self._redrawn, self._due = True, now + self.interval
        for state in reversed(redrawn):
            state = _overwrite(state).rstrip()
            if state:
                self._last_state = state
                break

    def _state(self):
        return _overwrite(self._line).rstrip() or self._last_state

    def _end_line(self, text):
        """The pieces of the current line, ended by a newline or by the end of output."""
        self._take(text, 0.0)
        line = self._state() if self._redrawn else _overwrite(self._line)
        skip = self._redrawn and line == self._shown
        self._new_line()
        return [] if skip else self._pieces(line)

    def _cut_long_line(self):
        """The leading pieces of a current line longer than `max_line`."""
        if len(self._line) <= self.max_line:
            return []
        cut = (len(self._line) - 1) // self.max_line * self.max_line
        head, self._line = self._line[:cut], self._line[cut:]
        return self._pieces(head)

    def _pieces(self, line):
        return [line[i:i + self.max_line] for i in range(0, len(line), self.max_line)] or [b""]


def _overwrite(text):
    """What a terminal shows for `text` (no newline, no \\r) when \\b moves the cursor
    back and what follows overwrites; bytes pass unchanged when there is no \\b."""
    if b"\b" not in text:
        return text
    shown = text.rstrip(b"\b")  # Keras ends each state with \b's: they change nothing
    if b"\b" not in shown:
        return shown
    cells, cursor = [], 0
    for char in text.decode("utf-8", "surrogateescape"):
        if char == "\b":
            cursor = max(0, cursor - 1)
            continue
        if cursor < len(cells):
            cells[cursor] = char
        else:
            cells.append(char)
        cursor += 1
    return "".join(cells).encode("utf-8", "surrogateescape")
