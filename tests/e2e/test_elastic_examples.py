"""The shipped examples under an elastic launch, as a user runs them: `tfdist launch job.yaml
--min-workers 3 -- python EXAMPLE --config job.yaml` with `cluster: {worker: 4}`. Worker 3
is SIGKILLed for good in epoch 2: the job goes on with 3 (the examples call
`tfdist.get_strategy(config)`, which accepts the launcher's resized TF_CONFIG; a global
batch of 16 over 3 workers is split 6/5/5 by `replica_batch_size`), then --discover says 4
and the place is taken back at an agreed step. Every step trains once (the optimizer's
count is epochs x steps) and every worker ends with the same weights."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from test_multiworker_training import task_pids
from paths import ROOT

pytestmark = pytest.mark.multiprocess

EPOCHS, STEPS = 6, 8
CLUSTER = "cluster: {worker: 4}\nstrategy: {name: multi_worker_mirrored, communication: ring}\n"
EXAMPLES = {  # script, config sections beside the cluster, flags
    "unet": ("examples/unet_segmentation/train.py",
             f"train: {{image_size: 16, batch_size: 16, epochs: {EPOCHS}, "
             f"steps_per_epoch: {STEPS}, validation_steps: 1, depth: 1, base_filters: 4}}\n",
             ()),
    "quickstart": ("examples/quickstart/train.py",
                   f"train: {{global_batch_size: 16, epochs: {EPOCHS}, "
                   f"steps_per_epoch: {STEPS}, learning_rate: 0.01, seed: 7}}\n", ()),
    "char_lm": ("examples/char_lm/train.py",
                f"train: {{batch_size: 16, epochs: {EPOCHS}, steps_per_epoch: {STEPS}, "
                "validation_steps: 1}\nlm: {sequence_length: 16, width: 16, layers: 1, "
                "heads: 2}\n", ()),
}


class ElasticRun:
    """`tfdist launch` of an example in the background, its output gathered as it comes."""

    def __init__(self, tmp_path, name):
        script, sections, flags = EXAMPLES[name]
        self.out, backup, self.avail = tmp_path / "out", tmp_path / "backup", tmp_path / "avail"
        self.out.mkdir()
        self.avail.write_text("3\n")
        config = tmp_path / "job.yaml"
        config.write_text(CLUSTER + sections)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfdist", "launch", str(config), "--grace-seconds", "5",
             "--min-workers", "3", "--rejoin-seconds", "0", "--discover", f"cat {self.avail}",
             "--", sys.executable, script, "--config", str(config),
             "--output_dir", str(self.out), "--backup_dir", str(backup), *flags],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, TFDIST_TEST_OUT=str(self.out), TMPDIR=str(tmp_path)))
        self.lines = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def wait_for(self, pattern, timeout=300, after=0):
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for line in self.lines[after:]):
            assert self.proc.poll() is None or time.monotonic() < deadline - timeout + 2, \
                self.output()
            assert time.monotonic() < deadline, f"no line matching {pattern!r}:\n{self.output()}"
            time.sleep(0.1)
        return len(self.lines)

    def output(self):
        return "".join(self.lines)[-5000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for index in range(4):
            for pid in task_pids(self.out, "worker", index):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def chief_epoch(epoch):
    """A line of the chief's that epoch `epoch` (1-based) ended: Progress's, or Keras'."""
    return rf"^\[worker:0\] (epoch {epoch}/{EPOCHS} done|Epoch {epoch + 1}/{EPOCHS})"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_shipped_example_goes_on_without_a_lost_worker_and_takes_it_back(tmp_path, name,
                                                                           monkeypatch):
    if name == "quickstart":  # as a user launches it: every task exec'd, restarts too
        monkeypatch.setenv("TFDIST_PRELOAD", "")  # the others forked (tests/conftest.py)
    run = ElasticRun(tmp_path, name)
    try:
        run.wait_for(chief_epoch(1))
        for pid in task_pids(run.out, "worker", 3):
            os.kill(pid, signal.SIGKILL)  # a machine lost for good: --discover says 3
        seen = run.wait_for("going on with 3 of 4 workers")
        run.wait_for(r"^\[worker:0\] ", after=seen)  # the chief of 3 trains again
        run.avail.write_text("4\n")  # room again: the place is taken back at an agreed step
        run.wait_for(r"asking every task to stop at an agreed step \(SIGUSR1\)")
        code = run.proc.wait(timeout=600)
    finally:
        run.stop()
    output = run.output()
    assert code == 0, output
    assert "job succeeded: 4 tasks" in output and "2 resizes" in output, output
    assert not re.search(r"disagrees with|StrategyError|Traceback", output), output
    metrics = json.loads((run.out / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == EPOCHS * STEPS, metrics  # every step once
    assert metrics["replicas"] == 4
    sums = re.findall(r"^\[worker:(\d)\] final weights checksum ([\d.]+)", output, re.M)
    assert sorted(i for i, _ in sums) == ["0", "1", "2", "3"], output
    assert len({s for _, s in sums}) == 1, sums  # one model on every worker
