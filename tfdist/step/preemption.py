"""Preemption as part of the step: a SIGTERM to any one task becomes one agreed step.

Kubernetes evicts a pod, a spot VM is reclaimed, SLURM preempts a job: one task gets
SIGTERM and a grace period, and only it knows. Its peers are in the same synchronous
steps, so the news rides the collective every step already runs: the signal sets a flag
(`Preemption.requested`), the loop copies it into a variable before each step, and the
step's first all-reduce — the one that carries the finiteness verdict
(`tfdist.step.transaction`) — carries it too. After that step every replica on every
worker holds the same count of preempted tasks (`agreed()`), with no extra collective and
no clock: the loop saves a checkpoint at that step, on every worker, and exits with
`EXIT_CODE` (`Preempted`), which the launcher, Kubernetes and SLURM settings tfdist writes
treat as "preempted: restart me". (TensorFlow's `PreemptionCheckpointHandler` agrees
through the coordination service instead; Keras 3 has nothing for several workers.)

A step that does not run tfdist's transaction (a plain Keras optimizer) cannot carry the
flag; the loop then agrees after each step with one scalar all-reduce of its own
(`agree_now`). While no loop watches for preemption, nothing is added to any step.
"""

import signal
import threading
import time

import tensorflow as tf

from tfdist import resize_signal
from tfdist.errors import TfdistError
from tfdist.strategies import sigterm_guard
from tfdist.strategies.shuffles import unseeded_shuffles  # noqa: F401 (its home before)

#: The exit code of a task that saved at an agreed step after a preemption signal (128 +
#: SIGTERM, what Kubernetes reports for a terminated container).
EXIT_CODE = 143
SIGNALS = ("SIGTERM",)


class Preempted(SystemExit, TfdistError):
    """Raised by the loop after the checkpoint of a preempted step is written (and its
    message printed): the process ends with `EXIT_CODE`, no traceback; `except Exception`
    still catches it."""

    def __init__(self, message):
        super().__init__(EXIT_CODE)
        self.message = message

    def __str__(self):
        return self.message


class Preemption:
    """The preemption watch of this process (`watch()` makes the one instance)."""

    def __init__(self):
        self.requested = False    # a preemption signal arrived (set by the handler)
        self.received_at = None   # when (time.monotonic())
        self.signal_name = None
        self._variables = {}      # id(strategy) -> (strategy, local flag, agreed count)
        self._active = None
        self._installed = {}
        self._agree = {}          # id(strategy) -> the compiled scalar all-reduce

    # --- signals --------------------------------------------------------------------

    def install(self, signals=SIGNALS):
        """Catches `signals` (main thread only), and the resize signal in a task of an
        elastic launch (`tfdist.resize_signal`): the first sets `requested`; a second of
        the same signal ends the process as the signal would have."""
        if threading.current_thread() is not threading.main_thread():
            return
        if resize_signal.wanted():
            signals = (*signals, resize_signal.NAME)
        for name in signals:
            number = getattr(signal, name)
            if number not in self._installed:
                self._installed[number] = signal.signal(number, self._on_signal)
        asked = sigterm_guard.take_resize_request()  # before training: the next step says it
        if asked is not None and not self.requested:
            self.request(asked)

    def uninstall(self):
        """Gives each signal back its handler from before (the strategy's guard, if any:
        `tfdist.strategies.sigterm_guard`)."""
        for number, previous in self._installed.items():
            signal.signal(number, signal.SIG_DFL if previous is None else previous)
        self._installed = {}

    def reset(self):
        """After the preempted step's backup: signals back to what they were, no watch, no
        request (a process that goes on, such as a test, starts afresh)."""
        self.uninstall()
        self.unwatch()
        for _, _, agreed in self._variables.values():  # no count left for a later watch
            agreed.assign(0.0)
        self.requested, self.received_at, self.signal_name = False, None, None

    def _on_signal(self, number, frame):
        if self.requested:  # asked twice: stop waiting for a step
            signal.signal(number, signal.SIG_DFL)
            signal.raise_signal(number)
            return
        self.request(number)

    def request(self, number):
        """Takes note of a stop asked by signal `number`: the next step carries it."""
        self.requested, self.received_at = True, time.monotonic()
        self.signal_name = signal.Signals(number).name


    # --- the step -------------------------------------------------------------------

    def watch(self, strategy):
        """Makes the steps traced from now on under `strategy` carry this process's flag."""
        key = id(strategy)
        if key not in self._variables:
            with strategy.scope():
                local = dict(trainable=False, aggregation=tf.VariableAggregation.NONE)
                self._variables[key] = (strategy,
                                        tf.Variable(0.0, name="tfdist_preempt_local", **local),
                                        tf.Variable(0.0, name="tfdist_preempt_agreed", **local))
        self._active = self._variables[key]
        self.before_step()

    def unwatch(self):
        self._active = None

    def before_step(self):
        """Copies the signal flag where the next step reads it (eagerly, this worker)."""
        if self._active is not None:
            self._active[1].assign(1.0 if self.requested else 0.0)

    def agree_now(self):
        """One scalar all-reduce of the flag, outside any step (call it on every worker at
        the same point); then `agreed()` holds its sum."""
        if self._active is None:
            return
        strategy, flag, agreed = self._active
        if id(strategy) not in self._agree:
            def replica_fn():
                context = tf.distribute.get_replica_context()
                return context.all_reduce(tf.distribute.ReduceOp.SUM, flag.read_value())

            @tf.function
            def agree():
                total = strategy.run(replica_fn)
                agreed.assign(strategy.experimental_local_results(total)[0])

            self._agree[id(strategy)] = agree
        self._agree[id(strategy)]()

    def agreed(self):
        """How many replicas' tasks were preempted, as the last step's all-reduce summed it
        (the same on every worker); 0 without a watch."""
        if self._active is None:
            return 0
        return int(self._active[2].numpy())

    # --- for the transaction (traced code) ------------------------------------------

    def rider(self):
        """The flag a step being traced adds to its verdict's all-reduce, or None."""
        return None if self._active is None else self._active[1].read_value()

    def record(self, distribution, total):
        """(cross-replica, in the step) Keeps the all-reduced count for `agreed()`."""
        if self._active is not None and total is not None:
            value = distribution.experimental_local_results(total)[0]
            self._active[2].assign(tf.cast(value, tf.float32))


_PREEMPTION = Preemption()


def preemption():
    """This process's `Preemption`."""
    return _PREEMPTION


def seconds_since_signal():
    """Seconds since the preemption signal arrived, or None."""
    if _PREEMPTION.received_at is None:
        return None
    return time.monotonic() - _PREEMPTION.received_at


def resume_at(model, epoch, batch, reads=None):
    """Marks that `model`'s training resumes inside `epoch`, after `batch` steps of it
    already trained before a preemption: the loops skip those steps' data (`skipping`).
    `reads`: the batches the interrupted run's input iterator had yielded by then
    (`input_position`; more than `batch` where one iterator reads on across epochs): the
    loop reads the difference first (`take_advance`), so the resumed run trains the
    batches the uninterrupted one would have."""
    model._tfdist_resume = (epoch, batch) if batch else None
    model._tfdist_advance = max(0, (reads or 0) - batch)


def skipping(model, epoch, batch):
    """Whether step `batch` of `epoch` trained before the preemption the run resumes from:
    its data is read again and dropped, so every step trains exactly once."""
    resume = getattr(model, "_tfdist_resume", None)
    return resume is not None and epoch == resume[0] and batch < resume[1]


def take_advance(model):
    """The batches to read and drop before the resumed run's first step (once; then 0)."""
    count = getattr(model, "_tfdist_advance", 0)
    model._tfdist_advance = 0
    return count


def watch_input(model, position):
    """Lets the loop training `model` say where its input stands: `position()` returns
    (the batches its current input iterator has yielded, whether the next epoch reads on
    through that iterator)."""
    model._tfdist_input = position


def input_position(model, at_epoch_end=False):
    """The batches a resumed run must read before it trains on (`resume_at`'s `reads`):
    the current iterator's reads mid-epoch; at an epoch's end, those reads if the next
    epoch reads on through it, else 0 (a new iterator starts at the data's beginning).
    None where the loop does not say (`watch_input`)."""
    position = getattr(model, "_tfdist_input", None)
    if position is None:
        return None
    reads, continues = position()
    return reads if continues or not at_epoch_end else 0


UNSEEDED_SHUFFLE = (
    "tfdist: the input shuffles without a seed (shuffle() given no seed, and no "
    "keras.utils.set_random_seed or tf.random.set_seed before the dataset was made): a run "
    "resumed from a backup reads as many batches as the interrupted one had, but not the "
    "same ones. Give shuffle a seed, or set one with keras.utils.set_random_seed first.")


def warn_if_unrestorable(dataset):
    """Warns (once per call, one line) where `dataset` cannot be positioned after a resume
    (`unseeded_shuffles`); anything but a `tf.data.Dataset` is not judged."""
    import warnings

    if isinstance(dataset, tf.data.Dataset) and unseeded_shuffles(dataset):
        warnings.warn(UNSEEDED_SHUFFLE, stacklevel=3)
