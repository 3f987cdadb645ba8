"""The dynamic loss scale and the steps it skipped in an epoch, for every History."""

from tfdist.step.preemption import skipping


class LossScaleLog:
    """Counts an epoch's trained batches and the optimizer's updates, for the figures of
    mixed precision's dynamic loss scaling (`tfdist.seam.loss_scale`):

    - ``loss_scale``: the scale at the epoch's end;
    - ``skipped_steps``: the epoch's steps that updated nothing (a gradient overflowed on a
      replica): its trained batches less its updates. Not with gradient accumulation (a
      batch is then not an update), nor for steps a resumed run skips (they trained
      before the preemption).

    Shared by `TrainingHooks`, `CommStats` and `tfdist.Trainer`, so each one's History has
    them; nothing under a model without dynamic loss scaling.
    """

    def __init__(self):
        self.batches, self.updates = 0, None

    def begin(self, model):
        """At an epoch's start."""
        self.batches, self.updates = 0, updates_of(model)

    def step(self, model, epoch, batch):
        """At a train batch's end (a step a resumed run skips does not count)."""
        if not skipping(model, epoch, batch):
            self.trained(1)

    def trained(self, count):
        """`count` more batches trained in the epoch (a loop that counts them itself)."""
        self.batches += count

    def figures(self, model):
        """{"loss_scale", "skipped_steps"} at the epoch's end, or {}."""
        optimizer = getattr(model, "optimizer", None)
        if not hasattr(optimizer, "dynamic_scale"):  # mixed precision's LossScaleOptimizer
            return {}
        figures = {"loss_scale": float(optimizer.dynamic_scale.numpy())}
        inner = getattr(optimizer, "inner_optimizer", None)
        if self.updates is not None and self.batches and not getattr(
                inner, "gradient_accumulation_steps", None):
            figures["skipped_steps"] = float(self.batches - (updates_of(model) - self.updates))
        return figures


def updates_of(model):
    """The optimizer's update count (`iterations`), or None without an optimizer."""
    optimizer = getattr(model, "optimizer", None)
    return None if optimizer is None else int(optimizer.iterations.numpy())
