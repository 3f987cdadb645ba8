"""TensorFlow's own tutorials, as written, on real worker processes with tfdist's callbacks.

"Distributed training with Keras" (tests/e2e/jobs/keras_tutorial_job.py) on 2
MultiWorkerMirroredStrategy workers started by `tfdist launch` on free localhost ports:
fit with ModelCheckpoint writing each epoch, then on every worker `load_weights` of the
latest checkpoint and `evaluate`, right after fit.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from paths import JOBS

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("jobs_path", "exec_tasks"),
              # one device loads the weights without the optimizer (compiled for evaluate)
              pytest.mark.filterwarnings("ignore:Skipping variable loading")]

JOB = JOBS / "keras_tutorial_job.py"
EPOCHS = 3


def run_tutorial(write_config, tmp_path, *args):
    """The tutorial on 2 workers; -> {task: result}. The tasks' TMPDIR is tmp_path/tmp."""
    out, scratch = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    scratch.mkdir()
    config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    run = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds", "5", "--",
         sys.executable, str(JOB), "--out", str(out), "--epochs", str(EPOCHS), *args],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, TMPDIR=str(scratch)))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert os.listdir(scratch) == [], "a worker's scratch was left"
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}, out


def test_every_worker_reads_the_chiefs_last_checkpoint_right_after_fit(write_config, tmp_path):
    """The chief writes its last checkpoint 3 s late (a slow disk): no worker leaves fit
    before that write is complete, so each loads the last epoch's checkpoint — the chief's
    weights at the end of fit — and evaluates alike, as one device does on the same file."""
    import keras
    from keras_tutorial_job import eval_data, make_model

    results, out = run_tutorial(write_config, tmp_path, "--slow_last_write", "3")
    assert set(results) == {"worker-0", "worker-1"}
    chief, worker = results["worker-0"], results["worker-1"]
    last = f"ckpt_{EPOCHS}.weights.h5"
    assert chief["loaded"] == worker["loaded"] == last, (chief["loaded"], worker["loaded"])
    assert sorted(os.listdir(out / "training_checkpoints")) == [
        f"ckpt_{e}.weights.h5" for e in range(1, EPOCHS + 1)], "the chief alone wrote there"
    assert worker["loaded_checksum"] == chief["loaded_checksum"] == chief["fitted_checksum"]
    assert worker["eval_loss"] == chief["eval_loss"]
    assert worker["eval_accuracy"] == chief["eval_accuracy"]
    # one device, plain Keras, the same file: the same evaluation
    model = make_model()
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.load_weights(str(out / "training_checkpoints" / last))
    x, y = eval_data()
    loss, accuracy = model.evaluate(x, y, batch_size=chief["global_batch"], verbose=0)
    np.testing.assert_allclose(chief["eval_loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(chief["eval_accuracy"], accuracy, rtol=1e-6)


def test_tfdist_callbacks_given_to_the_chief_alone_cost_nothing(write_config, tmp_path):
    """Horovod's habit (`if rank == 0: callbacks.append(...)`) with tfdist's ModelCheckpoint,
    TensorBoard and CSVLogger: the chief announces its writes and never waits for workers
    that do not have them (a barrier there failed the job: the worker had left), so the job
    ends well and the chief reads its last checkpoint."""
    results, out = run_tutorial(write_config, tmp_path, "--chief_only")
    assert results["worker-0"]["loaded"] == f"ckpt_{EPOCHS}.weights.h5"
    assert results["worker-1"]["loaded"] is None  # it evaluates what it trained
    assert len((out / "log.csv").read_text().splitlines()) == EPOCHS + 1
