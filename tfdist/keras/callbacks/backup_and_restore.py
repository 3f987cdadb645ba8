"""`BackupAndRestore` that several workers can share and a kill cannot break."""

import functools
import sys

import keras

from tfdist.checkpoint import CheckpointError, CheckpointStore
from tfdist.keras.backup import MAX_STEPS, capture, check_json, describe_run, restore
from tfdist.keras.callbacks.worker_scratch import WorkerScratch, strategy_of
from tfdist.keras.written import writing
from tfdist.seam.loss_scale import inner_of
from tfdist.seam.optimizer import is_routed
from tfdist.seam.owned import optimizers_of
from tfdist.step.preemption import (Preempted, input_position, preemption, resume_at,
                                    seconds_since_signal, skipping, take_advance,
                                    warn_if_unrestorable, watch_input)
from tfdist.strategies.kind import capabilities_of
from tfdist.strategies.task import barrier

CALLER = "tfdist.callbacks.BackupAndRestore"
BACKUP_NOT_WRITTEN = "this backup is not written (the last complete one is kept)"



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
    `save_freq` batch). Each replica's own state — the exchange's (error-feedback
    residuals, PowerSGD's P and Q) and, under local SGD and DiLoCo, its weights, optimizer
    slots and the anchors, apart between two synchronisations — is gathered from every
    replica of every worker into the backup and given back to each on restore, so a
    resumed run goes on exactly as an uninterrupted one; `compression: auto` resumes with
    its kept choice, local SGD with its schedule (`TrainingHook.checkpoint_state`).

    **Preemption** (`preemption=True`): a SIGTERM to any one task — Kubernetes evicting a
    pod, SLURM preempting, a spot VM reclaimed — rides the next step's all-reduce to every
    worker (`tfdist.step.preemption`); all save a backup after that same step and exit with
    code 143 (`Preempted`). The relaunched job restores it and skips the data of the steps
    of that epoch that already trained: every step trains exactly once, when each epoch's
    data comes in the same order (a dataset reshuffled per epoch gets a new order after a
    restart: the steps still run once, on other batches).

    **One run per `backup_dir`**, which may hold your other files: tfdist writes there only
    `checkpoint-<n>/`, `latest`, `run.json`, `.lock` and temporary names, and removes only
    those. Every backup names its run (`tfdist.keras.backup.describe_run`: the model's
    structure and `run`, by default the command line): a run that finds another run's
    backups stops in one line saying whose they are; the chief holds the directory's lock
    while it trains, so a second run at the same time is refused (a killed run holds no
    lock). A finished run removes its backups (`delete_checkpoint=True`) or leaves its
    final one (`False`: the same command then has nothing left to train).

    Works with `model.fit` and `tfdist.Trainer`. Arguments as in Keras
    (`double_checkpoint` is always on: the previous backup is kept), and `run` (your name
    for this run: a string or JSON values; default: the command line).
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=True,
                 delete_checkpoint=True, preemption=True, run=None):
        _check_arguments(backup_dir, save_freq, double_checkpoint, delete_checkpoint,
                         preemption, run)
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        self._chief_dir, self.run = backup_dir, run
        self._store = CheckpointStore(backup_dir)
        self._scratch = WorkerScratch(backup_dir)
        self.preemption = preemption
        self._epoch, self._keras_function, self._done_in_epoch = 0, None, 0
        self._watching = self._rides = False

    def on_train_begin(self, logs=None):
        if not self.model.built:
            raise ValueError("To use the BackupAndRestore callback, your model must be built "
                             f"before you call fit(). Received: model={self.model.name}")
        strategy = strategy_of(self.model)
        epoch_iterator = keras_epoch_iterator()  # None under tfdist.Trainer (it says itself)
        watch_input(self.model, None if epoch_iterator is None
                    else functools.partial(keras_input_position, epoch_iterator))
        self._epoch_iterator, self._at_epoch_end = epoch_iterator, False
        self._stop_after_epoch = None  # a stop agreed at an epoch's end: where
        if epoch_iterator is not None:
            warn_if_unrestorable(keras_input_dataset(epoch_iterator))
        self._store = CheckpointStore(self._chief_dir,
                                      run=describe_run(self.model, self.run))
        scratch = self._scratch.create(strategy)
        if scratch is None:
            self._store.claim()  # the chief writes: this run's, and nobody else's meanwhile
        self._load_model()  # restore from the chief's backup, on every worker
        if scratch is not None:
            self._store = CheckpointStore(scratch)
        self._watching = self.preemption and not capabilities_of(strategy).coordinator
        if self._watching:
            preemption().install()
            preemption().watch(strategy)
        # a tfdist optimizer's step carries the flag; Keras' own needs a check of its own
        self._rides = bool(optimizers_of(self.model)) and is_routed(
            inner_of(getattr(self.model, "optimizer", None)))

    def on_train_end(self, logs=None):
        self._exit_if_stopped_after_epoch()
        preemption().unwatch()
        preemption().uninstall()
        resume_at(self.model, 0, 0)
        # Keras never resets the epoch a restore resumes at: a second fit of the same model
        # (keras-io's fine-tuning: unfreeze, compile, fit again) would skip as many epochs
        # (a seam of Keras', watched by tests/unit/seam/test_keras_seams.py)
        self.model._initial_epoch = None
        if self._scratch.path is None and self.delete_checkpoint:
            self._store.remove()  # its own files only
        self._store.release()
        self._scratch.cleanup()
        # fit returns on no worker before the chief's final write (or removal) is done: a
        # worker's next fit reads the directory the chief owns
        barrier(strategy_of(self.model))

    def on_epoch_begin(self, epoch, logs=None):
        self._exit_if_stopped_after_epoch()
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if skipping(self.model, self._epoch, batch):  # trained before the preemption
            if self.model.train_function is not self._skip:
                self._keras_function = self.model.train_function
                self.model.train_function = self._skip
            self._read_ahead_once()
            return
        if self.model.train_function is self._skip:
            self.model.train_function = self._keras_function
        self._read_ahead_once()
        preemption().before_step()

    def _read_ahead_once(self):
        """Before the resumed run's first step: the batches the interrupted run's iterator
        had read before its epoch (one iterator read on across epochs) are read and
        dropped, so each step trains the batch it would have."""
        count = take_advance(self.model)
        if not count:
            return
        function = self.model.train_function

        def read_ahead_then(iterator):
            for _ in range(count):
                next(iterator)
            if self._epoch_iterator is not None:  # Keras counts the reads of its iterator
                self._epoch_iterator._steps_seen += count
            self.model.train_function = function
            return function(iterator)

        self.model.train_function = read_ahead_then

    def on_train_batch_end(self, batch, logs=None):
        if skipping(self.model, self._epoch, batch):
            return
        self._current_epoch, self._done_in_epoch = self._epoch, batch + 1
        super().on_train_batch_end(batch, logs)
        if self._watching and not self._rides:
            preemption().agree_now()
        if preemption().agreed() and batch + 1 != (self.params or {}).get("steps"):
            self._exit_preempted(f"after step {batch + 1} of epoch {self._epoch}")
        # on an epoch's last step the epoch ends first (its validation and epoch logs):
        # a run resumed there starts the next epoch, not an empty one

    def on_epoch_end(self, epoch, logs=None):
        resume_at(self.model, 0, 0)  # past the resumed epoch
        self._done_in_epoch, self._at_epoch_end = 0, True
        try:
            super().on_epoch_end(epoch, logs)
        finally:
            self._at_epoch_end = False
        if self._watching:  # a signal since the epoch's last step (its validation, say)
            preemption().before_step()
            preemption().agree_now()  # every worker, at the same point
        if self._watching and preemption().agreed():
            # saved and exited once every callback ended the epoch (the logs after this
            # one in the list write its row), before the next epoch or at the training's end
            self._current_epoch, self._stop_after_epoch = epoch + 1, f"at the end of epoch {epoch}"

    def _exit_if_stopped_after_epoch(self):
        where, self._stop_after_epoch = getattr(self, "_stop_after_epoch", None), None
        if where is not None:
            self._exit_preempted(where)

    def _exit_preempted(self, where, saved=False):
        """Every worker saves the backup (the chief's is the one kept) and exits with 143."""
        if not saved:
            self._at_epoch_end = self._done_in_epoch == 0
            self._save_model()
        barrier(strategy_of(self.model))  # nobody exits before the chief's save is done
        waited = seconds_since_signal()
        message = (f"preempted: saved the backup {where}"
                   + (f", {waited:.1f} s after the signal" if waited is not None
                      else " (a peer's signal)") + "; exiting with code 143 to be restarted")
        print(f"tfdist: {message}", flush=True)
        preemption().reset()
        self._store.release()
        raise Preempted(message)

    @staticmethod
    def _skip(iterator):
        """Reads one step's data and trains nothing (a step that trained before)."""
        next(iterator)
        return {}

    def _save_model(self):
        metadata, write = capture(self.model, strategy_of(self.model))
        reads = input_position(self.model, at_epoch_end=self._at_epoch_end)
        with writing(CALLER, self._store.directory, BACKUP_NOT_WRITTEN):
            self._store.save(write, {"epoch": self._current_epoch, "batch": self._done_in_epoch,
                                     "reads": reads,
                                     "epochs": self.params.get("epochs") if self.params
                                     else None, **metadata})

    def _load_model(self):
        loaded = self._store.load(self._read)
        if loaded is not None:
            metadata = loaded[1]
            self.model._initial_epoch = metadata["epoch"]
            resume_at(self.model, metadata["epoch"], metadata.get("batch", 0),
                      metadata.get("reads"))
            self._epoch, self._done_in_epoch = metadata["epoch"], metadata.get("batch", 0)

    def _read(self, path, metadata):
        """Loads the backup at `path` into the model, if it fits this run."""
        epochs = self.params.get("epochs") if self.params else None
        steps = self.params.get("steps") if self.params else None
        epoch, batch = metadata.get("epoch"), metadata.get("batch", 0)
        if not (type(epoch) is int and 0 <= epoch < MAX_STEPS) or (
                epochs is not None and epoch > epochs):
            raise CheckpointError(
                f"the backup {path} is of epoch {repr(epoch)[:60]}, but this training runs "
                f"{epochs} epochs: its metadata.json was changed, or this run's epochs were "
                f"since it was written. Remove its backups from {self._chief_dir} or give "
                "another backup_dir")
        if not (type(batch) is int and 0 <= batch < MAX_STEPS) or (
                steps is not None and batch > steps) or (epoch == epochs and batch):
            raise CheckpointError(
                f"the backup {path} is after step {repr(batch)[:60]} of epoch {epoch}, but "
                f"this training's epochs have {steps} steps: its metadata.json was changed, "
                "or this run's data was since it was written. "
                f"Remove its backups from {self._chief_dir} or give another backup_dir")
        reads = metadata.get("reads")
        if reads is not None and not (type(reads) is int and batch <= reads < MAX_STEPS):
            raise CheckpointError(
                f"the backup {path} holds reads={repr(reads)[:60]}, not a count of batches "
                f"read (at least the {batch} steps of its epoch): it is not a backup tfdist "
                "wrote")
        if epoch == epochs:
            print(f"tfdist: the backup {path} is of the last epoch ({epoch} of {epochs}): "
                  "nothing is left to train", flush=True)
        restore(self.model, strategy_of(self.model), path, metadata)


def keras_epoch_iterator():
    """The `EpochIterator` of the Keras `fit` calling this callback's `on_train_begin`, or
    None (not under Keras' fit). A seam of Keras' (its `fit` keeps it as the local
    `epoch_iterator`), watched by tests/unit/seam/test_keras_seams.py."""
    from keras.src.trainers.epoch_iterator import EpochIterator

    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            return None
        found = frame.f_locals.get("epoch_iterator")
        if isinstance(found, EpochIterator) and hasattr(found, "_steps_seen"):
            return found
        frame = frame.f_back
    return None


def keras_input_dataset(epoch_iterator):
    """The dataset `fit` was given, as its `EpochIterator`'s data adapter keeps it (a seam
    of Keras', watched by tests/unit/step/test_input_position.py), or None."""
    return getattr(getattr(epoch_iterator, "data_adapter", None), "_dataset", None)


def keras_input_position(epoch_iterator):
    """(batches the current iterator yielded, whether the next epoch reads on through it):
    Keras keeps one iterator across epochs when `steps_per_epoch` is given, and renews it
    (before the epoch ends) when a finite dataset's batches are all read."""
    return epoch_iterator._steps_seen, epoch_iterator.steps_per_epoch is not None


def _check_arguments(backup_dir, save_freq, double_checkpoint, delete_checkpoint, preemption,
                     run):
    """One-line refusals of what Keras' constructor would take or crash on later."""
    import os

    if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir) \
            or "\0" in os.fspath(backup_dir):
        raise ValueError("backup_dir must be a non-empty path without NUL characters. "
                         f"Received: backup_dir={str(backup_dir)[:200]!r}")
    if os.path.lexists(backup_dir) and not os.path.isdir(backup_dir):
        raise ValueError(f"backup_dir must be a directory (or not exist yet); {backup_dir} "
                         "is a file")
    if not (save_freq == "epoch" or (type(save_freq) is int and save_freq > 0)):
        raise ValueError(f"save_freq must be 'epoch' or a positive number of batches. "
                         f"Received: save_freq={save_freq!r}")
    for name, value in (("double_checkpoint", double_checkpoint),
                        ("delete_checkpoint", delete_checkpoint), ("preemption", preemption)):
        if type(value) is not bool:
            raise ValueError(f"{name} must be True or False. Received: {name}={value!r}")
    check_json("run", run)
