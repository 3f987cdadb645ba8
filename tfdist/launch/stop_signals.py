"""SIGINT, SIGTERM and SIGHUP while a launch runs: each stops every task (exit 130, 143,
129), also while the launch is still being set up."""

import signal
import threading

_STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


class Stopped(BaseException):
    """A stop signal arrived while the launch was being set up."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


class StopSignals:
    """The stop signals' handlers for the length of a launch: the first signal is kept
    (`signum`); one that arrives while `setting_up` abandons the set-up at once (raises
    `Stopped` where the launch is). Handlers are only installed from the main thread
    (Python's rule); elsewhere a launch is stopped by its host."""

    def __init__(self):
        self.signum, self.setting_up, self._previous = None, False, {}

    def install(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for name in _STOP_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self):
        """The handlers from before `install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def check(self):
        """Raises `Stopped` if a stop signal has arrived."""
        if self.signum is not None:
            raise Stopped(self.signum)

    def _on_signal(self, signum, frame):
        if self.signum is None:
            self.signum = signum
        if self.setting_up:  # nothing runs yet: abandon the setup at once
            self.setting_up = False
            raise Stopped(signum)
