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
    frozen_variance_step()   FreezesVariance    `GradientCompression(freeze_variance=True)`
    freeze_variance, push_codec                 `GradientCompression` (attributes)
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
class FreezesVariance(Protocol):
    def frozen_variance_step(self):
        """The optimizer step at which Adam's second moment stays in the phase traced
        (1-bit Adam; `tfdist.seam.optimizer.frozen_variance_adam`), or None."""


def found(hooks, protocol):
    """The hooks, and the parts they list in `abilities`, that have `protocol`."""
    return [part for hook in hooks for part in (hook, *getattr(hook, "abilities", ()))
            if isinstance(part, protocol)]
