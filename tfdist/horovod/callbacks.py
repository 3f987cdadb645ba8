"""Horovod's Keras callbacks (`horovod.tensorflow.keras.callbacks`, `horovod._keras.
callbacks`): one model on every worker, metrics averaged over them, and the learning-rate
warm-up and schedule of Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet
in 1 Hour" (2017)."""

import functools

import keras

from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.horovod import basics
from tfdist.horovod.ops import allreduce, broadcast_variables, check_root
from tfdist.keras.callbacks.training_hooks import TrainingHooks
from tfdist.report import say
from tfdist.seam.optimizer import learning_rate_schedule, pipeline_of

def _optional(check):
    """`check`, letting None through."""
    return lambda source, path, value: None if value is None else check(source, path, value)


ARGUMENTS = {"initial_lr": functools.partial(checks.number, minimum=0),
             "multiplier": functools.partial(checks.number, minimum=0),
             # epochs may be fractions, as Horovod's (keras_imagenet_resnet50.py passes
             # its float --warmup-epochs): an epoch's rate applies from the first epoch
             # at or past start_epoch, up to the last one before end_epoch
             "warmup_epochs": functools.partial(checks.number, minimum=0, open_minimum=True),
             "start_epoch": functools.partial(checks.number, minimum=0),
             "end_epoch": _optional(functools.partial(checks.number, minimum=0)),
             "steps_per_epoch": _optional(functools.partial(checks.integer, minimum=1)),
             "staircase": checks.boolean, "momentum_correction": checks.boolean}

__all__ = ["BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback", "MetricAverageCallback"]


class BroadcastGlobalVariablesCallback(TrainingHooks):
    """After the first batch, every worker takes `root_rank`'s model and optimizer
    variables (the optimizer's exist once it has applied a step; its gradient accumulators
    stay each worker's own), as Horovod's. It is
    also `tfdist.callbacks.TrainingHooks`: fit's steps are driven by tfdist's hooks
    (`backward_passes_per_step`, and any tfdist hook the optimizer carries).

    Under local SGD and DiLoCo (`compression=` a model averager) the workers' weights
    are their own after a step, so the model is taken from `root_rank` before the first
    step instead (DiLoCo's anchors are copied from it), and not in a resumed run (each
    worker then holds its own restored weights)."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank, self.done = check_root(root_rank), False

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        if not self.done and _averages_models(optimizer):
            if not optimizer.built:  # outside a strategy, Keras builds it in the first step
                optimizer.build(self.model.trainable_variables)
            if int(optimizer.iterations.numpy()) == 0:
                broadcast_variables(self.model.variables, self.root_rank)
            self.done = True
        super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self.done:
            return
        broadcast_variables(self.model.variables, self.root_rank)
        if self.model.optimizer is not None:
            broadcast_variables(_shared_state(self.model.optimizer), self.root_rank)
        self.done = True


def _averages_models(optimizer):
    """Whether `optimizer`'s workers train apart between synchronisations (local SGD)."""
    pipeline = pipeline_of(optimizer) if optimizer is not None else None
    return pipeline is not None and any(hook.replicas_apart for hook in pipeline.hooks)


def _shared_state(optimizer):
    """The optimizer's variables but its gradient accumulators (each worker's own passes
    of `backward_passes_per_step`: Horovod keeps them outside the optimizer)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    own = {id(v) for v in getattr(inner, "_accumulated_gradients", None) or ()}
    return [v for v in optimizer.variables if id(v) not in own]


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end, every number in the logs becomes its mean over the workers
    (each worker's metrics are its own shard's), as Horovod's."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        for key, value in sorted((logs or {}).items()):  # the same order on every worker
            if isinstance(value, (int, float)) or hasattr(value, "dtype"):
                logs[key] = float(allreduce(float(value), op="Average"))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """From `start_epoch` to `end_epoch` (excluded), the learning rate is `initial_lr *
    multiplier(epoch)` — `multiplier` a number or a function of the epoch — set at each
    epoch's first batch (`staircase`) or at every batch with the epoch's fraction, as
    Horovod's. Keras 3 compiles the momentum into the step, so Horovod's momentum
    correction (the momentum scaled for the one batch where the rate changes) is not
    done; the rate itself is."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        check_arguments(type(self).__name__, ARGUMENTS, initial_lr=initial_lr,
                        start_epoch=start_epoch, end_epoch=end_epoch, staircase=staircase,
                        momentum_correction=momentum_correction,
                        steps_per_epoch=steps_per_epoch,
                        **({} if callable(multiplier) else {"multiplier": multiplier}))
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.staircase, self.steps_per_epoch, self.verbose = staircase, steps_per_epoch, verbose
        self.current_epoch = 0

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps")
        if not self.staircase and not self.steps_per_epoch:
            raise ValueError("a learning rate changed at every batch needs steps_per_epoch "
                             "(fit did not say how many steps an epoch has): pass "
                             "steps_per_epoch= to the callback or to fit")
        schedule = learning_rate_schedule(self._optimizer())
        if schedule is not None:
            raise ValueError(f"{type(self).__name__} sets the optimizer's learning rate, but "
                             f"it is a schedule ({type(schedule).__name__}); build the "
                             "warm-up or the steps into the schedule instead")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._set(self.initial_lr * self.multiplier(epoch))
        elif not self.staircase:
            self._set(self.initial_lr * self.multiplier(epoch + batch / self.steps_per_epoch))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(self._optimizer().learning_rate.numpy())

    def _optimizer(self):
        optimizer = self.model.optimizer
        return getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's

    def _set(self, rate):
        self._optimizer().learning_rate.assign(rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """The rate grows from `initial_lr / size` to `initial_lr` over `warmup_epochs`, a
    little every batch, as Horovod's (Goyal et al., section 2.2: gradual warm-up)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        check_arguments(type(self).__name__, ARGUMENTS, warmup_epochs=warmup_epochs)
        size = basics.size()

        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, verbose=verbose)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch < self.end_epoch <= epoch + 1 and self.verbose > 0:  # its last epoch
            rate = float(self._optimizer().learning_rate.numpy())
            say(f"Epoch {epoch + 1}: finished gradual learning rate warmup to {rate:g}.")

