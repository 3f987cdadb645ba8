"""`tfdist.callbacks.TensorBoard` and `CSVLogger` (issue 58): every worker of a job given
one log directory and one CSV file, only the chief writes them, the others' scratch is
removed, and the profiler keeps every worker's trace; their arguments are checked as the
config file's are; a place that cannot hold the logs (a file, read-only, full, filling up)
and a profile range Keras would misread or never reach are said in one line."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfdist.config import ConfigError
from paths import JOBS as JOB_DIR

JOBS = str(JOB_DIR)


def scalars(run_dir):
    """{tag: [(step, value)]} of the epoch scalars in a run directory's event files,
    read with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    reader = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={event_accumulator.TENSORS: 0})
    reader.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                  for e in reader.Tensors(tag)]
            for tag in reader.Tags()["tensors"] if tag.startswith("epoch_")}


def launch_logs_job(tmp_path, workers, *runs):
    """tests/e2e/jobs/logs_job.py under `tfdist launch -n workers`, once per loop of `runs`
    (tests/e2e/jobs/runs.py: one launch), each run with its own log directory and CSV file;
    {loop: (its directory, [each task's record])}."""
    flags = {loop: ["--loop", loop, "--log_dir", str(tmp_path / loop / "board"),
                    "--csv", str(tmp_path / loop / "log.csv"),
                    *(["--profile_workers"] if loop == "trainer" else [])] for loop in runs}
    for loop in runs:
        (tmp_path / loop / "out").mkdir(parents=True)
        flags[loop] = [str(tmp_path / loop / "out"), *flags[loop]]
    run = subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", str(workers), "--",
                          sys.executable, "runs.py", "logs_job.py",
                          *(json.dumps(f) for f in flags.values())],
                         cwd=JOBS, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return {loop: (tmp_path / loop, [json.loads((tmp_path / loop / "out" / f"worker-{i}.json")
                                                .read_text()) for i in range(workers)])
            for loop in runs}


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers, loops", [(2, ("trainer",)), (4, ("fit",))])
def test_every_worker_given_one_log_dir_only_the_chief_writes_it(tmp_path, workers, loops):
    """All workers point TensorBoard and CSVLogger at one directory and one file: the
    directory holds the chief's event files only (one per run: train, validation), whose
    epoch losses, read back with TensorBoard's reader, are the chief's history; the CSV
    holds them once, and the bytes and step-time breakdown are in the event files too;
    every other worker wrote to its own scratch during training, which
    is gone; and the chief's profiler trace is kept where TensorBoard's profile plugin
    looks, with `profile_workers=True` (the Trainer's run) each other worker's too, in a
    run of its own."""
    for loop, (where, tasks) in launch_logs_job(tmp_path, workers, *loops).items():
        board = where / "board"
        chief = tasks[0]
        assert chief["chief"] and not any(t["chief"] for t in tasks[1:])
        assert chief["wrote"] == {"board": None, "csv": None,
                                  "csv_file": str(where / "log.csv")}
        for task in tasks[1:]:
            assert task["wrote"]["board"] and task["wrote"]["csv"], task
            assert not os.path.exists(task["wrote"]["board"])
            assert not os.path.exists(task["wrote"]["csv"])
            assert task["history"]["loss"] == chief["history"]["loss"]  # one model
        for run in ("train", "validation"):
            events = [n for n in os.listdir(board / run) if n.startswith("events.out")]
            assert len(events) == 1, (run, events)  # one writer: the chief's
        read = scalars(board / "train")
        np.testing.assert_allclose([v for _, v in read["epoch_loss"]],
                                   chief["history"]["loss"], rtol=1e-6)
        assert [s for s, _ in read["epoch_loss"]] == [0, 1]
        for name in ("comm_payload_bytes", "step_wait_s", "straggler",
                     *(f"worker_{i}/step_{part}_s" for i in range(workers)
                       for part in ("compute", "exchange", "wait"))):  # bytes, breakdown
            np.testing.assert_allclose([v for _, v in read[f"epoch_{name}"]],
                                       chief["history"][name], rtol=1e-6, err_msg=name)
        np.testing.assert_allclose([v for _, v in scalars(board / "validation")["epoch_loss"]],
                                   chief["history"]["val_loss"], rtol=1e-6)
        with open(where / "log.csv") as f:
            rows = list(csv.DictReader(f))
        np.testing.assert_allclose([float(r["loss"]) for r in rows], chief["history"]["loss"],
                                   rtol=1e-6)
        runs = sorted(n for n in os.listdir(board) if n.startswith("worker-"))
        traced = range(1, workers) if loop == "trainer" else ()  # profile_workers=True
        assert runs == [f"worker-{i}" for i in traced], runs
        for trace_run in [board, *(board / name for name in runs)]:
            traces = [f for _, _, files in os.walk(trace_run / "train" / "plugins" / "profile")
                      for f in files if f.endswith(".xplane.pb")]
            assert len(traces) == 1, (trace_run, traces)


def test_a_worker_that_is_not_the_chief_writes_scratch_that_is_removed(tmp_path, monkeypatch):
    """In one process made a non-chief (its scratch directory given): nothing lands in
    log_dir or the CSV's path, the event files and the CSV were written in the scratch
    during training, and fit's end removes it. Fails loudly if Keras' callbacks stop
    reading `log_dir` in `set_model` or `filename` in `on_train_begin`."""
    import keras

    import tfdist
    from tfdist.keras.callbacks import worker_scratch

    made = []

    def create(self, strategy):
        self.path = str(tmp_path / f"scratch-{len(made)}")
        os.makedirs(self.path)
        made.append(self.path)
        return self.path

    monkeypatch.setattr(worker_scratch.WorkerScratch, "create", create)
    seen = {}

    class Look(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen[epoch] = sorted(os.listdir(made[0])), sorted(os.listdir(made[1]))

    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    net.compile("sgd", "mse")
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    net.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0, callbacks=[
        tfdist.callbacks.TensorBoard(tmp_path / "board"),
        tfdist.callbacks.CSVLogger(tmp_path / "log.csv"), Look()])
    assert seen[1] == (["train"], ["log.csv"])
    assert not (tmp_path / "board").exists() and not (tmp_path / "log.csv").exists()
    assert not any(os.path.exists(path) for path in made)


def test_without_tensorboard_the_callback_is_refused_at_construction(monkeypatch):
    import importlib.util

    import tfdist

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else found(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'tfdist\[tensorboard\]'") as e:
        tfdist.callbacks.TensorBoard("logs")
    assert "\n" not in str(e.value)


def test_a_platforms_log_dir_is_used_when_none_is_given(monkeypatch, tmp_path):
    """Vertex AI's AIP_TENSORBOARD_LOG_DIR when log_dir is left out (Keras' "logs"
    without it); a log_dir given wins; a hostile value in the variable is refused naming
    it."""
    import tfdist

    monkeypatch.delenv("AIP_TENSORBOARD_LOG_DIR", raising=False)
    assert tfdist.callbacks.TensorBoard().log_dir == "logs"
    monkeypatch.setenv("AIP_TENSORBOARD_LOG_DIR", str(tmp_path / "vertex"))
    assert tfdist.callbacks.TensorBoard().log_dir == str(tmp_path / "vertex")
    assert tfdist.callbacks.TensorBoard(tmp_path / "mine").log_dir == str(tmp_path / "mine")
    monkeypatch.setenv("AIP_TENSORBOARD_LOG_DIR", "x" * 5000)
    with pytest.raises(ConfigError, match="AIP_TENSORBOARD_LOG_DIR: a path is at most"):
        tfdist.callbacks.TensorBoard()


@pytest.mark.parametrize("value, says", [("", "expected a non-empty string, got"),
                                         ("a\0b", "cannot hold a NUL"),
                                         (7, "expected a non-empty string, got an integer"),
                                         ("x" * 5000, "a path is at most")])
@pytest.mark.parametrize("make", ["TensorBoard", "CSVLogger"])
def test_a_path_that_is_not_one_is_refused_in_one_line(make, value, says):
    import tfdist

    with pytest.raises(ConfigError, match=says) as e:
        getattr(tfdist.callbacks, make)(value)
    assert f"tfdist.callbacks.{make}()" in str(e.value) and "\n" not in str(e.value)


def test_tfdists_figures_are_in_the_logs_and_the_event_files(tmp_path, strategies):
    """On 2 replicas with top-k under mixed_float16, a loss scale so large that the first
    steps overflow: each epoch's logs (fit's history) get CommStats' bytes and ratio, the
    loss scale and the steps it skipped, and the event files hold the same values; the
    skipped steps add up to the batches the optimizer did not count as updates."""
    import keras

    import tfdist

    strategy = strategies("mirrored")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            keras.utils.set_random_seed(0)
            net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(64),
                                    keras.layers.Dense(1, dtype="float32")])
            optimizer = keras.optimizers.LossScaleOptimizer(
                tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.01), "topk",
                                                  ratio=0.1, min_size=0),
                initial_scale=2.0 ** 22)
            net.compile(optimizer, "mse")
        x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
        history = net.fit(x, x[:, :1], batch_size=16, epochs=3, verbose=0, callbacks=[
            tfdist.callbacks.TrainingHooks(), tfdist.callbacks.TensorBoard(tmp_path)]).history
    finally:
        keras.mixed_precision.set_global_policy("float32")
    skipped = history["skipped_steps"]
    assert sum(skipped) == 12 - int(net.optimizer.iterations.numpy()) and skipped[0] > 0
    assert history["loss_scale"][-1] == float(net.optimizer.dynamic_scale.numpy())
    assert history["loss_scale"][0] < 2.0 ** 22 and sum(skipped) < 12
    assert all(ratio > 1.5 for ratio in history["compression_ratio"])  # half the values
    read = scalars(tmp_path / "train")
    for name in ("skipped_steps", "loss_scale", "comm_payload_bytes", "compression_ratio"):
        np.testing.assert_allclose([v for _, v in read[f"epoch_{name}"]], history[name],
                                   rtol=1e-6, err_msg=name)


def test_local_sgds_synchronisations_are_counted_in_the_logs(tmp_path, strategies):
    """Local SGD every 2 steps on 2 replicas, 4 steps an epoch: the logs count the
    synchronisations so far, as the averager does (2 an epoch, the epoch's end one of them)."""
    import keras

    import tfdist

    strategy = strategies("mirrored")
    averager = tfdist.local_sgd.ModelAverager(2)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        net.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.01),
                                                      hooks=[averager]), "mse")
    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    history = net.fit(x, x[:, :1], batch_size=16, epochs=2, verbose=0, callbacks=[
        tfdist.callbacks.TrainingHooks(), tfdist.callbacks.TensorBoard(tmp_path)]).history
    assert history["local_sgd_synchronisations"] == [2.0, 4.0] and averager.averages == 4
    assert [v for _, v in scalars(tmp_path / "train")["epoch_local_sgd_synchronisations"]] \
        == [2.0, 4.0]


@pytest.mark.parametrize("level", [0, 4, "2", True, 1.5])
def test_a_host_tracer_level_out_of_tensorflows_range_is_refused(level):
    import tfdist

    with pytest.raises(ConfigError, match="host_tracer_level") as e:
        tfdist.callbacks.TensorBoard("logs", host_tracer_level=level)
    assert "\n" not in str(e.value)


def test_a_worker_that_is_not_the_chief_profiles_only_when_asked(tmp_path, monkeypatch):
    """In one process made a non-chief (its scratch directory given), `profile_batch`
    starts no profiler by default, and with `profile_workers=True` starts it once, in the
    scratch, whose trace is kept beside the chief's (`log_dir/<task>-<id>`). Fails loudly
    if Keras stops starting the profiler through `_start_profiler`."""
    import keras
    import tensorflow as tf

    import tfdist
    from tfdist.keras.callbacks import worker_scratch

    def create(self, strategy):
        self.path = str(tmp_path / f"scratch-{len(os.listdir(tmp_path))}")
        os.makedirs(self.path)
        return self.path

    monkeypatch.setattr(worker_scratch.WorkerScratch, "create", create)
    starts, start = [], tf.profiler.experimental.start
    monkeypatch.setattr(tf.profiler.experimental, "start",
                        lambda logdir, **kw: starts.append(logdir) or start(logdir, **kw))
    x = np.random.default_rng(0).normal(size=(24, 3)).astype("float32")
    for workers in (False, True):
        keras.utils.set_random_seed(0)
        net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        net.compile("sgd", "mse")
        board = tmp_path / f"board-{workers}"
        net.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[
            tfdist.callbacks.TensorBoard(board, profile_batch=(2, 3), profile_workers=workers)])
        kept = [f for _, _, files in os.walk(board) for f in files if f.endswith(".xplane.pb")]
        assert len(kept) == int(workers), kept
    starts = [logdir for logdir in starts if logdir]  # Keras' warm-up start has none
    assert len(starts) == 1 and "scratch" in starts[0], starts


# --- hostile places and profile ranges (issue 58) -------------------------------------------

PLACES_JOB = os.path.join(JOBS, "log_places_job.py")
#: How the tmpfs is spoilt before tests/e2e/jobs/log_places_job.py runs in it.
SPOIL = {"read_only": 'mount -o remount,ro "$1"',
         "full": '{ cat /dev/zero > "$1/filler"; } 2>/dev/null; true', "fills_up": "true"}


def in_a_small_disk(tmp_path, scenario, size="64k"):
    """tests/e2e/jobs/log_places_job.py SCENARIO in a private mount namespace (`unshare -m`,
    root) over a tmpfs of `size` at tmp_path/mnt holding `exists/`, read-only, full, or
    left for the job to fill (SPOIL); its JSON. The mount ends with the child."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = (f'mount -t tmpfs -o size={size} tmpfs "$1" && mkdir "$1/exists" && '
              f'{SPOIL[scenario]} && exec "$2" "$3" "$1" "$4"')
    run = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(mount),
                          sys.executable, PLACES_JOB, scenario],
                         cwd=JOBS, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert os.listdir(mount) == []  # written inside the tmpfs only
    return json.loads(run.stdout.strip().splitlines()[-1])


def refused_before_training(run, make, key, path, reason):
    """`run` (a fit of log_places_job.py) ended in one ConfigError line naming `make`'s
    call, `key`=`path` and `reason`, before any batch began or the optimizer stepped."""
    kind, message = run["error"]
    assert kind == "ConfigError" and "\n" not in message, run
    assert message.startswith(f"tfdist.callbacks.{make}(): {key}: "), message
    assert f"Received: {key}={path!r}" in message and reason in message, message
    assert run["iterations"] == run["batches"] == 0, run


@pytest.mark.multiprocess
def test_a_read_only_log_place_is_refused_before_the_first_step(tmp_path):
    """On a read-only file system (root ignores permissions, not a read-only mount), a
    new or existing log directory and a CSV file in a new or existing folder are each
    refused by the write probe, in one line naming the path and the system's reason."""
    found, mount = in_a_small_disk(tmp_path, "read_only"), str(tmp_path / "mnt")
    for case, make, key, path in [
            ("board", "TensorBoard", "log_dir", f"{mount}/board"),
            ("board_exists", "TensorBoard", "log_dir", f"{mount}/exists"),
            ("csv", "CSVLogger", "filename", f"{mount}/log.csv"),
            ("csv_exists", "CSVLogger", "filename", f"{mount}/exists/log.csv")]:
        refused_before_training(found[case], make, key, path, "Read-only file system")


@pytest.mark.multiprocess
def test_a_full_disk_is_refused_before_the_first_step_on_the_chief_and_a_worker(tmp_path):
    """On a full file system the chief's log directory and CSV file are refused; a worker
    that is not the chief (its scratch on that file system) is refused naming its
    scratch, which is removed."""
    found, mount = in_a_small_disk(tmp_path, "full"), str(tmp_path / "mnt")
    for case, make, key, path in [("board", "TensorBoard", "log_dir", f"{mount}/board"),
                                  ("csv", "CSVLogger", "filename", f"{mount}/log.csv")]:
        refused_before_training(found[case], make, key, path, "No space left on device")
        refused_before_training(found[f"worker_{case}"], make, key, path,
                                "No space left on device")
        assert f"cannot write in '{mount}/tfdist-worker-1-" in found[f"worker_{case}"][
            "error"][1] and "private scratch" in found[f"worker_{case}"]["error"][1]
    assert found["left"] == ["board", "exists", "filler"]  # no scratch left


@pytest.mark.multiprocess
def test_a_disk_that_fills_up_during_training_stops_it_naming_the_file(tmp_path):
    """A file system that fills up while training (TensorFlow's event writer would lose
    the events without a word, Keras' CSVLogger and its .keras checkpoint say "[Errno 28]"
    with no path, h5py names it over two lines): fit stops at that epoch with one OSError
    line naming the file and "No space left on device" — the logs, ModelCheckpoint and
    BackupAndRestore alike; the event file holds every epoch before it, read back with
    TensorBoard's reader."""
    found, mount = in_a_small_disk(tmp_path, "fills_up", size="256k"), str(tmp_path / "mnt")
    for case, file in [("board", f"{mount}/board/train/events.out.tfevents."),
                       ("csv", f"{mount}/log.csv")]:
        run = found[case]
        kind, message = run["error"]
        assert kind == "OSError" and "\n" not in message, run
        assert message.startswith("[Errno 28] tfdist.callbacks.") and file in message, message
        assert message.endswith("No space left on device; the log ends before this write")
    board = found["board"]
    assert 1 < board["epochs"] < 40 and board["iterations"] == 2 * board["epochs"], board
    assert board["written"][:board["epochs"] - 1] == list(range(board["epochs"] - 1))
    assert len(board["written"]) <= board["epochs"], board
    assert found["csv"]["epochs"] == 1 and found["csv"]["written"] == "", found["csv"]
    for case, file, ends in [
            ("keras_file", f"{mount}/m.keras", "this checkpoint is not written"),
            ("weights_file", f"{mount}/m.weights.h5", "this checkpoint is not written"),
            ("backup", f"{mount}/backup", "this backup is not written")]:
        kind, message = found[case]["error"]  # Keras' .keras write named no file, h5py's
        assert kind == "OSError" and "\n" not in message, found[case]  # two lines
        assert f"could not write {file}: No space left on device; {ends}" in message, message
        assert found[case]["epochs"] == 1, found[case]


def small_model():
    import keras

    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    net.compile("sgd", "mse")
    return net


def fit(net, begun, *callbacks, epochs=2):
    """`net` fit for `epochs` of 4 batches, each batch begun appended to `begun`."""
    import keras

    count = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda b, logs: begun.append(b))
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    net.fit(x, x[:, :1], batch_size=4, epochs=epochs, verbose=0, callbacks=[count, *callbacks])


def test_a_csv_file_on_a_device_that_refuses_writes_is_refused_before_the_first_step():
    """/dev/full refuses every write with ENOSPC (Keras' CSVLogger would fail at the
    first epoch's end, naming no path): refused at on_train_begin, no batch begun."""
    import tfdist

    net, begun = small_model(), []
    with pytest.raises(ConfigError) as e:
        fit(net, begun, tfdist.callbacks.CSVLogger("/dev/full"))
    assert str(e.value) == ("tfdist.callbacks.CSVLogger(): filename: cannot write '/dev/full': "
                            "No space left on device. Received: filename='/dev/full'")
    assert begun == [] and int(net.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("make, kind, reason", [
    ("TensorBoard", "file", "is a regular file, not a directory"),
    ("TensorBoard", "under_file", "is a regular file, so "),
    ("TensorBoard", "device", "'/dev/full' is a device, not a directory"),
    ("CSVLogger", "directory", "is a directory, not a file"),
    ("CSVLogger", "under_file", "is a regular file, so ")])
def test_a_log_path_of_the_wrong_kind_is_refused_at_construction(tmp_path, make, kind, reason):
    """A log directory that is a file or a device, a CSV file that is a directory, either
    under a regular file: one ConfigError line naming the call, the path and the reason,
    and nothing made on disk."""
    import tfdist

    (tmp_path / "file").write_text("mine")
    (tmp_path / "directory").mkdir()
    path = {"file": tmp_path / "file", "directory": tmp_path / "directory",
            "device": "/dev/full", "under_file": tmp_path / "file" / "logs" / "log.csv"}[kind]
    key = "log_dir" if make == "TensorBoard" else "filename"
    with pytest.raises(ConfigError) as e:
        getattr(tfdist.callbacks, make)(path)
    message = str(e.value)
    assert message.startswith(f"tfdist.callbacks.{make}(): {key}: ") and reason in message
    assert message.endswith(f"Received: {key}={str(path)!r}") and "\n" not in message
    assert sorted(os.listdir(tmp_path)) == ["directory", "file"]
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("value, says", [
    (-1, "profile_batch: expected a value >= 0. Received: profile_batch=-1"),
    ((-2, 3), "profile_batch[0]: expected a value >= 0. Received: profile_batch[0]=-2"),
    ((5, 2), "the range's start batch is after its stop. Received: profile_batch=(5, 2)"),
    ("5,2", "the range's start batch is after its stop. Received: profile_batch='5,2'"),
    ((0, 5), "the range's start batch is 0 (batches count from 1; 0 alone is off)"),
    (2.5, "expected an integer, got a number. Received: profile_batch=2.5"),
    (True, "expected an integer, got a boolean. Received: profile_batch=True"),
    ((1.5, 3), "profile_batch[0]: expected an integer, got a number"),
    ((2, True), "profile_batch[1]: expected an integer, got a boolean"),
    ("abc", "expected an integer or \"start,stop\", got a string"),
    ("1,2,3", "expected an integer or \"start,stop\", got a string"),
    ("2.5", "expected an integer or \"start,stop\", got a string"),
    ("٣", "expected an integer or \"start,stop\", got a string"),
    ((1, 2, 3), "expected a pair (start, stop), got tuple"),
    (2**70, "expected a 64-bit integer")])
def test_a_profile_batch_keras_would_misread_is_refused_at_construction(value, says):
    """Negative, start after stop (as a pair or "5,2"), a range from 0 (Keras never starts
    it), not integers (Keras takes True as 1 and floats in a pair): one ConfigError line
    naming the call and the value."""
    import tfdist

    with pytest.raises(ConfigError) as e:
        tfdist.callbacks.TensorBoard("logs", profile_batch=value)
    assert str(e.value).startswith("tfdist.callbacks.TensorBoard(): profile_batch")
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("value, in_keras", [
    (0, 0), (3, 3), ("2,4", "2,4"), (" 2 , 4 ", "2,4"), ((2, 4), (2, 4)), ([1, 1], [1, 1]),
    ((0, 0), (0, 0)), (np.int64(3), 3), ("3", 3)])
def test_a_profile_batch_keras_takes_means_what_it_means_in_keras(value, in_keras):
    """Every form Keras takes gives Keras' own range; NumPy's integers are taken as
    Python's, and "N" as N (Keras' comment offers "start" as a string; its code refuses it)."""
    import keras

    import tfdist

    ours = tfdist.callbacks.TensorBoard("logs", profile_batch=value)
    theirs = keras.callbacks.TensorBoard("logs", profile_batch=in_keras)
    assert (ours._start_batch, ours._stop_batch, ours._should_trace) == (
        theirs._start_batch, theirs._stop_batch, theirs._should_trace)


@pytest.mark.parametrize("profile, traced", [((9, 10), False), ((6, 7), True)])
def test_a_profile_range_beyond_the_run_is_a_warning_that_no_trace_was_written(
        tmp_path, capsys, profile, traced):
    """2 epochs of 4 batches (Keras counts 1 to 8 across epochs): batches 9-10 are never
    reached: no trace on disk and one warning naming the range and the 8 batches; 6-7
    (in the second epoch) writes a trace and no warning."""
    import tfdist

    begun = []
    fit(small_model(), begun, tfdist.callbacks.TensorBoard(tmp_path, profile_batch=profile))
    assert len(begun) == 8
    traces = [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith(".xplane.pb")]
    assert len(traces) == int(traced), traces
    warned = [line for line in capsys.readouterr().out.splitlines() if "no profiler trace" in line]
    assert warned == ([] if traced else [
        "tfdist.callbacks.TensorBoard: no profiler trace was written: profile_batch=(9, 10) "
        "was not reached, the run had 8 train batches (counted from 1 across epochs)"])


# --- a resumed run's logs: every epoch once, one header ------------------------------------

def preempted_at(epoch, batch):
    """A callback that SIGTERMs this process after step `batch` of `epoch` (once)."""
    import signal

    import keras

    from tfdist.step.preemption import skipping

    class SignalAt(keras.callbacks.Callback):
        def on_epoch_begin(self, e, logs=None):
            self.epoch = e

        def on_train_batch_end(self, b, logs=None):
            if not skipping(self.model, self.epoch, b) and (self.epoch, b) == (epoch, batch):
                os.kill(os.getpid(), signal.SIGTERM)

    return SignalAt()


def backed_up_fit(strategy, callbacks, metrics=(), epochs=3):
    """A fit of 4 steps an epoch under `strategy`; its History."""
    import keras

    import tfdist

    keras.utils.set_random_seed(0)
    with strategy.scope():
        net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        net.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.01), "none"),
                    "mse", metrics=list(metrics))
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    return net.fit(x, x[:, :1], batch_size=4, epochs=epochs, verbose=0, shuffle=False,
                   callbacks=callbacks)


def test_a_stop_agreed_at_an_epochs_last_step_keeps_its_row_and_scalars(tmp_path, strategies):
    """BackupAndRestore before the logs in the list, a stop agreed at epoch 1's last step:
    the CSV row and the event files' scalars of epoch 1 are written before the run exits
    (the resumed run starts at epoch 2: they would never be)."""
    import tfdist
    from tfdist.step.preemption import Preempted

    strategy = strategies("mirrored")

    def callbacks(*extra):
        return [tfdist.callbacks.BackupAndRestore(str(tmp_path / "backup")),
                tfdist.callbacks.CSVLogger(str(tmp_path / "log.csv"), append=True),
                tfdist.callbacks.TensorBoard(str(tmp_path / "board")), *extra]

    with pytest.raises(Preempted):
        backed_up_fit(strategy, callbacks(preempted_at(1, 3)))
    with open(tmp_path / "log.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["0", "1"]
    history = backed_up_fit(strategy, callbacks())
    assert list(history.epoch) == [2]
    with open(tmp_path / "log.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["0", "1", "2"]
    assert [step for step, _ in scalars(tmp_path / "board" / "train")["epoch_loss"]] == [0, 1, 2]


def test_appending_rows_of_other_figures_keeps_one_header_for_every_row(tmp_path, strategies):
    """A run appended to a CSV file whose header has fewer columns (a resumed run with more
    figures: another number of workers) rewrites the header with them, the earlier rows
    "NA" there; a later run with fewer figures writes "NA" where it has none. Every row has
    the header's number of fields, each value under its own name."""
    import tfdist

    strategy, path = strategies("mirrored"), tmp_path / "log.csv"
    first = backed_up_fit(strategy, [tfdist.callbacks.CSVLogger(str(path), append=True)],
                          epochs=1)
    second = backed_up_fit(strategy, [tfdist.callbacks.CSVLogger(str(path), append=True)],
                           metrics=["mae"], epochs=1)
    backed_up_fit(strategy, [tfdist.callbacks.CSVLogger(str(path), append=True)], epochs=1)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["epoch", "loss", "val_loss", "mae", "val_mae"]
    assert {len(row) for row in rows} == {5}, rows
    table = [dict(zip(rows[0], row)) for row in rows[1:]]
    assert float(table[0]["loss"]) == pytest.approx(first.history["loss"][0])
    assert table[0]["mae"] == "NA" and table[2]["mae"] == "NA"
    assert float(table[1]["mae"]) == pytest.approx(second.history["mae"][0])
    assert float(table[1]["loss"]) == pytest.approx(second.history["loss"][0])
