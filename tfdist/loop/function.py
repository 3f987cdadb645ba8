"""`tfdist.function`: `tf.function` for a training step of your own loop, with tfdist's
hooks around each call (the per-step rules of `tfdist.loop.runner`):

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
"""

import tensorflow as tf

from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.loop.runner import NOTHING, StepRunner
from tfdist.step.preemption import preemption


class StepFunction:
    """`tf.function` for your own training loop, with tfdist's hooks around each call.
    See `function`."""

    def __init__(self, fn, model, optimizer=None, preemption=False, **tf_function_options):
        self.fn, self.options = fn, tf_function_options
        self.model, self.optimizer = model, optimizer
        self.watch_preemption = check_arguments("StepFunction", {"preemption": checks.boolean},
                                                preemption=preemption)["preemption"]
        self._runner = None
        if optimizer is not None:
            self._runner = StepRunner(model, optimizer)  # a wrong one is refused at once

    @property
    def runner(self):
        """The `StepRunner`, made at the first call: the model's optimizers may be built
        after the step is decorated."""
        if self._runner is None:
            self._runner = StepRunner(self.model, self.optimizer)
        return self._runner

    @property
    def driver(self):
        return self.runner.driver

    def __call__(self, *args, **kwargs):
        if self.watch_preemption and self._runner is None:
            preemption().install()
            preemption().watch(self.model.distribute_strategy)
        call = self.runner.begin(lambda: tf.function(self.fn, **self.options))
        if self.watch_preemption:
            preemption().before_step()
        result = None if call is NOTHING else call(*args, **kwargs)  # NOTHING: a slower
        self.runner.end(call)  # island's call, its batch trains nothing
        return result

    def preempted(self):
        """With `preemption=True`: whether a task of the job got a preemption signal (SIGTERM)
        before the last step, as that step's all-reduce told every worker — the same
        answer everywhere, after the same step: save, then exit with code 143."""
        return self.watch_preemption and preemption().agreed() > 0

    def before_read(self):
        """Call before validation, checkpoints, the end of an epoch and of training."""
        if self._runner is not None:
            self._runner.before_read()


def function(fn=None, *, model, optimizer=None, preemption=False, **tf_function_options):
    """`@tf.function` for a training step of your own loop, with tfdist's hooks (an
    example in the module's docstring).

    Each call runs the step traced for the hooks' current phase (a delayed start exchanges
    uncompressed gradients first, local SGD's warm-up is synchronous, gradient
    accumulation exchanges every k-th call), then the hooks' `after_step` (local SGD
    averages every `period` steps). `before_read()` makes one model of the replicas.

    Args:
        fn: the Python step function (it calls `strategy.run`).
        model: the model the step trains.
        optimizer: the tfdist optimizer `fn` applies gradients with (also inside a
            `LossScaleOptimizer`), or a list of them; by default every one the model has
            (`model.optimizer`, optimizers kept as the model's attributes, else those built
            on its variables).
        preemption: catch SIGTERM and let every worker know after the same step:
            `step.preempted()` then says True on all of them (the step's tfdist optimizer
            carries the flag in its all-reduce; `tfdist.step.preemption`).
        **tf_function_options: passed to `tf.function` (e.g. `reduce_retracing`).

    Returns:
        A `StepFunction` (or, without `fn`, a decorator making one).

    Raises:
        ValueError: no tfdist optimizer, or a given one that does not exchange through
            tfdist (the message says what to wrap).
    """
    if fn is None:
        return lambda f: StepFunction(f, model, optimizer, preemption, **tf_function_options)
    return StepFunction(fn, model, optimizer, preemption, **tf_function_options)
