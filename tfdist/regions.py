"""Blocks of code marked for the running thread (`with region():`), nestable: tfdist's
ways of saying "what is traced or created in here is special" (a skipped step under loss
scaling, variables that start alike on every worker)."""

import contextlib
import threading


class ThreadRegion:
    """Whether the running thread is inside a `with region():` block."""

    def __init__(self):
        self._local = threading.local()

    @contextlib.contextmanager
    def __call__(self):
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def active(self):
        return getattr(self._local, "depth", 0) > 0
