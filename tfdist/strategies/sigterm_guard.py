"""A SIGTERM honoured from the moment a multi-worker strategy is built to the process's
exit: TensorFlow's own handler (its coordination service's preemption notifier) would take
it and let the task run on and end "succeeded". While no training loop watches for
preemption (building the model, restoring a backup, after `fit`) there is nothing trained
to save: the task ends at once with 143 ("preempted: restart me"). A loop that watches
(`tfdist.step.preemption`) installs its own handler over this one and gives it back after.

In a task of an elastic launch, the resize signal (`tfdist.resize_signal`) is only taken
note of here: the next training step, if one comes, carries it (every worker saves after
that step and exits 143, and the job restarts at its new size); without one the task ends
as it would have.
"""

import signal
import sys
import threading

from tfdist import resize_signal

EXIT_CODE = 143


def guard():
    """Installs the guard's SIGTERM handler (main thread only; once)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        signal.signal(signal.SIGTERM, _on_sigterm)
    if resize_signal.wanted() and signal.getsignal(resize_signal.number()) is not _on_resize:
        signal.signal(resize_signal.number(), _on_resize)


_RESIZE_ASKED = []  # the resize signal's number, when it came while no loop watched


def _on_resize(number, frame):
    _RESIZE_ASKED[:] = [number]


def take_resize_request():
    """The resize signal's number if it arrived while no loop watched (then forgotten),
    else None: `tfdist.step.preemption` carries it in the next step."""
    return _RESIZE_ASKED.pop() if _RESIZE_ASKED else None


def _on_sigterm(number, frame):
    message = (f"{signal.Signals(number).name} while no training step could carry it "
               "(before training, restoring a backup, or after it): nothing to save; exiting "
               f"with code {EXIT_CODE} to be restarted")
    print(f"tfdist: {message}", flush=True)
    sys.exit(EXIT_CODE)
