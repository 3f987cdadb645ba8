"""The update stage of a step — exchange → update → commit: after the exchange, which
variables this step updates, what crosses to where each one is updated (its own devices;
a parameter server's under parameter servers), and how the update is made there.

An `Updater` answers the three per variable — the tf.Variable behind a Keras variable
(`tfdist.step.variables.underlying`): `updates`, `encode` (with the bytes that cross,
`payload_bytes`) and `apply` — Keras' own `update_step` by default. A hook that
changes the update has the `Updates` ability (`tfdist.step.abilities`): its
`updater(inner)` returns an updater built on `inner`, and the pipeline chains them in hook
order (`GradientPipeline.updater`), so that a push codec, Adam's frozen variance and
whatever a hook of yours does compose. Weight decay and the step's commit stay the
optimizer seam's (`tfdist.seam.optimizer`), around every updater.
"""

import tensorflow as tf

from tfdist.step import wire


class Updater:
    """Keras' own update: every variable, its gradient as it is, `optimizer.update_step`.

    Subclass `Wrapping` to change one answer and keep `inner`'s others."""

    def updates(self, variable):
        """(trace time) Whether this step updates `variable`."""
        return True

    def encode(self, grad, variable):
        """(replica context) (payload tensors, meta): what crosses to `variable`'s devices."""
        return (grad,), None

    def payload_bytes(self, payload, variable):
        """(trace time) The bytes `payload` takes on the wire (a gradient: its variable's
        size where its shape is dynamic)."""
        return sum(wire.sent_bytes(p, variable) for p in payload)

    def apply(self, optimizer, payload, meta, variable, rate):
        """(on `variable`'s devices, inside the step's commit) The update from `encode`'s
        payload at learning rate `rate`."""
        optimizer.update_step(tf.cast(payload[0], variable.dtype), variable, rate)


class Wrapping(Updater):
    """An updater built on `inner`: every answer is `inner`'s unless overridden."""

    def __init__(self, inner):
        self.inner = inner

    def updates(self, variable):
        return self.inner.updates(variable)

    def encode(self, grad, variable):
        return self.inner.encode(grad, variable)

    def payload_bytes(self, payload, variable):
        return self.inner.payload_bytes(payload, variable)

    def apply(self, optimizer, payload, meta, variable, rate):
        self.inner.apply(optimizer, payload, meta, variable, rate)
