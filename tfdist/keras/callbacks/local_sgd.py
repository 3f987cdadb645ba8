"""`LocalSGD`: periodic model averaging for `model.fit`."""

from tfdist.keras.callbacks.hook_phases import HookPhases
from tfdist.keras.callbacks.worker_scratch import strategy_of
from tfdist.keras.optimizer import add_hook
from tfdist.local_sgd import ModelAverager


class LocalSGD(HookPhases):
    """Local SGD under `model.fit`: `period` local steps, then one model average.

        model.fit(data, callbacks=[tfdist.callbacks.LocalSGD(period=8, warmup_steps=100)])

    At the start of training the model's optimizer is routed through tfdist's gradient
    seam (in place; its class becomes tfdist's subclass of its own class), so between
    averages no gradient is exchanged. Validation, `tfdist.callbacks.ModelCheckpoint`,
    `BackupAndRestore`, the end of each epoch and of training all see averaged weights.
    Includes `HookPhases` (the warm-up is synchronous). Arguments as `ModelAverager`;
    `from_config` takes the config's `local_sgd:` section.
    """

    def __init__(self, period, warmup_steps=0, average_non_trainable=False,
                 average_optimizer_state=False, compression=None):
        super().__init__()
        self.averager = ModelAverager(period, warmup_steps, average_non_trainable,
                                      average_optimizer_state, compression)

    @classmethod
    def from_config(cls, config, **overrides):
        return cls(**{**vars(config), **overrides})

    def on_train_begin(self, logs=None):
        add_hook(self.model.optimizer, self.averager, strategy_of(self.model))
        super().on_train_begin(logs)

    def on_train_batch_end(self, batch, logs=None):
        self.averager.after_step(self.model, int(self.model.optimizer.iterations.numpy()))

    def on_test_begin(self, logs=None):
        self.averager.before_read(self.model)

    def on_epoch_end(self, epoch, logs=None):
        self.averager.before_read(self.model)

    def on_train_end(self, logs=None):
        self.averager.before_read(self.model)
