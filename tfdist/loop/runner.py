"""The per-step rules of every training loop, written once: `model.fit`'s callback
(`tfdist.callbacks.TrainingHooks`), `tfdist.Trainer` and `tfdist.function` each call one
`StepRunner` around each step call, as Keras' `CallbackList` is called around fit's.

    plan(calls)              the step the loop plans to end at (the hooks' `plan`)
    trained_before(epoch, batch)  the call trained before the preemption this run resumes
                             from: its batch is read and dropped, and nothing else runs
    begin(make)              before a step call (its batch read: a loop that reads until
                             the data ends begins no call past it), what it does:
        NOTHING                a slower island trains nothing on it (its batch waits for
                               the next call)
        a compiled step        the step traced for the hooks' phase (`HookDriver`): run it
    check_input(iterator)    islands between synchronisations: an input that couples
                             every worker at each step is named (refused when paced)
    end(call)                after the call: the hooks' `after_step`
    before_read()            before validation, a checkpoint, an epoch's or the run's end
"""

import warnings

from tfdist.errors import UnsupportedError
from tfdist.loop.driver import HookDriver
from tfdist.step.preemption import skipping
from tfdist.strategies.input_pipelines import checks_partial_batches

#: `StepRunner.begin`'s answer for a call that runs no step.
NOTHING = "a slower island trains nothing on this call"

#: Why islands wait for each other at every step, reading a finite dataset.
COUPLED_INPUT = ("tfdist: islands between synchronisations read a finite dataset, so "
                 "TensorFlow checks every batch for a partial last one with a collective over "
                 "every worker: the islands wait for each other at each step. Give them an "
                 "infinite one (dataset.repeat()) and steps_per_epoch.")

#: Why heterogeneous islands cannot read a finite dataset at all.
PACED_COUPLED_INPUT = (
    "island_steps: a slower island skips step calls that the others train, but a finite "
    "dataset checks every batch for a partial last one with a collective over every "
    "worker, which the islands would then run out of step (TensorFlow fails with "
    "'Collective instance ... expected type'). Give the islands an infinite dataset "
    "(dataset.repeat()) and steps_per_epoch")


class RunsHooks:
    """A callback that runs tfdist's hooks for `model.fit`: a loop that runs them itself
    (`tfdist.Trainer`) leaves it out of its callbacks."""


class StepRunner:
    """The rules around each step call of a loop training `model` (see the module).

    Args:
        model: the Keras model being trained.
        optimizer: its tfdist optimizer(s) (`HookDriver`); by default every one it has.
    """

    def __init__(self, model, optimizer=None):
        self.model = model
        self.driver = HookDriver(model, optimizer)

    def plan(self, calls):
        """The loop plans `calls` more step calls (None: not known)."""
        self.driver.plan(calls)

    def trained_before(self, epoch, batch):
        """Whether step call `batch` of `epoch` trained before the preemption this run
        resumes from (`tfdist.step.preemption.skipping`): read its batch, drop it, and
        neither `begin` nor `end` it."""
        return skipping(self.model, epoch, batch)

    def begin(self, make):
        """Before a step call: NOTHING, or the compiled step to call (`make()` traced
        once per phase)."""
        step = self.driver.function(make)
        if self.driver.skips_next():
            self.driver.skip()
            return NOTHING
        return step

    @property
    def apart(self):
        """(after `begin`) Whether the step called runs no collective across every worker
        (islands between synchronisations): its logs are read on this worker alone."""
        return not self.driver.couples_workers()

    @property
    def paced(self):
        """Whether a hook skips some step calls on this worker (`island_steps`)."""
        return self.driver.paced()

    def check_input(self, iterator):
        """(islands apart) Warns once per place if the distributed `iterator` runs a
        collective over every worker at each step; refuses it where islands are paced."""
        check_input(iterator, self.paced)

    def end(self, call):
        """After step call `call` (what `begin` returned)."""
        self.driver.end_step()

    def before_read(self):
        self.driver.before_read()


def check_input(iterator, paced=False):
    """Warns (once per place) if the distributed `iterator` runs a collective over every
    worker at each step (`checks_partial_batches`), which islands cannot step apart with.

    Raises:
        UnsupportedError: such an iterator with heterogeneous islands (`paced`), which
            would run that collective out of step.
    """
    if checks_partial_batches(iterator):
        if paced:
            raise UnsupportedError(PACED_COUPLED_INPUT)
        warnings.warn(COUPLED_INPUT, stacklevel=3)
