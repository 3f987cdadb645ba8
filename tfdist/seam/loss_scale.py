"""Dynamic loss scaling as part of the transactional step (mixed_float16).

Keras' `LossScaleOptimizer` decides "finite or not" from one replica's *local* gradients
(replica 0's, under a merge call) and only then runs the inner optimizer, whose step holds
the all-reduce: a replica whose scaled gradients overflowed while replica 0's did not gets
its NaN applied, and on several workers one worker runs the collectives while another
skips them, which hangs. Here the verdict is the step's own (`tfdist.step.transaction`):
every replica on every worker adds its flag to the step's first all-reduce, so a step
where any scaled gradient is not finite is *skipped* everywhere — nothing changes: weights,
slots, step count, residuals, PowerSGD's Q, accumulators, local-SGD and DiLoCo state —
and the scale halves identically everywhere; it doubles after `dynamic_growth_steps`
committed steps, as in Keras (Micikevicius et al. 2018, "Mixed Precision Training").

`LossScaleOptimizer` is a subclass of Keras' class with the same variables, config and
saved form. A Keras `LossScaleOptimizer` built around a tfdist optimizer — by
`model.compile` under mixed_float16, or by hand — becomes one in place when it is made
(`take_over`, called by the tfdist optimizer Keras disables the loss scaling of), so every
composition a Keras user writes runs this step.
"""

import sys

import keras
import tensorflow as tf

from tfdist.errors import UnsupportedError
from tfdist.step import transaction
from tfdist.strategies.kind import capabilities_of

KerasLossScaleOptimizer = keras.optimizers.LossScaleOptimizer


class LossScaleOptimizer(KerasLossScaleOptimizer):
    """Keras' dynamic loss scaling around a tfdist optimizer (`DistributedOptimizer`),
    with one verdict per step for every replica and worker (see the module docstring).

    Args: those of `keras.optimizers.LossScaleOptimizer` (`inner_optimizer`,
    `initial_scale`, `dynamic_growth_steps`, `name`).

    Raises (when built):
        UnsupportedError: under ParameterServerStrategy, whose workers apply their steps
            asynchronously: there is no step that every replica skips together.
    """

    _tfdist_loss_scale = True

    def build(self, var_list):
        caps = capabilities_of()
        if caps.coordinator:
            raise UnsupportedError(
                f"dynamic loss scaling needs one verdict per step on every replica, and under "
                f"{caps.name} workers apply their steps asynchronously: use mixed_bfloat16 "
                "(no loss scaling), or float32. Received: LossScaleOptimizer around "
                f"{type(self.inner_optimizer).__name__}")
        super().build(var_list)

    def apply(self, grads, trainable_variables=None):
        """Unscales `grads` and applies them through the inner tfdist optimizer as one
        transaction that is skipped, not failed, if any replica's gradient is not finite;
        then updates the scale from that verdict. Returns whether the step committed."""
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        variables = trainable_variables or self._trainable_variables
        scale = self.dynamic_scale
        unscaled = [g if g is None or self._overwrite_variable_with_gradient(v)
                    else keras.ops.divide(g, scale) for g, v in zip(grads, variables)]
        with transaction.skipping():
            committed = self.inner_optimizer.apply(unscaled, trainable_variables)
        tf.__internal__.distribute.interim.maybe_merge_call(
            self._update_scale, tf.distribute.get_strategy(), committed)
        return committed

    def _update_scale(self, distribution, committed):
        """Cross-replica: the step's verdict (the same on every replica) halves the scale,
        or counts towards doubling it."""
        committed = distribution.experimental_local_results(committed)[0]
        counter, scale = self.step_counter, self.dynamic_scale
        grow = tf.logical_and(committed, tf.equal(counter.value, self.dynamic_growth_steps - 1))
        counter.assign(tf.where(committed, tf.where(grow, tf.zeros_like(counter.value),
                                                    counter.value + 1),
                                tf.zeros_like(counter.value)))
        scale.assign(tf.where(committed, tf.where(grow, scale.value * 2, scale.value),
                              scale.value * 0.5))


# Saved as Keras' class, so a model saved with it loads without tfdist (and, with tfdist,
# the Keras class made around a tfdist optimizer becomes this one again).
LossScaleOptimizer.__module__ = KerasLossScaleOptimizer.__module__


def take_over(optimizer):
    """Makes `optimizer` (a Keras `LossScaleOptimizer` around a tfdist optimizer) run
    tfdist's step, in place: same object, variables and config. Returns it."""
    if not isinstance(optimizer, LossScaleOptimizer):
        if type(optimizer) is not KerasLossScaleOptimizer:
            raise UnsupportedError(
                "tfdist runs dynamic loss scaling with keras.optimizers.LossScaleOptimizer "
                "itself, not a subclass of it: its step must decide on every replica at "
                f"once. Received: {type(optimizer).__qualname__}")
        optimizer.__class__ = LossScaleOptimizer
    return optimizer


def take_over_caller(inner, depth=8):
    """Called by a tfdist optimizer when its loss scaling is disabled, which Keras'
    `LossScaleOptimizer.__init__` does to the optimizer it wraps: takes that wrapper over
    (`take_over`). Looks `depth` frames up for it; anything else does nothing."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if (isinstance(owner, KerasLossScaleOptimizer)
                and getattr(owner, "inner_optimizer", None) is inner):
            return take_over(owner)
        frame = frame.f_back
    return None


def is_loss_scale(optimizer):
    return isinstance(optimizer, KerasLossScaleOptimizer)


def inner_of(optimizer):
    """The optimizer inside any `LossScaleOptimizer`s around `optimizer`."""
    while is_loss_scale(optimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer
