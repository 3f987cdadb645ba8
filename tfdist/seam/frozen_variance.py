"""Adam with its second moment frozen from a step on: 1-bit Adam (Tang et al. 2021,
arXiv 2102.02888), the update rule of `GradientCompression(freeze_variance=True)`."""

import keras
import tensorflow as tf

from tfdist.errors import UnsupportedError
from tfdist.step.update import Wrapping


def check_update_rule(optimizer, hooks):
    """UnsupportedError if a hook freezes Adam's second moment and `optimizer` has none."""
    freezing = [type(h).__name__ for h in hooks if getattr(h, "freeze_variance", False)]
    if freezing and (not isinstance(optimizer, keras.optimizers.Adam) or optimizer.amsgrad):
        raise UnsupportedError(
            f"{freezing[0]} freezes Adam's second moment after start_step (freeze_variance, "
            "1-bit Adam): it needs keras.optimizers.Adam or AdamW without amsgrad. Received: "
            f"{type(optimizer).__name__}" + (" with amsgrad=True" if getattr(
                optimizer, "amsgrad", False) else ""))


def frozen_variance_adam(gradient, m, v, learning_rate, step, frozen_step, beta_1, beta_2,
                         epsilon):
    """One Adam step with the second moment `v` frozen at optimizer step `frozen_step`
    (1-bit Adam): returns (new first moment, the change of the variable). `step` counts
    from 1 (Keras' `iterations + 1`); v's bias correction stays the one of `frozen_step`."""
    m = m + (gradient - m) * (1 - beta_1)
    alpha = (learning_rate * tf.sqrt(1 - beta_2 ** frozen_step) / (1 - beta_1 ** step))
    return m, -alpha * m / (tf.sqrt(v) + epsilon)


def frozen_variance_update(self, gradient, variable, learning_rate, frozen_step):
    """Adam's `update_step` with the second moment frozen at `frozen_step` (1-bit Adam)."""
    index = self._get_variable_index(variable)
    m, v = self._momentums[index], self._velocities[index]
    dtype = variable.dtype
    new_m, change = frozen_variance_adam(
        gradient, m, v, tf.cast(learning_rate, dtype), tf.cast(self.iterations + 1, dtype),
        tf.cast(frozen_step, dtype), tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype),
        tf.cast(self.epsilon, dtype))
    m.assign(new_m)
    variable.assign_add(change)


class FrozenVariance(Wrapping):
    """The update stage's rule from optimizer step `step` on: Adam's with its second
    moment frozen (`frozen_variance_update`), on the gradient `inner` hands over."""

    def __init__(self, inner, step):
        super().__init__(inner)
        self.step = step

    def apply(self, optimizer, payload, meta, variable, rate):
        frozen_variance_update(optimizer, tf.cast(payload[0], variable.dtype), variable, rate,
                               self.step)
