"""Atomic checkpoints (tfdist/checkpoint/store.py): a kill at any moment of a save never
loses the previous good checkpoint; a damaged one is named in one line and skipped."""

import hashlib
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tfdist.checkpoint import CheckpointError, CheckpointStore
from paths import ROOT



def write_payload(step, size=1 << 16):
    def write(path):
        data = hashlib.sha256(str(step).encode()).digest() * (size // 32)
        pathlib.Path(path, "weights.bin").write_bytes(data)
    return write


def read_payload(path, metadata):
    data = pathlib.Path(path, "weights.bin").read_bytes()
    expected = hashlib.sha256(str(metadata["step"]).encode()).digest()
    if data[:32] != expected or len(data) != metadata["size"]:
        raise OSError(f"truncated file {path}/weights.bin")
    return metadata["step"]


def test_the_newest_complete_checkpoint_is_loaded_and_two_are_kept(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.load(read_payload) is None  # nothing yet: a fresh start
    for step in range(1, 5):
        store.save(write_payload(step), {"step": step, "size": 1 << 16})
    path, metadata, value = store.load(read_payload)
    assert value == metadata["step"] == 4 and path.endswith("checkpoint-4")
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".lock", "checkpoint-3", "checkpoint-4",
                                                     "latest"]  # the lock: while it writes


def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_used(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt")
    for step in (1, 2):
        store.save(write_payload(step), {"step": step, "size": 1 << 16})
    newest = tmp_path / "ckpt" / "checkpoint-2" / "weights.bin"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated behind tfdist's back
    said = []
    _, _, value = store.load(read_payload, warn=said.append)
    assert value == 1
    assert len(said) == 1 and "\n" not in said[0] and "checkpoint-2" in said[0]
    (tmp_path / "ckpt" / "checkpoint-1" / "metadata.json").write_text("{")
    with pytest.raises(CheckpointError, match="none can be read"):
        store.load(read_payload, warn=said.append)


def test_a_checkpoint_that_does_not_fit_is_an_error_not_a_fallback(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt")
    store.save(write_payload(1), {"step": 1, "size": 1 << 16})

    def refuse(path, metadata):
        raise CheckpointError("it holds another model")

    with pytest.raises(CheckpointError, match="another model"):
        store.load(refuse)


SAVER = """
import hashlib, pathlib, sys, time
sys.path.insert(0, sys.argv[2])
from tfdist.checkpoint import CheckpointStore
store = CheckpointStore(sys.argv[1])
step = len(store.candidates()) and 1000
while True:
    step += 1
    def write(path, step=step):
        data = hashlib.sha256(str(step).encode()).digest() * (1 << 15)  # 1 MiB
        with open(pathlib.Path(path, "weights.bin"), "wb") as f:
            for i in range(0, len(data), 1 << 16):
                f.write(data[i:i + (1 << 16)])
    store.save(write, {"step": step, "size": 1 << 20})
    print(step, flush=True)
"""


def test_a_kill_at_any_moment_of_a_save_leaves_a_good_checkpoint(tmp_path):
    """10 SIGKILLs at random moments of a process that saves 1 MiB checkpoints back to
    back: every time, the store loads a complete checkpoint, never an older one than the
    last save that finished."""
    directory = tmp_path / "ckpt"
    rng = random.Random(0)
    for attempt in range(10):
        saver = subprocess.Popen([sys.executable, "-c", SAVER, str(directory), str(ROOT)],
                                 stdout=subprocess.PIPE, text=True)
        try:
            first = saver.stdout.readline()  # at least one save done
            assert first.strip(), "the saver died"
            time.sleep(rng.uniform(0.0, 0.05))
        finally:
            saver.send_signal(signal.SIGKILL)
            saver.wait(timeout=30)
        finished = [int(line) for line in [first, *saver.stdout.read().split()] if line.strip()]
        _, metadata, value = CheckpointStore(directory).load(
            read_payload, warn=lambda line: pytest.fail(line))
        assert value == metadata["step"] >= max(finished), attempt
    leftovers = [n for n in os.listdir(directory) if n.startswith(".incomplete-")]
    CheckpointStore(directory).save(write_payload(1), {"step": 1, "size": 1 << 16})
    assert all(not n.startswith(".incomplete-") for n in os.listdir(directory)), leftovers
    json.loads((directory / pathlib.Path(
        CheckpointStore(directory).candidates()[0]).name / "metadata.json").read_text())


# --- a directory shared with the user's files and with other runs ----------------------

RUN_A = {"id": "run-a", "command": ["train.py", "--seed", "1"], "model": "unet"}
RUN_B = {"id": "run-b", "command": ["train.py", "--seed", "2"], "model": "unet"}


def tree(directory):
    """Every path under `directory` with its bytes (None for a directory)."""
    found = {}
    for root, dirs, names in os.walk(directory):
        for name in dirs:
            found[os.path.relpath(os.path.join(root, name), directory)] = None
        for name in names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, directory)] = pathlib.Path(path).read_bytes()
    return found


def project(tmp_path):
    """A project directory as a user has one: a config, notes, data, a hidden file."""
    directory = tmp_path / "project"
    (directory / "data").mkdir(parents=True)
    (directory / "config.yaml").write_text("strategy: mirrored\n")
    (directory / "notes.md").write_text("seed 1 looked best\n")
    (directory / "data" / "shard-0").write_bytes(os.urandom(1000))
    (directory / ".env").write_text("X=1\n")
    (directory / "checkpoint-notes").write_text("mine\n")  # a name close to the store's
    return directory


def test_remove_takes_only_what_the_store_wrote_and_leaves_the_directory(tmp_path):
    directory = project(tmp_path)
    before = tree(directory)
    store = CheckpointStore(directory, run=RUN_A)
    for step in range(1, 4):
        store.save(write_payload(step), {"step": step, "size": 1 << 16})
    assert {"checkpoint-2", "checkpoint-3", "latest", "run.json"} <= set(os.listdir(directory))
    store.remove()
    assert tree(directory) == before  # every file of the user's, byte for byte, and no other
    store.remove()  # twice: nothing left of its own, nothing else touched
    assert tree(directory) == before


def test_a_second_run_is_refused_in_one_line_naming_whose_backups_they_are(tmp_path):
    directory = tmp_path / "backup"
    first = CheckpointStore(directory, run=RUN_A)
    first.save(write_payload(1), {"step": 1, "size": 1 << 16})
    first.release()
    second = CheckpointStore(directory, run=RUN_B)
    for attempt in (second.claim, lambda: second.load(read_payload), second.check_run,
                    lambda: second.save(write_payload(9), {"step": 9, "size": 1 << 16})):
        with pytest.raises(CheckpointError) as refused:
            attempt()
        message = str(refused.value)
        assert "\n" not in message and "another run" in message and "run-a" in message
        assert "--seed 1" in message and "another directory" in message
    assert sorted(n for n in os.listdir(directory) if n.startswith("checkpoint-")) == \
        ["checkpoint-1"]  # nothing of the first run's touched
    again = CheckpointStore(directory, run=dict(RUN_A))  # the same run, relaunched
    assert again.load(read_payload)[2] == 1


def test_a_checkpoint_of_another_run_or_not_of_a_store_is_named_and_left_alone(tmp_path):
    directory = tmp_path / "backup"
    store = CheckpointStore(directory, run=RUN_A)
    store.save(write_payload(1), {"step": 1, "size": 1 << 16})
    planted = directory / "checkpoint-999999999999999999"  # 18 digits: the largest name
    planted.mkdir()
    (planted / "metadata.json").write_text(json.dumps({"step": 5, "size": 1 << 16}))
    other = directory / "checkpoint-7"
    other.mkdir()
    (other / "metadata.json").write_text(json.dumps(
        {"step": 7, "size": 1 << 16, "checkpoint": {"run": "run-b", "serial": 7}}))
    for step in (2, 3):  # later backups are not hidden behind the planted names
        store.save(write_payload(step), {"step": step, "size": 1 << 16})
    said = []
    path, _, value = store.load(read_payload, warn=said.append)
    assert value == 3 and os.path.basename(path) == "checkpoint-3"
    fresh = CheckpointStore(directory, run=RUN_A)
    said = []
    pointer = directory / "latest"
    pointer.write_text("checkpoint-999999999999999999\n")  # even when latest names it
    assert fresh.load(read_payload, warn=said.append)[2] == 3
    assert len(said) == 2 and all("\n" not in line and "leaving" in line for line in said)
    assert any("999999999999999999" in line and "not written by" in line for line in said)
    assert any("checkpoint-7" in line and "another run" in line for line in said)
    store.remove()
    assert sorted(os.listdir(directory)) == ["checkpoint-7", "checkpoint-999999999999999999",
                                             "latest"]  # the planted pointer is not its own


HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[2])
from tfdist.checkpoint import CheckpointStore
store = CheckpointStore(sys.argv[1], run={"id": sys.argv[3]})
store.claim()
print("held", flush=True)
time.sleep(120)
"""


def test_one_writer_at_a_time_and_a_killed_writer_leaves_no_lock(tmp_path):
    directory = tmp_path / "backup"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), str(ROOT), "run-a"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for run in (RUN_A, RUN_B):  # the same run twice at once is refused too
            with pytest.raises(CheckpointError) as refused:
                CheckpointStore(directory, run=run).save(write_payload(1),
                                                         {"step": 1, "size": 1 << 16})
            message = str(refused.value)
            assert "\n" not in message and "in use by another run" in message
            assert f"pid {holder.pid}" in message and "another directory" in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    store = CheckpointStore(directory, run=RUN_A)  # the kernel let go of the killed one's
    store.save(write_payload(1), {"step": 1, "size": 1 << 16})
    assert store.load(read_payload)[2] == 1


def test_one_process_shares_the_lock_within_a_run_and_refuses_another_run(tmp_path):
    directory = tmp_path / "backup"
    first, again = CheckpointStore(directory, run=RUN_A), CheckpointStore(directory, run=RUN_A)
    first.claim()
    again.save(write_payload(1), {"step": 1, "size": 1 << 16})  # one run, one process
    with pytest.raises(CheckpointError, match="another run of this process"):
        CheckpointStore(tmp_path / "backup", run=RUN_B).claim()
    again.release()
    first.release()
    CheckpointStore(directory, run=RUN_A).claim().release()


class PlantedNames:
    """`tempfile`'s candidate names made predictable, a symlink planted under each of the
    first ones: what an attacker who guessed them would have done."""

    def __init__(self, monkeypatch, directory, target, count=3):
        names = [f"guess{i}" for i in range(count)] + [f"free{i}" for i in range(100)]
        self.planted = []
        for prefix in (".tfdist-tmp-", ".incomplete-"):
            for name in names[:count]:
                link = directory / f"{prefix}{name}"
                link.symlink_to(target)
                self.planted.append(link)
        monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(names))


def test_no_temporary_name_is_followed_through_a_planted_symlink(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "passwd"
    victim.write_text("root:x:0:0\n")
    directory = tmp_path / "backup"
    directory.mkdir()
    old_style = directory / f"latest.tmp-{os.getpid()}"  # the name it once used
    old_style.symlink_to(victim)
    (directory / "latest").symlink_to(victim)  # the pointer itself: replaced, not followed
    planted = PlantedNames(monkeypatch, directory, victim)
    store = CheckpointStore(directory, run=RUN_A)
    for step in (1, 2, 3):
        store.save(write_payload(step), {"step": step, "size": 1 << 16})
    assert victim.read_text() == "root:x:0:0\n" and sorted(os.listdir(outside)) == ["passwd"]
    assert store.load(read_payload)[2] == 3
    assert not os.path.islink(directory / "latest")
    assert all(os.path.islink(link) for link in planted.planted)  # left as they were


def test_a_planted_symlink_as_the_lock_or_the_run_is_refused_in_one_line(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    for name, fragment in ((".lock", "symlink"), ("run.json", "cannot be read")):
        directory = tmp_path / name.strip(".")
        directory.mkdir()
        (directory / name).symlink_to(victim)
        with pytest.raises(CheckpointError) as refused:
            CheckpointStore(directory, run=RUN_A).claim()
        assert fragment in str(refused.value) and "\n" not in str(refused.value)
    assert victim.read_text() == "keep\n"


def finishes(function, seconds=60):
    """Runs `function` in a thread; its result or exception, or a failure if it hangs."""
    import threading

    outcome = {}

    def run():
        try:
            outcome["value"] = function()
        except BaseException as error:  # noqa: BLE001
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{function} hangs"
    return outcome


@pytest.mark.parametrize("name", ["latest", "metadata.json", "run.json"])
def test_a_fifo_in_place_of_a_file_is_named_never_waited_on(tmp_path, name):
    directory = tmp_path / "backup"
    store = CheckpointStore(directory, run=RUN_A)
    for step in (1, 2):
        store.save(write_payload(step), {"step": step, "size": 1 << 16})
    store.release()
    path = {"latest": directory / "latest", "run.json": directory / "run.json",
            "metadata.json": directory / "checkpoint-2" / "metadata.json"}[name]
    path.unlink()
    os.mkfifo(path)
    said = []
    outcome = finishes(lambda: CheckpointStore(directory, run=RUN_A).load(
        read_payload, warn=said.append))
    if name == "run.json":
        assert isinstance(outcome.get("error"), CheckpointError)
        assert "FIFO" in str(outcome["error"]) and "\n" not in str(outcome["error"])
    else:
        assert outcome["value"][2] == (1 if name == "metadata.json" else 2)
        assert all("FIFO" in line for line in said) and len(said) == (name != "latest")


def test_metadata_too_large_or_not_json_numbers_is_named_and_skipped(tmp_path):
    directory = tmp_path / "backup"
    store = CheckpointStore(directory, keep=3)
    for step in (1, 2, 3):
        store.save(write_payload(step), {"step": step, "size": 1 << 16})
    (directory / "checkpoint-3" / "metadata.json").write_bytes(b" " * (2 << 20) + b"{}")
    (directory / "checkpoint-2" / "metadata.json").write_text(
        '{"step": NaN, "size": 65536, "checkpoint": {"run": null, "serial": 2}}')
    said = []
    assert store.load(read_payload, warn=said.append)[2] == 1
    assert len(said) == 2 and "more than" in said[0] and "NaN" in said[1]


@pytest.mark.parametrize("metadata, where", [
    ({"step": 2, "hooks": [{"link": [float("inf"), 0.0]}]},
     "inf is not a JSON number (at ['hooks'][0]['link'][0])"),
    ({"step": float("nan")}, "nan is not a JSON number (at ['step'])"),
    ({"step": 2, "state": object()}, "object is not (at ['state'])")])
def test_metadata_that_would_not_read_back_is_refused_before_anything_is_written(
        tmp_path, metadata, where):
    """A non-finite number (what auto's free link was, under load) is named by its place,
    before the weights are written: no staging directory left, the last backup kept."""
    directory = tmp_path / "backup"
    store = CheckpointStore(directory)
    store.save(write_payload(1), {"step": 1, "size": 1 << 16})
    before = sorted(p.name for p in directory.iterdir())
    written = []
    with pytest.raises(CheckpointError, match="metadata must be JSON") as error:
        store.save(lambda path: written.append(path), metadata)
    assert where in str(error.value) and "\n" not in str(error.value)
    assert not written and sorted(p.name for p in directory.iterdir()) == before
    assert store.load(read_payload)[2] == 1


@pytest.mark.parametrize("run", [{"id": ""}, {"id": 3}, {"name": "x"}, "run-a", ["run-a"]])
def test_a_run_without_a_string_id_is_refused(tmp_path, run):
    with pytest.raises(ValueError, match="string 'id'"):
        CheckpointStore(tmp_path, run=run)


def test_a_backup_directory_that_is_a_file_is_refused_before_anything(tmp_path):
    path = tmp_path / "backup"
    path.write_text("not a directory\n")
    store = CheckpointStore(path, run=RUN_A)
    for attempt in (store.claim, lambda: store.load(read_payload),
                    lambda: store.save(write_payload(1), {"step": 1, "size": 1 << 16})):
        with pytest.raises(CheckpointError, match="is not a directory"):
            attempt()
    assert path.read_text() == "not a directory\n"
