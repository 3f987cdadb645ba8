"""`TensorBoard` and `CSVLogger` that every worker of a job can be given: the chief writes.

Keras 3's callbacks have no chief/worker logic (keras `src/callbacks/`, up to 3.16): under
a multi-worker strategy every worker writes the same event files or the same CSV file.
Keras 2's did what is done here (tf-keras `multi_worker_callback_tf2_test.py`): the chief
writes the real directory or file, the other workers write to a private temporary
directory (`WorkerScratch`) removed at the end, and the profiler keeps every worker's
trace (here on request: see `TensorBoard`).
"""

import csv
import functools
import importlib.util
import os
import re

import keras
import tensorflow as tf

from tfdist.compression.auto import AutoCompression
from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.errors import shown
from tfdist.keras.callbacks.comm_stats import CommStats
from tfdist.keras.callbacks.log_paths import (check_place, ending_on_error, probe_directory,
                                              probe_file, writing)
from tfdist.keras.callbacks.step_times import EpochStepTimes
from tfdist.keras.callbacks.worker_scratch import WorkerScratch, strategy_of
from tfdist.local_sgd import ModelAverager
from tfdist.report import logger
from tfdist.seam.optimizer import pipeline_of
from tfdist.seam.owned import named_optimizers
from tfdist.strategies.task import chief_wrote, task_of

#: The log directory a managed platform gives a job (Vertex AI's custom training).
PLATFORM_LOG_DIRS = ("AIP_TENSORBOARD_LOG_DIR",)
CALLER_TB, CALLER_CSV = "tfdist.callbacks.TensorBoard", "tfdist.callbacks.CSVLogger"
#: How a worker's probe names its scratch (`probe_directory`'s `what`).
_SCRATCH = "this worker's private scratch: only the chief writes the path given"
#: Where TensorBoard's profile plugin reads a run's traces (under the run's directory).
PROFILE = os.path.join("train", "plugins", "profile")


def require_tensorboard(caller):
    """Refuses, in one line, a TensorBoard callback where the tensorboard package is
    missing (TensorFlow 2.21 no longer brings it; `tf.summary.scalar` would fail at the
    first epoch's end, after the model was built and trained)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ImportError(f"{caller} writes TensorBoard's event files, which needs the "
                          "tensorboard package (TensorFlow 2.21 no longer installs it): "
                          "pip install 'tfdist[tensorboard]' (or pip install tensorboard)")


def default_log_dir(log_dir, caller):
    """`log_dir` checked as a config path and as a place for a directory (`check_place`),
    or, when None, the platform's (Vertex AI's `AIP_TENSORBOARD_LOG_DIR`, checked the
    same), else Keras' "logs"."""
    key, value = "log_dir", log_dir
    if log_dir is None:
        key, value = next(((name, os.environ[name]) for name in PLATFORM_LOG_DIRS
                           if os.environ.get(name)), (key, "logs"))
    value = check_arguments(caller, {key: checks.path}, **{key: value})[key]
    check_place(caller, key, value, directory=True)
    return value


def profile_range(source, path, value):
    """Keras' `profile_batch` as (start, stop): an integer N (0: off) is (N, N), a pair
    or a string "start,stop" of integers 1 <= start <= stop (Keras counts the train
    batches from 1, across epochs; a range from 0 would never start). Keras refuses
    negatives and start > stop only, naming no caller; it takes True, floats in a pair
    and any digits `int()` reads, and refuses the "N" its comment offers."""
    pair = value
    if isinstance(value, str):
        found = re.fullmatch(r"\s*([0-9]+)\s*(?:,\s*([0-9]+)\s*)?", value)
        if found is None:
            raise checks.type_error(source, path, 'an integer or "start,stop"', value)
        pair = tuple(int(n) for n in found.groups(found.group(1)))
    elif not isinstance(pair, (tuple, list)):
        pair = checks.integer(source, path, value, minimum=0)
        return pair, pair
    if len(pair) != 2:
        raise checks.type_error(source, path, "a pair (start, stop)", value)
    start, stop = (checks.integer(source, tuple(path) + (i,), n, minimum=0)
                   for i, n in enumerate(pair))
    if start > stop or (start == 0 < stop):
        why = "after its stop" if start > stop else "0 (batches count from 1; 0 alone is off)"
        raise source.error(path, f"the range's start batch is {why}. "
                                 f"Received: {checks.path_name(path)}={shown(value)}")
    return start, stop


class TensorBoard(keras.callbacks.TensorBoard):
    """Keras' `TensorBoard` (the same arguments), safe when every worker is given one
    `log_dir`: the chief writes it; the other workers write to a private temporary
    directory removed at the end of training (or of `evaluate`). Under the
    parameter-server Trainer the coordinator writes.

    `profile_batch` traces the chief, where TensorBoard's profile plugin looks
    (`log_dir/train/plugins/profile`); with `profile_workers=True` every other worker
    too, each in a run of its own (`log_dir/worker-1/train/plugins/profile`, ...).
    Not by default: TensorFlow 2.21's profiler aborted a worker when it stopped ("double
    free or corruption" in `tf.profiler.experimental.stop`) in 10 of 72 four-worker runs
    here at Keras' host tracer level 2, in none of 30 at level 1 but once in a loaded CI
    run; each of the 8 whose worker was recorded was not the chief. A barrier before the
    stop, or no device tracer, did not help. In a job of several workers the host tracer
    records at `host_tracer_level` 1 (TensorFlow's `ProfilerOptions`: the steps and
    annotated regions, not every op) unless given.
    `log_dir=None`: the directory
    a managed platform gives the job (`AIP_TENSORBOARD_LOG_DIR` on Vertex AI), else "logs".

    Each epoch's logs (fit's history, and so the event files and a `CSVLogger` after
    it) also get tfdist's own figures (`training_figures`): `CommStats`' bytes per step
    and compression ratios, `StepTimes`' breakdown of each worker's step time (computing,
    exchange, waiting for the slowest) and the straggler, the loss scale and the steps it
    skipped under mixed precision, local SGD's synchronisations; `compression: auto`'s choice is written as
    text (`tfdist/compression_auto_choice`).

    Raises:
        ImportError: the tensorboard package is not installed.
        tfdist.ConfigError: at construction (on every task: all are given one `log_dir`):
            `log_dir` is not a path, is an existing file or device, or lies under one
            (checked on the local file system only, not gs://...); `host_tracer_level`
            not in 1-3; `profile_workers` not a boolean; `profile_batch` negative, not an
            integer (a float, a boolean, a string other than "N" or "start,stop"), a
            range whose start is after its stop or 0. Before training or evaluating
            (`set_model`): `log_dir` (on a worker that is not the chief: its scratch)
            cannot be made or written (a read-only file system, a full disk).
        OSError: an event file could not be written during the run (a disk that filled
            up: "No space left on device"), in one line naming the file, at the latest at
            the end of the epoch it happened in; fit stops there.

    A `profile_batch` range the run never reached (more than its train batches) is a
    warning at the end of training, on the `tfdist` logger: no trace was written.
    """

    def __init__(self, log_dir=None, host_tracer_level=None, profile_workers=False, **kwargs):
        require_tensorboard(CALLER_TB)
        if host_tracer_level is not None:
            check_arguments(CALLER_TB, {"host_tracer_level": functools.partial(
                checks.integer, minimum=1, maximum=3)}, host_tracer_level=host_tracer_level)
        self.host_tracer_level = host_tracer_level
        self.profile_workers = check_arguments(CALLER_TB, {
            "profile_workers": checks.boolean}, profile_workers=profile_workers)["profile_workers"]
        if "profile_batch" in kwargs:
            kwargs.update(check_arguments(CALLER_TB, {"profile_batch": profile_range},
                                          profile_batch=kwargs["profile_batch"]))
        super().__init__(default_log_dir(log_dir, CALLER_TB), **kwargs)
        self._chief_log_dir = self.log_dir
        self._scratch = WorkerScratch(self.log_dir)
        self._task, self._training, self._traced = (None, None), False, False
        self._comm, self._times, self._epoch = CommStats(), EpochStepTimes(), {}

    def set_model(self, model):
        if self._scratch.path is None:  # once per fit or evaluate
            strategy = strategy_of(model)
            scratch = self._scratch.create(strategy)
            self.log_dir = self._chief_log_dir if scratch is None else scratch
            self._task = task_of(strategy)
        with self._scratch.removed_on_error():
            probe_directory(CALLER_TB, "log_dir", self._chief_log_dir, self.log_dir,
                            self._scratch.path and _SCRATCH)
            with writing(CALLER_TB, self.log_dir):
                super().set_model(model)  # writes the model's summary
        self._comm.set_model(model)
        self._times.set_model(model)

    def on_train_begin(self, logs=None):
        self._training, self._traced = True, False
        self._comm.on_train_begin(logs)
        self._times.on_train_begin(logs)
        super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        self._comm.on_epoch_begin(epoch, logs)
        self._times.on_epoch_begin(epoch, logs)
        self._epoch = {"batches": 0, "updates": _updates(self.model)}
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._comm.on_train_batch_end(batch, logs)
        self._epoch["batches"] = self._epoch.get("batches", 0) + 1
        with ending_on_error(self, CALLER_TB, self.log_dir):
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            self._comm.on_epoch_end(epoch, logs)
            self._times.on_epoch_end(epoch, logs)
            figures, texts = training_figures(self.model, self._epoch)
            logs.update(figures)
        with ending_on_error(self, CALLER_TB, self.log_dir):
            if logs is not None and texts:
                with self._train_writer.as_default():
                    for name, text in texts.items():
                        self.summary.text(f"tfdist/{name}", text, step=epoch)
            super().on_epoch_end(epoch, logs)
            self._flush_writers()  # a full disk is told at the epoch it filled

    def on_train_end(self, logs=None):
        try:
            self._warn_if_untraced()
            with writing(CALLER_TB, self.log_dir):
                super().on_train_end(logs)
        finally:
            self._training = False
            self._done()
        chief_wrote(strategy_of(self.model), self._chief_log_dir)  # readable everywhere now

    def on_test_end(self, logs=None):
        if self._training:  # fit's validation
            with ending_on_error(self, CALLER_TB, self.log_dir):
                return super().on_test_end(logs)
        try:  # evaluate() alone
            with writing(CALLER_TB, self.log_dir):
                super().on_test_end(logs)
                self._close_writers()
        finally:
            self._done()

    def _start_profiler(self, logdir):
        """Keras' start of the profiler, at `host_tracer_level`, on the chief, and on the
        other workers with `profile_workers` (see the class)."""
        if self._profiler_started or not logdir:  # Keras' warm-up start: nothing kept
            return super()._start_profiler(logdir)
        if self._scratch.path is not None and not self.profile_workers:
            return None  # not started: Keras' stop is then a no-op
        level = self.host_tracer_level or (1 if self._task[0] is not None else 2)
        tf.profiler.experimental.start(logdir, options=tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=level, python_tracer_level=0, device_tracer_level=1))
        self._profiler_started = self._traced = True

    def _warn_if_untraced(self):
        """A warning where this task was to trace `profile_batch` but never started (the
        range is beyond the run's train batches, which Keras counts across epochs)."""
        if self._should_trace and not self._traced and (
                self._scratch.path is None or self.profile_workers):
            logger.warning(f"{CALLER_TB}: no profiler trace was written: profile_batch="
                           f"({self._start_batch}, {self._stop_batch}) was not reached, the "
                           f"run had {self._global_train_batch} train batches (counted from 1 "
                           "across epochs)")

    def _flush_writers(self):
        """TensorFlow's writers report a failed write only to a flush (not to `close`)."""
        for writer in self._writers.values():
            writer.flush()

    def _close_writers(self):
        try:
            self._flush_writers()
        finally:
            super()._close_writers()

    def _done(self):
        """Keeps this worker's profiler traces beside the chief's, removes the scratch."""
        if self._scratch.path is not None:
            task_type, task_id = self._task
            keep_tree(os.path.join(self._scratch.path, PROFILE),
                      os.path.join(self._chief_log_dir, f"{task_type}-{task_id}", PROFILE))
        self._scratch.cleanup()
        self.log_dir = self._chief_log_dir


def _updates(model):
    optimizer = getattr(model, "optimizer", None)
    return None if optimizer is None else int(optimizer.iterations.numpy())


def training_figures(model, epoch):
    """({name: number}, {name: text}) of tfdist's state after an epoch: the loss scale and
    the steps it skipped (`epoch`: the epoch's batches and the update count before it),
    each local SGD / DiLoCo's synchronisations so far, `compression: auto`'s choice
    (prefixed by the optimizer's name where a model trains with several)."""
    figures, texts = {}, {}
    optimizer = getattr(model, "optimizer", None)
    if hasattr(optimizer, "dynamic_scale"):  # mixed precision's LossScaleOptimizer
        figures["loss_scale"] = float(optimizer.dynamic_scale.numpy())
        before, batches = epoch.get("updates"), epoch.get("batches", 0)
        accumulating = getattr(optimizer.inner_optimizer, "gradient_accumulation_steps", None)
        if before is not None and batches and not accumulating:
            figures["skipped_steps"] = float(batches - (_updates(model) - before))
    named = named_optimizers(model)
    for name, routed in named:
        prefix = f"{name}/" if len(named) > 1 else ""
        for hook in pipeline_of(routed).hooks:
            if isinstance(hook, ModelAverager):
                figures[f"{prefix}local_sgd_synchronisations"] = float(hook.averages)
            if isinstance(hook, AutoCompression):  # "probe" until it has chosen
                texts[f"{prefix}compression_auto_choice"] = str(hook.choice)
    return figures, texts


def _keras_csv_keys(logs):
    """The columns after "epoch" Keras' `CSVLogger` writes for `logs` (its `keys`)."""
    keys = sorted(logs)
    if keys and not any(key.startswith("val_") for key in keys):
        keys += [f"val_{key}" for key in keys]
    return keys


def keep_tree(source, target):
    """Copies the files under `source` (local) to `target` (any `tf.io.gfile` path: a
    shared log directory may be gs://), keeping their relative paths."""
    if not os.path.isdir(source):
        return
    for folder, _, files in os.walk(source):
        into = os.path.join(target, os.path.relpath(folder, source))
        tf.io.gfile.makedirs(into)
        for name in files:
            tf.io.gfile.copy(os.path.join(folder, name), os.path.join(into, name),
                             overwrite=True)


class CSVLogger(keras.callbacks.CSVLogger):
    """Keras' `CSVLogger` (the same arguments), safe when every worker is given one
    `filename`: the chief writes it; the other workers write to a private temporary
    directory removed at the end of training.

    Raises:
        tfdist.ConfigError: at construction (on every task): `filename` is not a path,
            is an existing directory, or lies under a file (local paths only). At
            `on_train_begin`, before the first step: `filename` (on a worker that is not
            the chief: its scratch) cannot be written (a read-only file system, a full
            disk, a device such as /dev/full).
        OSError: a row could not be written during the run (a disk that filled up: "No
            space left on device"), in one line naming the file; fit stops there.
    """

    def __init__(self, filename, separator=",", append=False):
        filename = check_arguments(CALLER_CSV, {"filename": checks.path},
                                   filename=filename)["filename"]
        check_place(CALLER_CSV, "filename", filename, directory=False)
        super().__init__(filename, separator=separator, append=append)
        self._chief_filename = self.filename
        self._scratch = WorkerScratch(self.filename)

    def on_train_begin(self, logs=None):
        if self._scratch.create(strategy_of(self.model)) is not None:
            self.filename = self._scratch.redirect(self._chief_filename)
        with self._scratch.removed_on_error():
            probe_file(CALLER_CSV, "filename", self._chief_filename, self.filename,
                       self._scratch.path and _SCRATCH)
        super().on_train_begin(logs)

    def on_epoch_end(self, epoch, logs=None):
        with ending_on_error(self, CALLER_CSV, self.filename):
            if self.keys is None and self.append and not self.append_header:
                self._keep_columns(logs or {})
            super().on_epoch_end(epoch, logs)

    def _keep_columns(self, logs):
        """Appending to a file written before (a resumed run, whose logs may hold more or
        fewer figures: another number of workers after a resize), every row keeps to one
        header: the file's columns, then this run's new ones (the file rewritten with
        them, its earlier rows "NA" there); a column this run lacks is "NA"."""
        if "://" in self.filename:  # gs:// and such: appended as Keras does
            return
        self.csv_file.flush()
        with open(self.filename, newline="") as f:
            rows = list(csv.reader(f, delimiter=self.sep))
        header = rows[0] if rows else []
        keys = _keras_csv_keys(logs)
        columns = header + [k for k in ["epoch", *keys] if k not in header]
        self.keys = [k for k in columns if k != "epoch"]
        if columns == header or not header:
            return
        self.csv_file.close()
        temporary = f"{self.filename}.tfdist-tmp"
        with open(temporary, "w", newline="") as f:
            writer = csv.writer(f, delimiter=self.sep)
            writer.writerow(columns)
            writer.writerows(row + ["NA"] * (len(columns) - len(row)) for row in rows[1:])
        os.replace(temporary, self.filename)
        self.csv_file = open(self.filename, "a")

    def on_train_end(self, logs=None):
        try:
            with writing(CALLER_CSV, self.filename):
                super().on_train_end(logs)
        finally:
            self._scratch.cleanup()
            self.filename = self._chief_filename
        chief_wrote(strategy_of(self.model), self._chief_filename)  # readable everywhere now

