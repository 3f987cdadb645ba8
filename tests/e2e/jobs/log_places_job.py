"""`tfdist.callbacks.TensorBoard` and `CSVLogger` writing to a place that refuses, run by
tests/unit/keras/test_logs.py inside a private mount namespace (`unshare -m`) where MOUNT
is a small tmpfs the test made read-only or full:

    python log_places_job.py MOUNT read_only|full|fills_up

fits a one-layer model once per case and prints one JSON line: {case: {"error": the
exception's type and text or None, "iterations": the optimizer's, "batches": train
batches begun, "epochs": epochs ended}}; for `full` what MOUNT holds afterwards, for
`fills_up` what was written: the epochs TensorBoard's reader finds, the CSV's text.
`full` also runs each callback as a worker that is not the chief (its scratch in MOUNT);
`fills_up` fills MOUNT during the run (event files: from the start of training, with 40
epochs to run; the CSV file and each callback that writes the model, ModelCheckpoint and
BackupAndRestore: at the end of epoch 0, before its write).
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
from tfdist.keras.callbacks import worker_scratch  # noqa: E402


class Count(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = self.epochs = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1


class Fill(keras.callbacks.Callback):
    """Fills the file system of `folder` at train begin, or at the end of epoch 0."""

    def __init__(self, folder, at):
        super().__init__()
        self.folder, self.at = folder, at

    def on_train_begin(self, logs=None):
        if self.at == "train_begin":
            fill(self.folder)

    def on_epoch_end(self, epoch, logs=None):
        if self.at == "epoch_end" and epoch == 0:
            fill(self.folder)


def fill(folder):
    handle = os.open(os.path.join(folder, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(handle, b"x" * 4096):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(handle)


def fit(make, before=(), after=(), epochs=2):
    """One fit of a fresh model with `make()`'s callback between `before` and `after`."""
    count = Count()
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    net.compile("sgd", "mse")
    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
    error = None
    try:
        net.fit(x, x[:, :1], batch_size=4, epochs=epochs, verbose=0,
                callbacks=[count, *before, make(), *after])
    except Exception as e:  # noqa: BLE001 - reported to the test
        error = [type(e).__name__, str(e)]
    return {"error": error, "iterations": int(net.optimizer.iterations.numpy()),
            "batches": count.batches, "epochs": count.epochs}


def epochs_written(run):
    """The steps of the epoch losses TensorBoard's reader finds in a run's event files."""
    from tensorboard.backend.event_processing import event_accumulator

    reader = event_accumulator.EventAccumulator(
        run, size_guidance={event_accumulator.TENSORS: 0})  # all, not a sample
    reader.Reload()
    return [e.step for e in reader.Tensors("epoch_loss")]


def as_worker():
    """This process as worker 1 of a job (its scratch then in tempfile's directory)."""
    worker_scratch.is_chief = lambda strategy: False
    worker_scratch.task_of = lambda strategy: ("worker", 1)


def checkpoints(mount):
    """The callbacks that write the model, each writing into `mount`."""
    return {
        "keras_file": lambda: tfdist.callbacks.ModelCheckpoint(os.path.join(mount, "m.keras")),
        "weights_file": lambda: tfdist.callbacks.ModelCheckpoint(
            os.path.join(mount, "m.weights.h5"), save_weights_only=True),
        "backup": lambda: tfdist.callbacks.BackupAndRestore(os.path.join(mount, "backup"))}


def main(mount, scenario):
    board, csv = (lambda: tfdist.callbacks.TensorBoard(os.path.join(mount, "board")),
                  lambda: tfdist.callbacks.CSVLogger(os.path.join(mount, "log.csv")))
    if scenario == "read_only":
        found = {"board": fit(board), "csv": fit(csv),
                 "board_exists": fit(lambda: tfdist.callbacks.TensorBoard(
                     os.path.join(mount, "exists"))),
                 "csv_exists": fit(lambda: tfdist.callbacks.CSVLogger(
                     os.path.join(mount, "exists", "log.csv")))}
    elif scenario == "full":
        found = {"board": fit(board), "csv": fit(csv)}
        tempfile.tempdir = mount
        as_worker()
        found.update({"worker_board": fit(board), "worker_csv": fit(csv),
                      "left": sorted(os.listdir(mount))})
    else:
        found = {"board": fit(board, after=[Fill(mount, "train_begin")], epochs=40)}
        found["board"]["written"] = epochs_written(os.path.join(mount, "board", "train"))
        os.remove(os.path.join(mount, "filler"))
        found["csv"] = fit(csv, before=[Fill(mount, "epoch_end")])
        with open(os.path.join(mount, "log.csv")) as f:
            found["csv"]["written"] = f.read()
        for case, make in checkpoints(mount).items():  # a checkpoint's write fills it up
            os.remove(os.path.join(mount, "filler"))
            found[case] = fit(make, before=[Fill(mount, "epoch_end")])
    print(json.dumps(found))


if __name__ == "__main__":
    main(*sys.argv[1:])
