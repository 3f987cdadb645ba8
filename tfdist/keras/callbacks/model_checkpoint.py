"""`ModelCheckpoint` that saves on the chief only."""

import keras

from tfdist.keras.callbacks.worker_scratch import WorkerScratch, strategy_of
from tfdist.keras.written import writing
from tfdist.loop.driver import before_read
from tfdist.strategies.task import chief_wrote


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras' `ModelCheckpoint`, writing `filepath` from the chief only.

    Other workers still save (every worker takes part, as distributed variables may
    need it) but into a temporary directory removed at the end of training, so workers
    never race on the same file. Under local SGD the replicas are averaged before
    each save, so a checkpoint holds one model. `fit` returns on no worker before the
    chief's last write is complete (`tfdist.strategies.barrier`), so every worker may read
    the checkpoint right after it (TensorFlow's tutorial: `load_weights`, `evaluate`);
    the chief does not wait for the others (`chief_wrote`: given to the chief alone, as
    Horovod scripts do, it costs nothing).
    Arguments as in Keras.
    """

    def __init__(self, filepath, **kwargs):
        super().__init__(filepath, **kwargs)
        self._chief_filepath = self.filepath
        self._scratch = WorkerScratch(self._chief_filepath)

    def on_train_begin(self, logs=None):
        if self._scratch.create(strategy_of(self.model)) is not None:
            self.filepath = self._scratch.redirect(self._chief_filepath)
        super().on_train_begin(logs)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        self._scratch.cleanup()
        self.filepath = self._chief_filepath
        chief_wrote(strategy_of(self.model), self._chief_filepath)  # others wait for it

    def _save_model(self, epoch, batch, logs):
        before_read(self.model)
        with writing("tfdist.callbacks.ModelCheckpoint", self._get_file_path(epoch, batch, logs),
                     "this checkpoint is not written (the earlier ones are kept)"):
            super()._save_model(epoch, batch, logs)
