"""`TrainingHooks`: runs the hooks of tfdist's pipeline under `model.fit`."""

import functools

import keras
import tensorflow as tf

from tfdist.errors import UnsupportedError
from tfdist.keras.callbacks.loss_scale_log import LossScaleLog
from tfdist.loop.runner import NOTHING, RunsHooks, StepRunner, check_input
from tfdist.seam.owned import optimizers_of
from tfdist.step.tracing import plain_function


class TrainingHooks(RunsHooks, keras.callbacks.Callback):
    """Calls the Python side of the model optimizer's hooks (`tfdist.TrainingHook`) at the
    moments `tfdist.Trainer` and `tfdist.function` call them: each step gets the train
    step traced for the hooks' phase (a delayed start, local SGD's warm-up, gradient
    accumulation: collectives cannot be switched inside one compiled step), then
    `after_step`; validation, the end of each epoch and of training get `before_read`
    (local SGD averages, per-replica BatchNormalization statistics are averaged).

        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(), "topk",
                                                        start_step=100), loss)
        model.fit(data, callbacks=[tfdist.callbacks.TrainingHooks(), ...])

    It drives every tfdist optimizer the model trains with (`tfdist.seam.owned`): the
    compiled one, also inside a `LossScaleOptimizer` (mixed_float16), and each one a custom
    `train_step` keeps as an attribute of the model (a GAN's two), each switching phase at
    its own step. Put it before callbacks that save or evaluate the model. It does nothing
    for a model without a tfdist optimizer; `tfdist.Trainer` ignores it (it drives the
    hooks itself), so one callback list serves both loops.

    Under mixed precision each epoch's logs (fit's History) get ``loss_scale`` and
    ``skipped_steps`` (`LossScaleLog`), with a tfdist optimizer or Keras' own.
    """

    def __init__(self):
        super().__init__()
        self.runner, self.epoch, self._planned = None, 0, False
        self._logs = {}  # the last trained step's logs (a call that trains nothing gives them)
        self._loss_scale = LossScaleLog()

    def on_train_begin(self, logs=None):
        optimizers = optimizers_of(self.model)
        if not optimizers:
            self.runner = None
        elif (self.runner is None or self.runner.driver.optimizers != optimizers
              or not self.runner.driver.owns(self.model.train_function)):
            self.runner = StepRunner(self.model)  # first fit, or compiled again
        self._planned = False

    @property
    def driver(self):
        """The runner's `HookDriver` (None for a model without a tfdist optimizer)."""
        return None if self.runner is None else self.runner.driver

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self._loss_scale.begin(self.model)

    def on_train_batch_begin(self, batch, logs=None):
        # fit reads `train_function` at every step; a step that trained before a
        # preemption is left to BackupAndRestore, which reads its data and drops it
        if self.runner is None:
            return
        if not self._planned:  # after a backup's restore
            self.runner.plan(_calls_left(self.params, self.epoch, batch))
            self._planned = True
        if not self.runner.trained_before(self.epoch, batch):
            call = self.runner.begin(self._make_train_function)
            self.model.train_function = self._train_nothing if call is NOTHING else call

    def on_train_batch_end(self, batch, logs=None):
        self._logs = logs if logs else self._logs
        self._loss_scale.step(self.model, self.epoch, batch)
        if self.runner is not None and not self.runner.trained_before(self.epoch, batch):
            self.runner.end(self.model.train_function)

    def on_test_begin(self, logs=None):
        self._before_read()

    def on_epoch_end(self, epoch, logs=None):
        self._before_read()
        if logs is not None:
            logs.update(self._loss_scale.figures(self.model))

    def on_train_end(self, logs=None):
        self._before_read()

    def _before_read(self):
        if self.runner is not None:
            self.runner.before_read()

    def _make_train_function(self):
        if not self.runner.apart:
            self.model.make_train_function(force=True)
            return self.model.train_function
        return _train_function_apart(self.model, self.runner.paced)

    def _train_nothing(self, iterator):
        """fit's step for a call that trains nothing: no batch is read (the next trained
        call takes it: a slower island wastes no input work), and the logs are the last
        trained step's (with their keys, fit reads the epoch's metrics over every worker
        at its end)."""
        return self._logs


def _calls_left(params, epoch, batch):
    """fit's step calls from `batch` of `epoch` to its end (None: steps not known)."""
    steps, epochs = params.get("steps"), params.get("epochs")
    if not steps or epochs is None:
        return None
    return max((epochs - epoch) * steps - batch, 0)


class HookPhases(TrainingHooks):
    """The former name of `TrainingHooks` (kept for existing scripts)."""


def _train_function_apart(model, paced=False):
    """fit's step for islands between synchronisations: Keras' own `train_step` on each
    replica, its logs this worker's first replica's — Keras' step would reduce them over
    every worker (`reduce_per_replica`), a collective across islands at every step. fit
    reads the epoch's metrics over every worker at its end (their keys match)."""
    if getattr(model, "steps_per_execution", 1) != 1:
        raise UnsupportedError(
            "islands between synchronisations run one step per call of fit's step: "
            "compile with steps_per_execution=1. Received: "
            f"steps_per_execution={model.steps_per_execution}")
    strategy = model.distribute_strategy

    @functools.partial(plain_function, reduce_retracing=True)  # as fit's: train_step as written
    def step(iterator):
        outputs = strategy.run(model.train_step, args=(next(iterator),))
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0],
                                     outputs)

    def train_function(iterator):
        check_input(iterator, paced)
        return step(iterator)

    return train_function
