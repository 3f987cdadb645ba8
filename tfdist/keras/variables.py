"""Keras 3 variables and the tf.Variable inside them."""

import keras


def underlying(variable):
    """The tf.Variable (possibly distributed) behind a Keras 3 variable, or `variable`."""
    return variable.value if isinstance(variable, keras.Variable) else variable
