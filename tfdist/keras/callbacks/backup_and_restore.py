"""`BackupAndRestore` that several workers can share."""

import keras

from tfdist.keras.callbacks.worker_scratch import WorkerScratch, strategy_of
from tfdist.core.driver import before_read


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras' `BackupAndRestore`, safe when every worker of a job uses the same `backup_dir`.

    Keras' callback lets each worker write the backup itself, so two workers sharing a
    directory crash (file lock, FileExistsError). Here the chief owns `backup_dir`:
    every worker restores from it (so all start from the same state), only the chief
    writes it, and the other workers write their backups to a temporary directory that
    is removed at the end of training. A job killed mid-epoch and relaunched resumes
    after the last completed epoch (or the last `save_freq` batch). Under local SGD the
    replicas are averaged before each backup.

    Works with `model.fit` and `tfdist.Trainer`. Arguments as in Keras.
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False,
                 delete_checkpoint=True):
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        self._chief_dir = backup_dir
        self._scratch = WorkerScratch(backup_dir)

    def on_train_begin(self, logs=None):
        self._point_to(self._chief_dir)
        super().on_train_begin(logs)  # restore from the chief's backup, on every worker
        scratch = self._scratch.create(strategy_of(self.model))
        if scratch is not None:
            self._point_to(scratch)

    def on_train_end(self, logs=None):
        if self._scratch.path is None:
            super().on_train_end(logs)
        self._scratch.cleanup()
        self._point_to(self._chief_dir)

    def _save_model(self):
        before_read(self.model)
        super()._save_model()

    def _point_to(self, directory):
        """Aims every path of Keras' callback at `directory`."""
        fresh = keras.callbacks.BackupAndRestore(directory)
        self.backup_dir = directory
        self._weights_path = fresh._weights_path
        self._training_metadata_path = fresh._training_metadata_path
        self._prev_weights_path = fresh._prev_weights_path
        self._prev_training_metadata_path = fresh._prev_training_metadata_path
