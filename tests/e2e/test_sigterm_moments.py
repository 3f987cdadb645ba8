"""A SIGTERM at any moment of a multi-worker job is honoured (issue 55, item 5): from the
moment tfdist builds the strategy to the script's exit, the signalled task saves where a
save means something and exits 143, or exits 143 at once where nothing trained — never a
job that "succeeded" (TensorFlow's own handler swallowed it before)."""

import os
import subprocess
import sys

import pytest
from paths import JOBS

pytestmark = pytest.mark.multiprocess
JOB = JOBS / "sigterm_job.py"
#: where the signalled task saves first (a backup, then 143) rather than exiting at once
SAVES = {"trace": "after step 1 of epoch 0", "validation": "at the end of epoch 1"}


@pytest.mark.parametrize("moment", ["get_strategy", "model", "restore", "trace", "validation",
                                    "after_fit"])
def test_a_sigterm_at_any_moment_ends_the_task_with_143_never_success(write_config, tmp_path,
                                                                      moment):
    out = tmp_path / "out"
    out.mkdir()
    config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    run = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds", "5", "--",
         sys.executable, str(JOB), "--at", moment, "--out", str(out)],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3"))
    said = run.stdout + run.stderr
    assert run.returncode != 0, said[-3000:]
    assert "exited with code 143" in said, said[-3000:]
    assert "succeeded" not in said.lower(), said[-3000:]
    assert not (out / "done-worker-1").exists()  # the signalled task went no further
    if moment in SAVES:
        assert f"tfdist: preempted: saved the backup {SAVES[moment]}" in said, said[-3000:]
    else:
        assert "nothing to save; exiting with code 143" in said, said[-3000:]
