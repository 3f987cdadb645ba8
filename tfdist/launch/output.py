"""Where the tasks' output and the launcher's messages go: a path that never blocks the
supervisor.

Each destination (the launcher's stdout, its stderr) is a `Sink`: a queue bounded in bytes
and one writer thread. Producers only ever hold the queue's lock for an append, never
during a write, so a destination that blocks (a paused pager, a terminal on Ctrl-S)
blocks only its writer thread; the supervisor's messages are dropped rather than wait,
and the tasks' pumps wait (back-pressure, as a pipe gives) without being taken for hung.

Bytes pass through unchanged (no decoding, so no locale can break them) and are written
with `os.write` on the file descriptor, not through `sys.stdout`'s buffered object (whose
lock, held by a blocked write, would also hang interpreter shutdown). When a destination
fails (EPIPE after ``| head -1``, EIO, ENOSPC) the sink says so once through `notice` and
discards from then on, so the tasks' pipes keep being drained. Streams without a file
descriptor (a `StringIO` in a test) are written as text instead.
"""

import collections
import os
import select
import stat
import threading

MAX_QUEUED_BYTES = 4 << 20  # per destination
_POLL_MS = 200
_PIPE_CHUNK = 4096  # after POLLOUT a pipe takes PIPE_BUF bytes without blocking
_FILE_CHUNK = 1 << 20


class Sink:
    """A destination written by its own thread from a bounded queue of bytes.

    Args:
        stream: a file object with a file descriptor, a text stream without one, or None
            (everything is discarded).
        name: what to call the destination in a notice, e.g. ``"stdout"``.
        notice: called once with a message when writing fails and output is discarded.
        max_bytes: how many bytes may wait in the queue.
    """

    def __init__(self, stream, name, *, notice=None, max_bytes=MAX_QUEUED_BYTES):
        self.name, self._stream, self._notice, self._max = name, stream, notice, max_bytes
        self._fd = _fileno(stream)
        self.is_terminal = self._fd is not None and _isatty(self._fd)
        self._chunk = _FILE_CHUNK
        if self._fd is not None:
            try:
                mode = os.fstat(self._fd).st_mode
                if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                    self._chunk = _PIPE_CHUNK
            except OSError:
                pass
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        self._cond = threading.Condition()
        self._items, self._bytes = collections.deque(), 0
        self._closing = False
        self.discarding = stream is None
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name=f"tfdist {name} writer",
                                        daemon=True)
        self._thread.start()

    def put(self, data, block=True):
        """Queues `data` (bytes). While the queue is full, waits (`block`) or drops it.

        Returns:
            True if queued; False if dropped or discarded.
        """
        with self._cond:
            while (not self.discarding and self._bytes
                   and self._bytes + len(data) > self._max):
                if not block:
                    self.dropped += 1
                    return False
                self._cond.wait(0.5)
            if self.discarding:
                return False
            self._items.append(data)
            self._bytes += len(data)
            self._cond.notify_all()
            return True

    def put_text(self, text, block=False):
        """Queues a message of the launcher, encoded for the destination."""
        return self.put(text.encode(self._encoding, "backslashreplace"), block=block)

    @property
    def full(self):
        """True while producers would wait: the destination is not keeping up."""
        with self._cond:
            return not self.discarding and self._bytes >= self._max

    def close(self, timeout):
        """Lets the writer drain for at most `timeout` seconds, then discards the rest."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():  # the destination does not take it: give up on it
            self._discard()

    def _run(self):
        while True:
            with self._cond:
                while not self._items and not self._closing:
                    self._cond.wait()
                if not self._items:
                    return
                data = self._items.popleft()
                self._bytes -= len(data)
                self._cond.notify_all()
            if not self.discarding:
                self._write(data)

    def _write(self, data):
        try:
            if self._fd is None:
                self._stream.write(data.decode(self._encoding, "replace"))
                self._stream.flush()
                return
            view = memoryview(data)
            while view and not self.discarding:
                if not _writable(self._fd):
                    continue  # look at self.discarding again: close() may give up on us
                view = view[os.write(self._fd, view[:self._chunk]):]
        except (OSError, ValueError) as e:  # EPIPE, EIO, ENOSPC, EBADF; a closed stream
            self._discard()
            if self._notice is not None:
                reason = getattr(e, "strerror", None) or e
                self._notice(f"cannot write to {self.name} ({reason}); its output is "
                             "discarded from now on")

    def _discard(self):
        with self._cond:
            self.discarding = True
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()


def _writable(fd):
    """Waits up to _POLL_MS for `fd` to take a write; True if it will (or says it failed,
    which the write then reports)."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return bool(poller.poll(_POLL_MS))
    except (OSError, ValueError, AttributeError):  # no poll(): just write
        return True


def _fileno(stream):
    if stream is None:
        return None
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # StringIO, pytest's capture, closed
        return None
    try:
        stream.flush()  # what was printed before the launch comes first
    except (OSError, ValueError):
        pass
    return fd


def _isatty(fd):
    try:
        return os.isatty(fd)
    except OSError:
        return False
