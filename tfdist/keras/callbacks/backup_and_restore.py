"""`BackupAndRestore` that several workers can share and a kill cannot break."""

import os

import keras

from tfdist.checkpoint import CheckpointError, CheckpointStore
from tfdist.core.driver import before_read
from tfdist.keras.callbacks.worker_scratch import WorkerScratch, strategy_of

WEIGHTS = "backup.weights.h5"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras' `BackupAndRestore`, safe when every worker of a job uses the same `backup_dir`,
    and atomic.

    Keras' callback lets each worker write the backup itself, so two workers sharing a
    directory crash (file lock, FileExistsError), and it overwrites the backup in place, so
    a kill during a save leaves a truncated file as the only backup. Here the chief owns
    `backup_dir`: every worker restores from it (so all start from the same state), only
    the chief writes it, and the other workers write theirs to a temporary directory that
    is removed at the end of training. Each backup is a `tfdist.checkpoint.CheckpointStore`
    checkpoint: written apart, made durable, then switched to, the previous one kept until
    then — a kill at any moment leaves a good backup. A backup that cannot be read is
    named in one line and the previous one used; one that does not fit the model, or
    claims more epochs than this run has, is an error that says so. A job killed
    mid-epoch and relaunched resumes after the last completed epoch (or the last
    `save_freq` batch). Under local SGD the replicas are averaged before each backup.

    Works with `model.fit` and `tfdist.Trainer`. Arguments as in Keras
    (`double_checkpoint` is always on: the previous backup is kept).
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=True,
                 delete_checkpoint=True):
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        self._chief_dir = backup_dir
        self._store = CheckpointStore(backup_dir)
        self._scratch = WorkerScratch(backup_dir)

    def on_train_begin(self, logs=None):
        self._store = CheckpointStore(self._chief_dir)
        self._load_model()  # restore from the chief's backup, on every worker
        scratch = self._scratch.create(strategy_of(self.model))
        if scratch is not None:
            self._store = CheckpointStore(scratch)

    def on_train_end(self, logs=None):
        if self._scratch.path is None and self.delete_checkpoint:
            self._store.remove()
        self._scratch.cleanup()
        self._store = CheckpointStore(self._chief_dir)

    def _save_model(self):
        before_read(self.model)
        metadata = {"epoch": self._current_epoch, "batch": self._last_batch_seen,
                    "epochs": self.params.get("epochs") if self.params else None}
        self._store.save(lambda path: self.model.save_weights(os.path.join(path, WEIGHTS)),
                         metadata)

    def _load_model(self):
        if not self.model.built:
            raise ValueError("To use the BackupAndRestore callback, your model must be built "
                             f"before you call fit(). Received: model={self.model.name}")
        loaded = self._store.load(self._read)
        if loaded is not None:
            self.model._initial_epoch = loaded[1]["epoch"]

    def _read(self, path, metadata):
        """Loads the backup at `path` into the model, if it fits this run."""
        epochs = self.params.get("epochs") if self.params else None
        epoch = metadata.get("epoch")
        if not isinstance(epoch, int) or epoch < 0 or (epochs is not None and epoch > epochs):
            raise CheckpointError(
                f"the backup {path} is of epoch {epoch!r}, but this training runs "
                f"{epochs} epochs: it belongs to another run. Remove {self._chief_dir} "
                "or give another backup_dir")
        if epoch == epochs:
            print(f"tfdist: the backup {path} is of the last epoch ({epoch} of {epochs}): "
                  "nothing is left to train", flush=True)
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        try:
            self.model.load_weights(os.path.join(path, WEIGHTS))
        except ValueError as error:
            raise CheckpointError(f"the backup {path} does not fit this model: "
                                  f"{' '.join(str(error).split())[:300]}") from None
