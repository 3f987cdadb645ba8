"""The driver of a training loop's hooks, and `tfdist.function` for your own loop.

One `HookDriver` per loop calls the Python side of the hook contract
(`tfdist.core.hooks`) at the same moments in every loop: `tfdist.Trainer` owns one,
`tfdist.callbacks.TrainingHooks` is one for `model.fit`, and `tfdist.function` is one for
a `tf.GradientTape` loop. It is the only place that changes phases; the optimizer's
`iterations` is the only step counter.
"""

import tensorflow as tf

from tfdist.core.optimizer import pipeline_of


class HookDriver:
    """Drives the hooks of `optimizer`'s pipeline from a training loop.

    Args:
        model: the Keras model being trained (hooks average or read its variables).
        optimizer: its optimizer, routed through tfdist (`DistributedOptimizer`);
            by default `model.optimizer`.

    Raises:
        ValueError: the optimizer does not exchange through tfdist.
    """

    def __init__(self, model, optimizer=None):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.pipeline = pipeline_of(self.optimizer)
        if self.pipeline is None:
            raise ValueError(
                "tfdist's hooks run around an optimizer that exchanges through tfdist: wrap "
                "it with tfdist.keras.DistributedOptimizer(optimizer, ...). "
                f"Received: optimizer={self.optimizer!r}")
        self._functions = {}  # hooks' phases -> the step traced for them

    def steps(self):
        """Optimizer updates done so far (the one step counter)."""
        return int(self.optimizer.iterations.numpy())

    def begin_step(self):
        """Enters each hook's phase for the next step (every hook's before the first step a
        pipeline runs, then those that change); returns the phases (a cache key)."""
        hooks = self.pipeline.hooks
        step = self.steps() if any(h.phased for h in hooks) else 0
        phases = tuple(hook.phase(step) for hook in hooks)
        for hook, phase in zip(hooks, phases):
            if phase != hook.current_phase or not self.pipeline.driven:
                hook.enter_phase(phase)
        self.pipeline.driven = True
        return phases

    def function(self, make):
        """The compiled step for the next step: `make()` traced once per phase (collectives
        cannot be switched inside one compiled step, `TrainingHook.phase`)."""
        key = self.begin_step()
        if key not in self._functions:
            self._functions[key] = make()
        return self._functions[key]

    def owns(self, function):
        """Whether `function` is one of the steps made here."""
        return any(function is f for f in self._functions.values())

    def end_step(self, steps_done=None):
        """After a step: every hook's `after_step` (`steps_done` defaults to the counter)."""
        steps_done = self.steps() if steps_done is None else steps_done
        self.pipeline.changed = True
        for hook in self.pipeline.hooks:
            hook.after_step(self.model, steps_done)

    def before_read(self):
        """Before validation, a checkpoint, an epoch's or the training's end: every hook's
        `before_read`, once after each change (a second call without a step between is free)."""
        before_read(self.model, self.optimizer)


def before_read(model, optimizer=None):
    """Lets the hooks of `model`'s optimizer make one model of the replicas before
    something reads or saves it, if a step ran since they last did; on every worker."""
    pipeline = pipeline_of(optimizer if optimizer is not None else getattr(model, "optimizer", None))
    if pipeline is None or not pipeline.changed:
        return
    pipeline.changed = False
    for hook in pipeline.hooks:
        hook.before_read(model)


class StepFunction:
    """`tf.function` for your own training loop, with tfdist's hooks around each call.
    See `function`."""

    def __init__(self, fn, model, optimizer=None, **tf_function_options):
        self.fn, self.options = fn, tf_function_options
        self.driver = HookDriver(model, optimizer)

    def __call__(self, *args, **kwargs):
        step = self.driver.function(lambda: tf.function(self.fn, **self.options))
        result = step(*args, **kwargs)
        self.driver.end_step()
        return result

    def before_read(self):
        """Call before validation, checkpoints, the end of an epoch and of training."""
        self.driver.before_read()


def function(fn=None, *, model, optimizer=None, **tf_function_options):
    """`@tf.function` for a training step of your own loop, with tfdist's hooks.

        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(), "topk",
                                                      start_step=100)
        @tfdist.function(model=model, optimizer=optimizer)
        def train_step(inputs):
            return strategy.run(replica_step, args=(inputs,))

        for epoch in range(epochs):
            for inputs in distributed_dataset:
                train_step(inputs)
            train_step.before_read()   # before validation, checkpoints, epoch ends
            ...

    Each call runs the step traced for the hooks' current phase (a delayed start exchanges
    uncompressed gradients first, local SGD's warm-up is synchronous, gradient
    accumulation exchanges every k-th call), then the hooks' `after_step` (local SGD
    averages every `period` steps). `before_read()` makes one model of the replicas.

    Args:
        fn: the Python step function (it calls `strategy.run`).
        model: the model the step trains.
        optimizer: the optimizer `fn` applies gradients with, routed through tfdist;
            by default `model.optimizer`.
        **tf_function_options: passed to `tf.function` (e.g. `reduce_retracing`).

    Returns:
        A `StepFunction` (or, without `fn`, a decorator making one).

    Raises:
        ValueError: the optimizer does not exchange through tfdist.
    """
    if fn is None:
        return lambda f: StepFunction(f, model, optimizer, **tf_function_options)
    return StepFunction(fn, model, optimizer, **tf_function_options)
