"""`LocalSGD`: periodic model averaging for `model.fit` with any optimizer."""

from tfdist.keras.callbacks.training_hooks import TrainingHooks
from tfdist.keras.callbacks.worker_scratch import strategy_of
from tfdist.local_sgd import ModelAverager
from tfdist.seam.optimizer import with_hook


class LocalSGD(TrainingHooks):
    """Local SGD under `model.fit`: `period` local steps, then one model average.

        model.fit(data, callbacks=[tfdist.callbacks.LocalSGD(period=8, warmup_steps=100)])

    `TrainingHooks` with a `ModelAverager` added to the optimizer's pipeline; the same
    averager works in `tfdist.Trainer` and your own loop as a hook. A plain Keras
    optimizer is replaced, at the start of training, by a copy routed through tfdist
    that takes over its state (the model's `optimizer` attribute then points to it).
    Arguments as `ModelAverager` (`outer`, `fragments`, `overlap_steps`: DiLoCo and
    Streaming DiLoCo); `from_config` takes the config's `local_sgd:` section.
    """

    def __init__(self, period, warmup_steps=0, **options):
        super().__init__()
        self.averager = ModelAverager(period, warmup_steps, **options)

    @classmethod
    def from_config(cls, config, **overrides):
        return cls(**{**vars(config), **overrides})

    def set_model(self, model):
        """Adds the averager as soon as fit hands over the model, before any callback's
        `on_train_begin`: a `BackupAndRestore` listed first restores its state too."""
        super().set_model(model)
        self._add_averager()

    def on_train_begin(self, logs=None):
        self._add_averager()  # compiled again since
        super().on_train_begin(logs)

    def _add_averager(self):
        if getattr(self.model, "optimizer", None) is not None:
            self.model.optimizer = with_hook(self.model.optimizer, self.averager,
                                             strategy_of(self.model))
