"""`BackupAndRestore` and `ModelBackup` under hostile hands (tfdist/keras/backup.py,
tfdist/keras/callbacks/backup_and_restore.py): the user's files in `backup_dir` are safe,
one run per directory, every file and field of a backup read as hostile input, a backup
of another precision policy refused in one line. The store's own hostile cases (locks,
symlinks, FIFOs, planted names): tests/unit/checkpoint/test_checkpoint_store.py."""

import json
import os
import signal

import keras
import numpy as np
import pytest

import tfdist
from tfdist.checkpoint import CheckpointError
from tfdist.step.preemption import Preempted, skipping

pytestmark = pytest.mark.usefixtures("two_cpus")
STEPS, BATCH, EPOCHS = 4, 16, 3


class SignalAt(keras.callbacks.Callback):
    """SIGTERM to this process after step `batch` of `epoch`."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if not skipping(self.model, self.epoch, batch) and (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def compiled(strategy, width=8):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(0.01), "none"),
                      "mse")
    return model


def fit(model, backup, *callbacks, epochs=EPOCHS):
    x, y = data()
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, shuffle=False,
                     callbacks=[*callbacks, backup])


def preempted_run(strategy, directory, **backup):
    """A run preempted after step 1 of epoch 1: its backup stays in `directory`."""
    with pytest.raises(Preempted):
        fit(compiled(strategy), tfdist.callbacks.BackupAndRestore(str(directory), **backup),
            SignalAt(1, 1))


def tree(directory):
    found = {}
    for root, dirs, names in os.walk(directory):
        for name in dirs:
            found[os.path.relpath(os.path.join(root, name), directory)] = None
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = f.read()
    return found


def project(tmp_path):
    directory = tmp_path / "project"
    (directory / "data").mkdir(parents=True)
    (directory / "config.yaml").write_text("strategy: mirrored\n")
    (directory / "notes.md").write_text("notes\n")
    (directory / "data" / "shard-0").write_bytes(os.urandom(512))
    return directory


def test_a_finished_run_leaves_every_file_of_the_users_in_backup_dir(strategies, tmp_path):
    directory = project(tmp_path)
    before = tree(directory)
    preempted_run(strategies("mirrored"), directory)  # a backup there, then resumed to the end
    assert any(name.startswith("checkpoint-") for name in os.listdir(directory))
    fit(compiled(strategies("mirrored")), tfdist.callbacks.BackupAndRestore(str(directory)))
    assert tree(directory) == before


def test_a_finished_run_can_leave_its_final_backup_and_the_same_run_has_nothing_to_train(
        strategies, tmp_path, capfd):
    directory = tmp_path / "backup"
    fit(compiled(strategies("mirrored")),
        tfdist.callbacks.BackupAndRestore(str(directory), delete_checkpoint=False))
    metadata = json.loads((directory / "checkpoint-3" / "metadata.json").read_text())
    assert metadata["epoch"] == EPOCHS
    history = fit(compiled(strategies("mirrored")),
                  tfdist.callbacks.BackupAndRestore(str(directory), delete_checkpoint=False))
    assert history.history == {} and "nothing is left to train" in capfd.readouterr().out


def test_another_run_is_refused_in_one_line_and_the_first_still_resumes(strategies, tmp_path):
    strategy, directory = strategies("mirrored"), tmp_path / "backup"
    preempted_run(strategy, directory, run={"seed": 1})
    for other in (dict(run={"seed": 2}), dict(model=compiled(strategy, width=16))):
        model = other.get("model") or compiled(strategy)
        with pytest.raises(CheckpointError) as refused:
            fit(model, tfdist.callbacks.BackupAndRestore(str(directory),
                                                         run=other.get("run", {"seed": 1})))
        message = str(refused.value)
        assert "\n" not in message and "another run" in message and "another directory" in \
            message and "sequential" in message  # whose they are: the model's name
    resumed = compiled(strategy)
    history = fit(resumed, tfdist.callbacks.BackupAndRestore(str(directory), run={"seed": 1}))
    assert len(history.history["loss"]) == 2  # epochs 1 (the rest of it) and 2
    clean = compiled(strategy)
    x, y = data()
    clean.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False)
    for a, b in zip(resumed.weights, clean.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("saved, resumed", [("float32", "mixed_float16"),
                                            ("mixed_float16", "float32")])
def test_a_backup_of_another_precision_policy_is_refused_in_one_line(strategies, tmp_path,
                                                                     request, saved, resumed):
    request.addfinalizer(lambda: keras.mixed_precision.set_global_policy("float32"))
    strategy, directory = strategies("mirrored"), tmp_path / "backup"
    keras.mixed_precision.set_global_policy(saved)
    preempted_run(strategy, directory)
    keras.mixed_precision.set_global_policy(resumed)
    with pytest.raises(CheckpointError) as refused:
        fit(compiled(strategy), tfdist.callbacks.BackupAndRestore(str(directory)))
    message = str(refused.value)
    assert "\n" not in message and f"'{saved}' precision policy" in message
    assert f"trains under '{resumed}'" in message


def planted(directory, edit):
    """The newest checkpoint's metadata, edited by `edit` (a dict in, a dict out)."""
    newest = (directory / "latest").read_text().strip()
    path = directory / newest / "metadata.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


@pytest.mark.parametrize("field, value, fragment", [
    ("batch", "3", "after step '3'"),
    ("batch", 1_000_000, "after step 1000000"),
    ("batch", 2**70, "after step"),
    ("batch", -1, "after step -1"),
    ("epoch", 1.0, "of epoch 1.0"),
    ("epoch", True, "of epoch True"),
    ("steps", 2**70, "not a step count"),
    ("steps", "9", "not a step count"),
    ("hooks", {"a": 1}, "not a list"),
    ("seeds", [[1, 2]], "not the random state of this model's 0 seed generators"),
    ("seeds", "12", "not the random state"),
    ("replica_state", "abc", "not a list of digests"),
    ("replica_state", [1], "not a list of digests"),
])
def test_every_field_of_a_backups_metadata_is_checked(strategies, tmp_path, field, value,
                                                      fragment):
    strategy, directory = strategies("mirrored"), tmp_path / "backup"
    preempted_run(strategy, directory)
    planted(directory, lambda metadata: {**metadata, field: value})
    with pytest.raises(CheckpointError) as refused:
        fit(compiled(strategy), tfdist.callbacks.BackupAndRestore(str(directory)))
    assert fragment in str(refused.value) and "\n" not in str(refused.value)


def test_a_fifo_as_the_weights_file_is_named_and_the_previous_backup_used(
        strategies, tmp_path, capfd):
    strategy, directory = strategies("mirrored"), tmp_path / "backup"
    preempted_run(strategy, directory, save_freq=1)  # several backups: the previous one used
    newest = directory / (directory / "latest").read_text().strip()
    (newest / "backup.weights.h5").unlink()
    os.mkfifo(newest / "backup.weights.h5")
    fit(compiled(strategy), tfdist.callbacks.BackupAndRestore(str(directory)))  # no hang
    out = capfd.readouterr().out
    assert f"skipping checkpoint {newest}" in out and "FIFO" in out


def test_replica_state_of_another_layout_is_judged_from_its_headers_before_loading(
        strategies, tmp_path, capfd):
    strategy, directory = strategies("mirrored"), tmp_path / "backup"

    with pytest.raises(Preempted):
        fit(topk_model(strategy), tfdist.callbacks.BackupAndRestore(str(directory)),
            SignalAt(1, 1))
    newest = directory / (directory / "latest").read_text().strip()
    with np.load(newest / "replica_state.npz") as saved:
        arrays = [saved[name] for name in sorted(saved.files)]
    huge = np.lib.format.open_memmap(tmp_path / "huge.npy", mode="w+", dtype="float32",
                                     shape=(2, 1 << 26))  # 512 MiB declared, sparse on disk
    del huge
    import zipfile

    with zipfile.ZipFile(newest / "replica_state.npz", "w") as archive:
        archive.write(tmp_path / "huge.npy", "arr_0.npy")
        for i, array in enumerate(arrays[1:], 1):
            with archive.open(f"arr_{i}.npy", "w") as member:
                np.lib.format.write_array(member, array)
    fit(topk_model(strategy), tfdist.callbacks.BackupAndRestore(str(directory)))
    out = capfd.readouterr().out
    assert "more than" in out or "another layout" in out  # refused before 512 MiB is read


@pytest.mark.parametrize("arguments, fragment", [
    (dict(save_freq=-1), "save_freq must be 'epoch' or a positive"),
    (dict(save_freq=0), "save_freq must be 'epoch' or a positive"),
    (dict(save_freq=True), "save_freq must be 'epoch' or a positive"),
    (dict(save_freq="batch"), "save_freq must be 'epoch' or a positive"),
    (dict(preemption=1.0), "preemption must be True or False"),
    (dict(delete_checkpoint="no"), "delete_checkpoint must be True or False"),
    (dict(run=object()), "run must be"),
    (dict(run={1: "a"}), "string keys"),
    (dict(backup_dir=""), "non-empty path"),
    (dict(backup_dir="a\0b"), "without NUL"),
])
def test_bad_arguments_are_refused_in_one_line_before_training(tmp_path, arguments, fragment):
    arguments = {"backup_dir": str(tmp_path / "backup"), **arguments}
    with pytest.raises(ValueError) as refused:
        tfdist.callbacks.BackupAndRestore(**arguments)
    assert fragment in str(refused.value) and "\n" not in str(refused.value)


def test_a_backup_dir_that_is_a_file_is_refused_before_training(tmp_path):
    path = tmp_path / "backup"
    path.write_text("mine\n")
    with pytest.raises(ValueError, match="must be a directory"):
        tfdist.callbacks.BackupAndRestore(str(path))
    assert path.read_text() == "mine\n"


def recursive():
    value = {}
    value["self"] = value
    return value


@pytest.mark.parametrize("metadata, fragment", [
    ({"state": recursive()}, "at most 64 deep"),
    ({"state": {1: "one"}}, "string keys"),
    ({"state": [float("inf")]}, "not a JSON number"),
    ({"state": {"a": {1, 2}}}, "set is not"),
])
def test_model_backup_refuses_metadata_that_would_not_read_back(strategies, tmp_path, metadata,
                                                                fragment):
    backup = tfdist.keras.ModelBackup(str(tmp_path / "backup"), compiled(strategies("mirrored")))
    with pytest.raises(ValueError) as refused:
        backup.save(**metadata)
    assert fragment in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "backup").exists()


def test_model_backup_refuses_another_runs_directory_in_one_line(strategies, tmp_path):
    strategy = strategies("mirrored")
    first = tfdist.keras.ModelBackup(str(tmp_path / "backup"), compiled(strategy), run="a")
    first.save(step=1)
    first.close()
    other = tfdist.keras.ModelBackup(str(tmp_path / "backup"), compiled(strategy), run="b")
    with pytest.raises(CheckpointError, match="another run"):
        other.restore()
    again = tfdist.keras.ModelBackup(str(tmp_path / "backup"), compiled(strategy), run="a")
    assert again.restore()["step"] == 1


def topk_model(strategy):
    """A model whose exchange keeps per-replica state (error feedback's residuals)."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                                  keras.layers.Dense(1)])
        model.compile(tfdist.keras.DistributedOptimizer(
            keras.optimizers.SGD(0.01), "topk", ratio=0.5, error_feedback=True,
            min_size=0), "mse")
    return model


def residuals_backup(strategy, directory):
    """A topk run preempted after step 1 of epoch 1; returns its newest checkpoint and the
    residuals it saved."""
    with pytest.raises(Preempted):
        fit(topk_model(strategy), tfdist.callbacks.BackupAndRestore(str(directory)),
            SignalAt(1, 1))
    newest = directory / (directory / "latest").read_text().strip()
    with np.load(newest / "replica_state.npz") as saved:
        return newest, [saved[f"arr_{i}"] for i in range(len(saved.files))]


def rewrite_npz(path, arrays, edit=lambda name, raw: raw):
    """Writes `arrays` as np.savez does, each member's bytes passed through `edit`."""
    import io
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for i, array in enumerate(arrays):
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, array, allow_pickle=True)
            archive.writestr(f"arr_{i}.npy", edit(f"arr_{i}.npy", buffer.getvalue()))


def test_replica_state_whose_header_says_another_dtype_is_refused_naming_the_file(
        strategies, tmp_path):
    strategy, directory = strategies("mirrored"), tmp_path / "backup"
    newest, arrays = residuals_backup(strategy, directory)
    assert arrays[0].dtype == np.float32
    # the header says int32, the float32 bytes are untouched (same size)
    rewrite_npz(newest / "replica_state.npz", arrays,
                lambda name, raw: raw.replace(b"'<f4'", b"'<i4'", 1))
    with np.load(newest / "replica_state.npz") as planted:
        assert planted["arr_0"].dtype == np.int32  # what a loader without the check takes
    with pytest.raises(CheckpointError) as refused:
        fit(topk_model(strategy), tfdist.callbacks.BackupAndRestore(str(directory)))
    message = str(refused.value)
    assert "\n" not in message and str(newest / "replica_state.npz") in message
    assert "int32" in message and "float32" in message


def test_pickle_bait_replica_state_is_refused_naming_the_file_and_never_unpickled(
        strategies, tmp_path):
    strategy, directory = strategies("mirrored"), tmp_path / "backup"
    newest, arrays = residuals_backup(strategy, directory)
    marker = tmp_path / "unpickled"

    class Bait:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bait = [np.array([Bait() for _ in range(int(np.prod(a.shape)))], dtype=object).reshape(
        a.shape) for a in arrays]
    rewrite_npz(newest / "replica_state.npz", bait)
    with pytest.raises(CheckpointError) as refused:
        fit(topk_model(strategy), tfdist.callbacks.BackupAndRestore(str(directory)))
    message = str(refused.value)
    assert "\n" not in message and str(newest / "replica_state.npz") in message
    assert "object" in message and not marker.exists()


def test_another_runs_exchange_state_planted_in_a_backup_is_refused(strategies, tmp_path):
    strategy = strategies("mirrored")
    newest, _ = residuals_backup(strategy, tmp_path / "backup")
    _, theirs = residuals_backup(strategy, tmp_path / "other")
    theirs = [a + 1.0 for a in theirs]  # another run's residuals: same layout, other values
    rewrite_npz(newest / "replica_state.npz", theirs)
    with pytest.raises(CheckpointError) as refused:
        fit(topk_model(strategy), tfdist.callbacks.BackupAndRestore(str(tmp_path / "backup")))
    message = str(refused.value)
    assert "\n" not in message and str(newest / "replica_state.npz") in message
    assert "not the one this backup wrote" in message


def test_a_tampered_batch_is_called_changed_not_another_run(strategies, tmp_path):
    strategy, directory = strategies("mirrored"), tmp_path / "backup"
    preempted_run(strategy, directory)
    planted(directory, lambda metadata: {**metadata, "batch": STEPS + 1})
    with pytest.raises(CheckpointError) as refused:
        fit(compiled(strategy), tfdist.callbacks.BackupAndRestore(str(directory)))
    message = str(refused.value)
    assert "\n" not in message and "another run" not in message
    assert "changed" in message and "metadata.json" in message
