"""`Trainer`: a custom training loop with a Keras-like `fit`, under any strategy."""

import functools
import itertools

import keras
import tensorflow as tf

from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.keras.callbacks.loss_scale_log import LossScaleLog
from tfdist.loop.runner import NOTHING, RunsHooks, StepRunner
from tfdist.seam.loss_scale import LossScaleOptimizer, is_loss_scale
from tfdist.seam.optimizer import pipeline_of, with_gradient_pipeline
from tfdist.step.hooks import GradientPipeline
from tfdist.step.preemption import take_advance, warn_if_unrestorable, watch_input
from tfdist.step.variables import trained_variables
from tfdist.strategies.kind import capabilities_of
from tfdist.strategies.task import is_chief
from tfdist.training.data import distribute, steps_per_epoch_of
from tfdist.training.losses import as_loss, as_metric, in_scope
from tfdist.training.step_functions import StepFunctions
from tfdist.versions import KERAS_FIX, UnsupportedVersionError


class Trainer:
    """Trains a Keras 3 model with `tf.GradientTape` under any tf.distribute strategy.

    The loop is the one users write by hand (compute the loss, take gradients, exchange
    them across replicas, apply them), with Keras' conveniences around it: callbacks,
    History, a progress bar, validation. Under ParameterServerStrategy the steps are
    scheduled on the workers through `ClusterCoordinator` and counted by the trainer.
    The hooks run as under `model.fit` (`tfdist.step.hooks`): before validation, at
    the end of every epoch and of training they make one model of the replicas (local
    SGD averages; per-replica BatchNormalization statistics are averaged), so validation,
    checkpoints and the final model see one model. Under parameter servers, whose steps
    run asynchronously on the workers, `after_step` runs once per epoch.

    Args:
        model: a built Keras 3 model (created under `strategy.scope()`).
        optimizer: a Keras optimizer (instance or name), not yet built; the trainer uses a
            copy whose gradient exchange runs `hooks` — or a `DistributedOptimizer`,
            used as it is (with `hooks` added to its own); also inside a
            `LossScaleOptimizer`. Under a mixed_float16 model the trainer scales the loss
            dynamically, as `model.compile` does (`tfdist.seam.loss_scale`): a step whose
            scaled gradients overflow on any replica is skipped everywhere and counts in
            no metric.
        loss: a Keras loss (instance or name) or a function ``loss(y_true, y_pred)``.
        strategy: defaults to the strategy in scope.
        metrics: Keras metrics (instances or names). One created outside the strategy's
            scope is re-created inside it from its config (`Trainer.metrics` holds it),
            so that it sums over every replica and worker. Each step reads them all with
            one all-reduce.
        hooks: `TrainingHook`s around the gradient exchange and at step end.

    Attributes:
        metrics: the metrics, as used (see `metrics`).
        completed_steps: training steps finished so far (exact under every strategy).
        variables: what the optimizer updates (the trainable variables; the shards of a
            sharded one).

    A step is a transaction: if a gradient on any replica of any worker is NaN or Inf,
    the step changes nothing — weights, optimizer state, hooks' state, the model's
    non-trainable state (BatchNormalization statistics), the step count — on any replica,
    and raises `tf.errors.InvalidArgumentError` saying so.
    """

    def __init__(self, model, optimizer, loss, strategy=None, metrics=None, hooks=()):
        self.strategy = strategy or tf.distribute.get_strategy()
        if not model.built:
            raise ValueError("the model must be built before training: give it a keras.Input "
                             f"or call model.build(input_shape). Received: model={model.name}")
        self.model = model
        self.loss = as_loss(loss)
        self.coordinator = None
        if capabilities_of(self.strategy).coordinator:
            self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        else:
            check_loss_scaling(self.strategy)
        with self.strategy.scope():
            self.optimizer = _routed(optimizer, hooks)
            if model.dtype_policy.name == "mixed_float16" and not is_loss_scale(self.optimizer):
                self.optimizer = LossScaleOptimizer(self.optimizer)  # as model.compile does
            self.pipeline = pipeline_of(self.optimizer)
            self.variables = trained_variables(model)
            self.optimizer.build(self.variables)  # builds the hooks too
            self.loss_tracker = keras.metrics.Mean(name="loss")
            shared = self.strategy.num_replicas_in_sync > 1 or self.coordinator is not None
            made = [as_metric(m, self.loss, model) for m in metrics or []]
            self.metrics = [in_scope(m, self.strategy) if shared else m for m in made]
        model.optimizer = self.optimizer
        self.completed_steps, self._waiting = 0, None  # a batch a skipped call left
        self.runner = StepRunner(model, self.optimizer)
        self._steps = StepFunctions(self)  # the compiled steps
        self._test_function = self._steps.test()

    @property
    def driver(self):
        """The runner's `HookDriver`."""
        return self.runner.driver

    def _make_train_function(self):
        """The training step, compiled for the hooks' phase (`StepFunctions.train`)."""
        return self._steps.train()

    # --- the loops --------------------------------------------------------------------

    def fit(self, dataset_or_fn, epochs=1, steps_per_epoch=None, validation_data=None,
            validation_steps=None, callbacks=None, verbose="auto", initial_epoch=0):
        """Trains for `epochs` epochs, like `keras.Model.fit`.

        Args:
            dataset_or_fn: a `tf.data.Dataset` of ``(x, y[, sample_weight])`` batched to
                the global batch size, or a function of a `tf.distribute.InputContext`
                returning the per-replica batched dataset (see `tfdist.training.data`).
            epochs: index of the last epoch (as in Keras, with `initial_epoch`).
            steps_per_epoch: steps per epoch; None runs each epoch until the data ends
                (required under ParameterServerStrategy, whose datasets repeat).
            validation_data, validation_steps: evaluated after each epoch; metrics are
                logged with a ``val_`` prefix.
            callbacks: Keras callbacks; `tfdist.callbacks` adds multi-worker-safe ones
                (`TrainingHooks` is left out: the trainer drives the hooks itself).
            verbose: 0, 1 (progress bar) or "auto" (1 on the chief only).

        Returns:
            The `keras.callbacks.History` of the run.
        """
        check_arguments("Trainer.fit", _COUNTS, epochs=epochs, initial_epoch=initial_epoch)
        verbose = self._verbose(verbose)
        train_data = self._distribute(dataset_or_fn, steps_per_epoch, "steps_per_epoch")
        val_data = None if validation_data is None else self._distribute(
            validation_data, validation_steps, "validation_steps")
        callbacks = self._callbacks(callbacks, dataset_or_fn, verbose, epochs, steps_per_epoch)
        self.model.stop_training = False
        callbacks.on_train_begin()
        initial_epoch = getattr(self.model, "_initial_epoch", None) or initial_epoch
        self.runner.plan(_planned_steps(dataset_or_fn, steps_per_epoch, epochs - initial_epoch))
        self._start_reading(train_data)
        logs = {}
        for epoch in range(initial_epoch, epochs):
            logs = self._epoch(epoch, train_data, steps_per_epoch, val_data, validation_steps,
                               callbacks)
            if self.model.stop_training:
                break
        self.runner.before_read()
        callbacks.on_train_end(logs)
        return self.model.history

    def _start_reading(self, train_data):
        """A new iterator over the training data, told to a backup's input position
        (`watch_input`), advanced past the batches a resumed run already trained."""
        self._iterator, self._waiting = iter(train_data), None
        self._reads = 0  # batches the current iterator yielded (a backup's input position)
        watch_input(self.model, lambda: (self._reads, True))  # renewed before an epoch ends
        if self.coordinator is None:
            self._read_ahead(self._iterator, take_advance(self.model))

    def _callbacks(self, callbacks, dataset_or_fn, verbose, epochs, steps_per_epoch):
        """The run's `CallbackList` (without `TrainingHooks`: the trainer drives the hooks)."""
        callbacks = [c for c in callbacks or [] if not isinstance(c, RunsHooks)]
        if any(isinstance(c, keras.callbacks.BackupAndRestore) for c in callbacks):
            warn_if_unrestorable(dataset_or_fn)
        return keras.callbacks.CallbackList(
            callbacks, add_history=True, add_progbar=verbose != 0, model=self.model,
            verbose=verbose, epochs=epochs, steps=steps_per_epoch)

    def _epoch(self, epoch, train_data, steps_per_epoch, val_data, validation_steps,
               callbacks):
        """One epoch's steps, validation and callbacks; returns its logs."""
        self._reset_metrics()
        callbacks.on_epoch_begin(epoch)
        loss_scale = LossScaleLog()  # mixed precision's figures, in the History
        loss_scale.begin(self.model)
        steps, exhausted = self._run_steps(True, self._iterator, steps_per_epoch,
                                           callbacks.on_train_batch_begin,
                                           callbacks.on_train_batch_end, epoch)
        loss_scale.trained(steps)
        if exhausted:
            if steps == 0:
                raise ValueError("the training dataset yielded no batch; check that it is "
                                 "not empty and that each worker's shard has a full batch")
            self._iterator, self._reads = iter(train_data), 0
        self.completed_steps += steps
        logs = {**self._logs(), **loss_scale.figures(self.model)}
        if val_data is not None:
            val_logs = self._evaluate(val_data, validation_steps, callbacks, verbose=0)
            logs.update({f"val_{k}": v for k, v in val_logs.items()})
        self.runner.before_read()  # one model for the epoch's end (as under fit)
        callbacks.on_epoch_end(epoch, logs)
        return logs

    def evaluate(self, dataset_or_fn, steps=None, callbacks=None, verbose="auto"):
        """Evaluates loss and metrics; returns ``{name: value}``."""
        verbose = self._verbose(verbose)
        data = self._distribute(dataset_or_fn, steps, "steps")
        callbacks = keras.callbacks.CallbackList(
            callbacks, add_progbar=verbose != 0, model=self.model, verbose=verbose,
            epochs=1, steps=steps)
        return self._evaluate(data, steps, callbacks, verbose)

    def _evaluate(self, data, steps, callbacks, verbose):
        self.runner.before_read()
        self._reset_metrics()
        callbacks.on_test_begin()
        self._run_steps(False, iter(data), steps,
                        callbacks.on_test_batch_begin, callbacks.on_test_batch_end)
        logs = self._logs()
        callbacks.on_test_end(logs)
        return logs

    def _run_steps(self, training, iterator, steps, on_begin, on_end, epoch=None):
        """Runs up to `steps` steps (all the data if None); returns (steps run, exhausted)."""
        loop = _CoordinatedSteps if self.coordinator is not None else _Steps
        return loop(self, training).run(iterator, steps, on_begin, on_end, epoch)

    # --- helpers ----------------------------------------------------------------------

    def _read_ahead(self, iterator, count):
        """Reads and drops `count` batches (trained before a preemption); False if the
        data ended first."""
        for _ in range(count):
            try:
                next(iterator)
            except (tf.errors.OutOfRangeError, StopIteration):
                return False
            self._reads += 1
        return True

    def _logs(self):
        return {name: float(value) for name, value in self._steps.results().items()}

    def _reset_metrics(self):
        for metric in [self.loss_tracker, *self.metrics]:
            metric.reset_state()

    def _verbose(self, verbose):
        if verbose not in ("auto", 0, 1, 2) or isinstance(verbose, bool):
            raise ValueError(f"verbose must be 0, 1, 2 or 'auto'. Received: verbose={verbose!r}")
        return (1 if is_chief(self.strategy) else 0) if verbose == "auto" else verbose

    def _distribute(self, dataset_or_fn, steps, name):
        """`dataset_or_fn` distributed for the strategy, once its `steps` (argument `name`)
        are checked."""
        if steps is not None:
            check_arguments("Trainer", {name: _STEPS}, **{name: steps})
        if steps is None and self.coordinator is not None:
            raise ValueError(f"under ParameterServerStrategy, give {name}: workers read "
                             "repeated per-worker datasets, so an epoch has no natural end")
        return distribute(self.strategy, dataset_or_fn, self.coordinator)


_COUNTS = {"epochs": functools.partial(checks.integer, minimum=0),
           "initial_epoch": functools.partial(checks.integer, minimum=0)}
_STEPS = functools.partial(checks.integer, minimum=1)


def _planned_steps(dataset_or_fn, steps_per_epoch, epochs):
    """The steps `epochs` epochs train (None: unknown, the data's end ends each epoch)."""
    steps = steps_per_epoch_of(dataset_or_fn, steps_per_epoch)
    return None if steps is None else max(epochs, 0) * steps


class _Steps:
    """The synchronous loop: each step call reads its batch, then is run and ended by the
    runner's rules (`tfdist.loop.runner`), so a loop that reads until the data ends
    begins no call past it. A call that trained before the preemption this run resumes
    from reads its batch and drops it; a slower island's call leaves its batch to the
    next one (`Trainer._waiting`; counted as read when it trains: a backup meanwhile
    resumes with it)."""

    def __init__(self, trainer, training):
        self.trainer, self.training = trainer, training

    def run(self, iterator, steps, on_begin, on_end, epoch):
        trainer, runner, done = self.trainer, self.trainer.runner, 0
        for batch in range(steps) if steps is not None else itertools.count():
            on_begin(batch)
            if self.training and runner.trained_before(epoch, batch):
                if not trainer._read_ahead(iterator, 1):
                    return done, True
                on_end(batch, {})
                continue
            data = self._next(iterator)
            if data is None:
                return done, True
            logs = self._step(data, iterator) if self.training else trainer._test_function(data)
            done += 1
            on_end(batch, logs)
        return done, False

    def _next(self, iterator):
        """The call's batch: the one a slower island's call left, else the next one read
        (None: the data ended)."""
        if self.training and self.trainer._waiting is not None:
            return self.trainer._waiting
        try:
            return next(iterator)
        except (tf.errors.OutOfRangeError, StopIteration):
            return None

    def _step(self, data, iterator):
        """One training step call on `data` of `iterator`; returns its logs."""
        trainer, runner = self.trainer, self.trainer.runner
        call = runner.begin(trainer._make_train_function)
        if runner.apart:  # islands apart: a finite dataset couples the workers
            runner.check_input(iterator)
        logs, trainer._waiting = {}, None
        if call is NOTHING:  # a slower island: the batch waits for the next call
            trainer._waiting = data
        else:
            trainer._reads += 1
            logs = call(data)
        runner.end(call)
        return logs


class _CoordinatedSteps(_Steps):
    """Under parameter servers: each step scheduled on a worker (`ClusterCoordinator`),
    its results kept there until the epoch ends; the steps ran asynchronously, so the
    hooks' `after_step` runs once, after them."""

    def run(self, iterator, steps, on_begin, on_end, epoch):
        trainer, runner, call = self.trainer, self.trainer.runner, None
        for batch in range(steps):
            on_begin(batch)
            if self.training:  # the step of the hooks' phase at its scheduling
                call = runner.begin(trainer._make_train_function)
                call.schedule(trainer.coordinator, (iterator,))
            else:
                trainer.coordinator.schedule(trainer._test_function, args=(iterator,))
            on_end(batch, {})
        trainer.coordinator.join()
        if self.training and steps:
            runner.end(call)
        return steps, False


def _routed(optimizer, hooks):
    """`optimizer` as a routed optimizer whose pipeline holds `hooks` (see `Trainer`); a
    `LossScaleOptimizer` stays around the routed one."""
    pipeline = pipeline_of(optimizer)
    if pipeline is None:
        return with_gradient_pipeline(optimizer, GradientPipeline(hooks))
    if optimizer.built:
        raise ValueError("the optimizer already has variables; pass a fresh optimizer so "
                         f"its state is created under the strategy scope. Received: {optimizer}")
    for hook in hooks:
        pipeline.add(hook)
    return optimizer


_LOSS_SCALING_SEEN = []  # True once a Keras loss was seen to scale on several replicas


def check_loss_scaling(strategy):
    """Checks, once per process on a strategy with several replicas, that a Keras loss
    returns each replica's share (1/N) in replica context, as `StepFunctions._scaled_loss` relies on
    (Keras 3.7 and older returned the full loss: the Trainer would sum N gradients).

    Raises:
        UnsupportedVersionError: the loss is not divided by the number of replicas.
    """
    replicas = strategy.num_replicas_in_sync
    if _LOSS_SCALING_SEEN or replicas < 2:
        return
    share = strategy.run(lambda: keras.losses.MeanSquaredError()(tf.ones((1, 1)),
                                                                 tf.zeros((1, 1))))
    values = [float(v) for v in strategy.experimental_local_results(share)]
    if any(abs(v * replicas - 1) > 1e-6 for v in values):
        raise UnsupportedVersionError(
            f"Keras {keras.__version__}'s losses return {values[0]:g} of a loss of 1 on each of "
            f"{replicas} replicas, not 1/{replicas}: tfdist.Trainer would add up {replicas} "
            f"full gradients; {KERAS_FIX}")
    _LOSS_SCALING_SEEN.append(True)
