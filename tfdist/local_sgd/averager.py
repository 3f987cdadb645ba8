"""Local SGD: replicas train on their own and average their models every `period` steps.

Stich 2019, "Local SGD Converges Fast and Communicates Little"; post-local SGD: Lin et
al. 2020, "Don't Use Large Mini-Batches, Use Local SGD" — `warmup_steps` of ordinary
synchronous training first. PyTorch's `PeriodicModelAverager` is the model.

Between averages there is no gradient exchange at all: each replica applies its own
gradient (the exchange hook returns it, scaled back from Keras' 1/replicas loss share),
so replicas — and workers — really hold different weights. Every `period` steps, and
before anything reads the model (validation, checkpoints, the end of an epoch or of
training), the weights are set to their mean over all replicas: one all-reduce of the
model instead of `period` all-reduces of the gradients. The average may itself be
compressed: then the replicas exchange their compressed *change* since the last average
(which compresses like a gradient; the weights themselves would not) and all add the same
decoded mean to the same anchor, so they end identical.
"""

import tensorflow as tf

from tfdist.compression.factory import build
from tfdist.core.hooks import TrainingHook, all_reduce_sum
from tfdist.core.variables import per_replica_state, underlying
from tfdist.errors import UnsupportedError
from tfdist.strategies.capabilities import names_with
from tfdist.strategies.kind import capabilities_of


class ModelAverager(TrainingHook):
    """Periodic model averaging, as a `TrainingHook`: the same object in `model.fit`,
    `tfdist.Trainer` and your own loop (`tfdist.function`).

    Args:
        period: local steps between two averages (1: as synchronous as plain SGD).
        warmup_steps: synchronous steps (gradients all-reduced) before local SGD starts.
        average_non_trainable: also average per-replica Keras state (BatchNormalization
            statistics) at each average, not only at the end of each epoch.
        average_optimizer_state: also average the optimizer's slots (momenta).
        compression: compress the averaging exchange — a compressor name, a
            `compression:` section or a `GradientCompression` hook.
    """

    replaces_exchange = True

    def __init__(self, period, warmup_steps=0, average_non_trainable=False,
                 average_optimizer_state=False, compression=None):
        if int(period) < 1 or int(warmup_steps) < 0:
            raise ValueError("period must be >= 1 and warmup_steps >= 0. Received: "
                             f"period={period}, warmup_steps={warmup_steps}")
        self.period, self.warmup_steps = int(period), int(warmup_steps)
        self.average_non_trainable = average_non_trainable
        self.average_optimizer_state = average_optimizer_state
        self.compression = _compression_hook(compression)
        self.phased = self.warmup_steps > 0
        self.in_sync = True  # every replica holds the same weights
        self.averages = 0    # averages done (the step counter of a compressed average)
        self.strategy, self.anchors, self._functions = None, None, {}
        self._last_steps_done = None

    @classmethod
    def from_config(cls, config, **overrides):
        """From a `LocalSGDConfig` (the config's `local_sgd:` section)."""
        return cls(**{**vars(config), **overrides})

    def __repr__(self):
        return (f"ModelAverager(period={self.period}, warmup_steps={self.warmup_steps}, "
                f"compression={self.compression.compressor.name if self.compression else None})")

    # --- the training step ------------------------------------------------------------

    def build(self, strategy, variables):
        if strategy.num_replicas_in_sync > 1 and not capabilities_of(strategy).local_sgd:
            raise UnsupportedError(
                "local SGD needs replicas that hold their own copy of the weights "
                f"([{', '.join(names_with('local_sgd'))}]); under "
                f"{type(strategy).__name__} variables are stored once. Received: "
                f"strategy={type(strategy).__name__}")
        self.strategy, self.anchored = strategy, False
        self.model_bytes = 4 * sum(int(v.shape.num_elements()) for v in variables)
        if self.compression is not None:
            local = dict(trainable=False, aggregation=tf.VariableAggregation.NONE)
            self.anchors = [tf.Variable(tf.zeros(v.shape, tf.float32), name="tfdist_anchor",
                                        **local) for v in variables]
            self.weights = [underlying(v) for v in variables]
            self.compression.build(strategy, self.anchors)

    def phase(self, step):
        """Synchronous (True) during the warm-up."""
        return step < self.warmup_steps

    def enter_phase(self, phase):
        super().enter_phase(phase)
        if not phase and self.anchors is not None and not self.anchored:
            self._anchor()  # the replicas are in sync here: the last step was synchronous

    def _anchor(self):
        """Anchors := the (identical) weights of every replica, where local SGD starts."""
        def copy():
            for anchor, weight in zip(self.anchors, self.weights):
                anchor.assign(tf.cast(weight.read_value(), tf.float32))

        tf.function(lambda: self.strategy.run(copy))()
        self.anchored = True

    def exchange(self, grads, variables, step):
        synchronous = self.phase(0) if self.current_phase is None else self.current_phase
        if synchronous:  # the warm-up
            return all_reduce_sum(grads)
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        return [tf.convert_to_tensor(g) * replicas for g in grads]  # this replica's own mean

    def bytes_per_step(self, step=None):
        """Like `GradientCompression.bytes_per_step`: after the warm-up, one average of
        the trainable weights (compressed or not) every `period` steps."""
        dense = {"payload": self.model_bytes, "dense": self.model_bytes, "gathered": 0}
        if step is not None and step < self.warmup_steps:
            return dense
        sent = self.compression.bytes_per_step() if self.compression is not None else dense
        return {"payload": sent["payload"] / self.period, "dense": self.model_bytes,
                "gathered": sent["gathered"] / self.period}

    # --- between steps ----------------------------------------------------------------

    def after_step(self, model, steps_done):
        """Averages when `period` local steps have passed since the warm-up. (Called
        again with the same count — micro-batches of an accumulated step — it waits.)"""
        if steps_done == self._last_steps_done:
            return
        self._last_steps_done = steps_done
        if steps_done <= self.warmup_steps:
            self.in_sync = True  # the steps so far were synchronous
            return
        self.in_sync = False
        if (steps_done - self.warmup_steps) % self.period == 0:
            self.average(model)

    def before_read(self, model):
        if not self.in_sync:
            self.average(model)

    def average(self, model):
        """Sets every replica's weights (and the chosen state) to the mean over replicas
        and workers. Call it on every worker at the same point: it runs collectives."""
        variables = self.variables_of(model)
        key = tuple(id(v) for group in variables for v in group)
        if key not in self._functions:
            self._functions[key] = self._average_function(variables)
        self._functions[key](tf.constant(self.averages, tf.int64))
        self.averages += 1
        self.in_sync = True

    def variables_of(self, model):
        """(trainable weights, other state to average), as tf.Variables."""
        weights = [underlying(v) for v in model.trainable_variables]
        state = []
        if self.average_non_trainable:
            state += per_replica_state(self.strategy, model.non_trainable_variables)
        if self.average_optimizer_state and model.optimizer is not None:
            skip = {id(underlying(model.optimizer.iterations))}
            state += [underlying(v) for v in model.optimizer.variables
                      if v.dtype.is_floating and id(underlying(v)) not in skip
                      and isinstance(underlying(v), tf.distribute.DistributedValues)]
        return weights, state

    def _average_function(self, variables):
        weights, state = variables
        if self.strategy.num_replicas_in_sync < 2:
            return lambda step: None
        if self.compression is not None and len(weights) != len(self.anchors):
            raise ValueError(f"the model has {len(weights)} trainable weights but the averager "
                             f"was built for {len(self.anchors)}; use one averager per model")

        def replica_fn(step):
            context = tf.distribute.get_replica_context()
            if self.compression is None:
                plain = weights + state
            else:
                plain = state
                self._compressed_average(context, weights, step)
            if plain:
                means = context.all_reduce(tf.distribute.ReduceOp.MEAN,
                                           [v.read_value() for v in plain])
                for variable, mean in zip(plain, means):
                    variable.assign(mean)

        return tf.function(lambda step: self.strategy.run(replica_fn, args=(step,)))

    def _compressed_average(self, context, weights, step):
        """anchor + mean of the compressed changes since the anchor, on every replica."""
        changes = [tf.cast(w.read_value(), tf.float32) - a for w, a in zip(weights, self.anchors)]
        summed = self.compression.exchange(changes, self.anchors, step)
        for weight, anchor, change in zip(weights, self.anchors, summed):
            mean = anchor + change / context.num_replicas_in_sync
            anchor.assign(mean)
            weight.assign(tf.cast(mean, weight.dtype))


def _compression_hook(compression):
    if compression is None:
        return None
    hook = build(compression)
    if not hook.compressor.compresses:
        return None
    if hook.start_step > 0:
        raise ValueError("a compressed model average has no delayed start; warm up with "
                         f"warmup_steps instead. Received: start_step={hook.start_step}")
    return hook
