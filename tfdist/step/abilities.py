"""Optional abilities of a training hook, beyond the lifecycle events of `TrainingHook`.

Keras' `Callback` is a set of no-op lifecycle events; what only some hooks can do is not
in the base. Each ability here is a small protocol: the pipeline and the driver look it up
on each hook and on the objects a hook lists in its `abilities` attribute (the parts it is
composed of), and call it where they find it.

    ability                  protocol           who has it
    couples_workers()        CouplesWorkers     islands of workers (`local_sgd`)
    trains_next(), skipped() SkipsCalls         heterogeneous islands (`local_sgd`)
    before_backup(model, n)  PreparesBackups    local SGD (its replicas stay apart in a
                                                backup); others: `before_read`
    updater(inner)           Updates            `GradientCompression` (a push codec under
                                                parameter servers; Adam's frozen variance)
    freeze_variance                             `GradientCompression` (an attribute)
"""

from typing import Protocol, runtime_checkable


@runtime_checkable
class CouplesWorkers(Protocol):
    def couples_workers(self):
        """(Python, after the phase of the next step is entered) False when the step
        traced for the current phase runs no collective across every worker (islands
        between synchronisations): the loop then reads its logs without one either."""


@runtime_checkable
class SkipsCalls(Protocol):
    def trains_next(self):
        """(Python, after the phase of the next step call is entered) False when this
        worker's next step call trains nothing: the loop reads no batch if it can, and
        calls `skipped()`."""

    def skipped(self):
        """A step call that `trains_next()` declined: nothing ran; `after_step` follows."""


@runtime_checkable
class PreparesBackups(Protocol):
    def before_backup(self, model, steps_done):
        """(Python, every worker) Before a backup of the model is captured, `steps_done`
        steps in — possibly before this step's `after_step` (a callback listed earlier
        saves). Without it the driver calls the hook's `before_read`."""


@runtime_checkable
class Updates(Protocol):
    def updater(self, inner):
        """(trace time, in the phase traced) The `tfdist.step.update.Updater` of the step's
        update stage, built on `inner` (the updaters of the hooks before; Keras' own
        first), or `inner` itself."""


def found(hooks, protocol):
    """The hooks, and the parts they list in `abilities`, that have `protocol`."""
    return [part for hook in hooks for part in (hook, *getattr(hook, "abilities", ()))
            if isinstance(part, protocol)]
