"""`LearningRateWarmup`: linear warm-up to a learning rate scaled by the replicas."""

import functools

import keras

from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.keras.callbacks.worker_scratch import strategy_of
from tfdist.seam.optimizer import learning_rate_schedule


def warmup_rate(step, base_rate, target_rate, warmup_steps):
    """The learning rate at `step`: linear from `base_rate` at step 0 to `target_rate` at
    `warmup_steps`, constant after (Goyal et al. 2017, "Accurate, Large Minibatch SGD:
    Training ImageNet in 1 Hour", gradual warm-up)."""
    if step >= warmup_steps:
        return target_rate
    return base_rate + (target_rate - base_rate) * step / warmup_steps


_RATE = functools.partial(checks.number, minimum=0)
ARGUMENTS = {"warmup_steps": functools.partial(checks.integer, minimum=1),
             "target_rate": _RATE, "initial_rate": _RATE, "scale_by_replicas": checks.boolean}


class LearningRateWarmup(keras.callbacks.Callback):
    """Ramps the optimizer's learning rate linearly over `warmup_steps` optimizer steps,
    from the rate it was compiled with to that rate times the number of replicas in sync
    (the linear scaling rule: a k-times larger global batch takes a k-times larger rate).

    Works with `model.fit` and `tfdist.Trainer`, on every worker alike.

    Args:
        warmup_steps: optimizer steps of the ramp (>= 1).
        target_rate: the rate reached at the end; default: initial rate x replicas.
        scale_by_replicas: with `target_rate` None, scale by `num_replicas_in_sync`
            (False: the target is the initial rate, i.e. a warm-up from `initial_rate`).
        initial_rate: the rate at step 0; default: the optimizer's rate at the start.

    Raises:
        ValueError: the optimizer's learning rate is a schedule (a callback cannot set
            it; put the warm-up in the schedule instead), or `warmup_steps` < 1.
    """

    def __init__(self, warmup_steps, target_rate=None, scale_by_replicas=True,
                 initial_rate=None):
        super().__init__()
        rates = {k: v for k, v in (("target_rate", target_rate),
                                   ("initial_rate", initial_rate)) if v is not None}
        a = check_arguments("LearningRateWarmup", ARGUMENTS, warmup_steps=warmup_steps,
                            scale_by_replicas=scale_by_replicas, **rates)
        self.warmup_steps, self.target_rate = a["warmup_steps"], a.get("target_rate")
        self.scale_by_replicas, self.initial_rate = scale_by_replicas, a.get("initial_rate")
        self.base = self.target = None

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        schedule = learning_rate_schedule(optimizer)
        if schedule is not None:
            raise ValueError("LearningRateWarmup sets the optimizer's learning rate, but it is "
                             f"a schedule ({type(schedule).__name__}); build "
                             "the warm-up into the schedule instead")
        if self.base is None:  # a second fit() continues the same ramp
            self.base = (float(optimizer.learning_rate.numpy()) if self.initial_rate is None
                         else float(self.initial_rate))
            replicas = strategy_of(self.model).num_replicas_in_sync
            self.target = (self.target_rate if self.target_rate is not None
                           else self.base * (replicas if self.scale_by_replicas else 1))

    def on_train_batch_begin(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step <= self.warmup_steps:  # after the ramp, the rate is left to the user
            self.model.optimizer.learning_rate = warmup_rate(step, self.base, self.target,
                                                             self.warmup_steps)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate.numpy())
