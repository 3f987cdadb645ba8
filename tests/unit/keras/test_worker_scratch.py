"""Non-chief checkpoint scratch directories: private, unpredictable, cleaned after a kill."""

import json
import os
import pwd
import stat

import pytest

from tfdist.keras.callbacks.worker_scratch import WorkerScratch


@pytest.fixture
def worker_1(monkeypatch, tmp_path):
    """This process is worker:1 of a 2-worker cluster; the system temp dir is `tmp_path`."""
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:2001", "localhost:2002"]},
        "task": {"type": "worker", "index": 1}}))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    return tmp_path


def test_scratch_is_private_and_unpredictable(worker_1):
    first, second = WorkerScratch("backup"), WorkerScratch("backup")
    a = first.create(None)
    assert a is not None and os.path.dirname(a) == str(worker_1)
    assert stat.S_IMODE(os.stat(a).st_mode) == 0o700  # no other user reads the weights
    b = second.create(None)
    assert a != b and os.path.basename(a)[:-8] == os.path.basename(b)[:-8]
    assert not os.path.exists(a)  # the relaunched task removed its own leftover
    second.cleanup()
    assert not os.path.exists(b)


def test_a_directory_another_user_made_first_neither_blocks_nor_is_removed(worker_1):
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory as another user")
    scratch = WorkerScratch("backup")
    path = scratch.create(None)
    scratch.cleanup()
    squatter = path[:-8] + "squatter"  # the same prefix, as a squatter would guess it
    os.mkdir(squatter)
    nobody = pwd.getpwnam("nobody")
    os.chown(squatter, nobody.pw_uid, nobody.pw_gid)
    mine = scratch.create(None)
    assert os.path.isdir(mine) and mine != squatter
    assert os.path.isdir(squatter)  # not ours: left alone
    scratch.cleanup()


def test_the_chief_gets_no_scratch(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:2001", "localhost:2002"]},
        "task": {"type": "worker", "index": 0}}))
    assert WorkerScratch("backup").create(None) is None
