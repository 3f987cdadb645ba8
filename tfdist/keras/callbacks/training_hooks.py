"""`TrainingHooks`: runs the hooks of tfdist's pipeline under `model.fit`."""

import keras

from tfdist.core.driver import HookDriver
from tfdist.core.owned import optimizers_of
from tfdist.core.preemption import skipping


class TrainingHooks(keras.callbacks.Callback):
    """Calls the Python side of the model optimizer's hooks (`tfdist.TrainingHook`) at the
    moments `tfdist.Trainer` and `tfdist.function` call them: each step gets the train
    step traced for the hooks' phase (a delayed start, local SGD's warm-up, gradient
    accumulation: collectives cannot be switched inside one compiled step), then
    `after_step`; validation, the end of each epoch and of training get `before_read`
    (local SGD averages, per-replica BatchNormalization statistics are averaged).

        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(), "topk",
                                                        start_step=100), loss)
        model.fit(data, callbacks=[tfdist.callbacks.TrainingHooks(), ...])

    It drives every tfdist optimizer the model trains with (`tfdist.core.owned`): the
    compiled one, also inside a `LossScaleOptimizer` (mixed_float16), and each one a custom
    `train_step` keeps as an attribute of the model (a GAN's two), each switching phase at
    its own step. Put it before callbacks that save or evaluate the model. It does nothing
    for a model without a tfdist optimizer; `tfdist.Trainer` ignores it (it drives the
    hooks itself), so one callback list serves both loops.
    """

    def __init__(self):
        super().__init__()
        self.driver, self.epoch = None, 0

    def on_train_begin(self, logs=None):
        optimizers = optimizers_of(self.model)
        if not optimizers:
            self.driver = None
        elif (self.driver is None or self.driver.optimizers != optimizers
              or not self.driver.owns(self.model.train_function)):
            self.driver = HookDriver(self.model)  # first fit, or compiled again

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        # fit reads `train_function` at every step; a step that trained before a
        # preemption is left to BackupAndRestore, which reads its data and drops it
        if self.driver is not None and not skipping(self.model, self.epoch, batch):
            self.model.train_function = self.driver.function(self._make_train_function)

    def on_train_batch_end(self, batch, logs=None):
        if self.driver is not None and not skipping(self.model, self.epoch, batch):
            self.driver.end_step()

    def on_test_begin(self, logs=None):
        self._before_read()

    def on_epoch_end(self, epoch, logs=None):
        self._before_read()

    def on_train_end(self, logs=None):
        self._before_read()

    def _before_read(self):
        if self.driver is not None:
            self.driver.before_read()

    def _make_train_function(self):
        self.model.make_train_function(force=True)
        return self.model.train_function


class HookPhases(TrainingHooks):
    """The former name of `TrainingHooks` (kept for existing scripts)."""
