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
import time

import pytest

from tfdist.checkpoint import CheckpointError, CheckpointStore

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["checkpoint-3", "checkpoint-4", "latest"]


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
