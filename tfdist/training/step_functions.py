"""The Trainer's compiled steps: the training step (forward, loss scaled as Keras 3 scales
it, the gradient through tfdist's optimizer as one transaction, the metrics read with one
all-reduce beside the backward pass) and the test step, each one `tf.function` that takes
the batch — or, under parameter servers, the iterator its step is scheduled with."""

import keras
import tensorflow as tf

from tfdist.seam.loss_scale import is_loss_scale
from tfdist.step.tracing import plain_function
from tfdist.step.variables import underlying
from tfdist.strategies import batch_rows
from tfdist.training.losses import update_state, weighed_by
from tfdist.training.metrics import can_read_at_once, read_at_once, update_metric


class StepFunctions:
    """Makes and serves the compiled steps of `trainer` (a `tfdist.Trainer`): its model,
    loss, optimizer, metrics and strategy are read from it."""

    def __init__(self, trainer):
        self.trainer = trainer

    def train(self):
        strategy, model = self.trainer.strategy, self.trainer.model

        def weighed_step(data):  # each replica's gradient weighs its rows: batch_rows
            if self.trainer.coordinator is not None:  # parameter servers: each worker steps alone
                return replica_step(data)
            with batch_rows.weighing(data):
                return replica_step(data)

        def replica_step(data):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            state = [underlying(v) for v in model.non_trainable_variables]
            before = [v.read_value() for v in state]  # the forward pass updates some
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                scaled = self._scaled_loss(y, y_pred, sample_weight)
                if is_loss_scale(self.trainer.optimizer):  # dynamic loss scaling (mixed_float16)
                    scaled_up = self.trainer.optimizer.scale_loss(scaled)
            early = self._logs_before_backward()
            if early:  # the logs' all-reduce runs beside the backward
                self._update_metrics(scaled * strategy.num_replicas_in_sync, y, y_pred,
                                     sample_weight)  # pass, not after the step (issue 33)
                logs = self._replica_results(training=True)
            grads = tape.gradient(scaled_up if is_loss_scale(self.trainer.optimizer) else scaled,
                                  self.trainer.variables)
            committed = self.trainer.optimizer.apply(grads, self.trainer.variables)
            self._take_back_if_refused(committed, state, before)
            if early:  # (None: each metric is read on its own afterwards)
                return logs
            keep, weight = None, sample_weight
            if is_loss_scale(self.trainer.optimizer):  # a skipped step counts in no metric
                keep, weight = weighed_by(committed, y_pred, sample_weight)
            self._update_metrics(scaled * strategy.num_replicas_in_sync, y, y_pred, weight, keep)
            return self._replica_results(training=True)

        def step_fn(data):
            return self._step_results(strategy.run(weighed_step, args=(data,)))

        return self._compile(step_fn)

    def test(self):
        strategy, model = self.trainer.strategy, self.trainer.model

        def replica_step(data):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            y_pred = model(x, training=False)
            loss = self._scaled_loss(y, y_pred, sample_weight) * strategy.num_replicas_in_sync
            self._update_metrics(loss, y, y_pred, sample_weight)
            return self._replica_results()

        def step_fn(data):
            return self._step_results(strategy.run(replica_step, args=(data,)))

        return self._compile(step_fn)

    def _compile(self, step_fn):
        """A tf.function of one step that takes the iterator (scheduled under a coordinator)
        or, elsewhere, the batch: reading it eagerly ends the data cleanly, before any op of
        the step runs (inside a graph, ops not fed by the data would still run). Traced
        without AutoGraph, as Keras' fit traces its step: the model, loss and metrics are
        Keras' (AutoGraph leaves them as written), and converting the Trainer's own code
        took half of its first step's tracing."""
        if self.trainer.coordinator is not None:
            return plain_function(lambda iterator: step_fn(next(iterator)))
        return plain_function(step_fn, reduce_retracing=True)

    def _scaled_loss(self, y, y_pred, sample_weight):
        """This replica's share of the global loss, as Keras 3 computes it.

        Keras 3 losses divide by `num_replicas_in_sync` under a strategy, so that summing
        gradients across replicas averages them; model losses (regularisation) get the
        same share here. Multiply by `num_replicas_in_sync` for the loss itself.
        """
        loss = self.trainer.loss(y, y_pred, sample_weight)
        if self.trainer.model.losses:
            loss += tf.add_n(self.trainer.model.losses) / self.trainer.strategy.num_replicas_in_sync
        return loss

    def _update_metrics(self, loss, y, y_pred, sample_weight, keep=None):
        """Updates the loss and the metrics; `keep` (0.0 or 1.0, a tensor) weighs this
        step's contribution (a step skipped by dynamic loss scaling counts in none). The
        loss counts as many times as the batch has rows, as under `model.fit` (a partial
        last batch weighs less)."""
        update = update_metric if self.trainer.coordinator is not None else update_state
        rows = tf.cast(tf.shape(tf.nest.flatten(y_pred)[0])[0], tf.float32)
        update(self.trainer.loss_tracker, loss, rows if keep is None else rows * keep)
        for metric in self.trainer.metrics:
            update(metric, y, y_pred, sample_weight)

    def _logs_before_backward(self):
        """Whether a training step updates and reads its metrics right after the forward
        pass: their all-reduce then overlaps the backward pass instead of adding a
        collective's latency after the gradients' (measured: benchmarks/pass_through.py).
        Not under dynamic loss scaling (a skipped step counts in no metric: that waits for
        the verdict) nor under parameter servers (no per-step read)."""
        return self.trainer.coordinator is None and not is_loss_scale(self.trainer.optimizer)

    def _take_back_if_refused(self, committed, variables, values):
        """Sets `variables` back to `values` if the step was refused (replica context)."""
        if self.trainer.coordinator is None:  # synchronous: every replica writes its own copy
            for variable, value in zip(variables, values):
                variable.assign(tf.where(committed, variable.read_value(), value))
            return

        def take_back():  # parameter servers: other workers write meanwhile, so only then
            for variable, value in zip(variables, values):
                variable.assign(value)
            return tf.constant(False)

        tf.cond(committed, lambda: tf.constant(True), take_back)

    def results(self):
        return {m.name: m.result() for m in [self.trainer.loss_tracker, *self.trainer.metrics]}

    def _replica_results(self, training=False):
        """(replica context) The step's logs from one all-reduce of every metric's state,
        where that is possible (`tfdist.training.metrics.read_at_once`); else None. A
        training step of islands between synchronisations reads this replica's own (the
        epoch's logs are read across every worker at its end)."""
        tracked = [self.trainer.loss_tracker, *self.trainer.metrics]
        if training and self.trainer.coordinator is None and self.trainer.runner.apart:
            if can_read_at_once(tracked):  # islands apart: this replica's own, no collective
                return read_at_once(tracked, across=False)
            return {m.name: m.result() for m in tracked}
        if self.trainer.coordinator is None and can_read_at_once(tracked):
            return read_at_once(tracked)
        return None

    def _step_results(self, per_replica):
        """(cross-replica context) The step's logs: the first replica's copy of what every
        replica read at once, else each metric read on its own."""
        if per_replica is None:
            return self.results()
        first = self.trainer.strategy.experimental_local_results
        return tf.nest.map_structure(lambda value: first(value)[0], per_replica)
