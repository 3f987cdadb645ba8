"""The quickstart example really trains across two MultiWorkerMirroredStrategy workers."""

import json
import re
import subprocess
import sys

import pytest
from paths import ROOT

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("exec_tasks")]


def test_two_workers_learn_and_agree(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", "configs/quickstart.yaml", "--",
         sys.executable, "examples/quickstart/train.py", "--config", "configs/quickstart.yaml",
         "--output_dir", str(tmp_path), "--epochs", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checksums = dict(re.findall(r"^\[(worker:\d)\] final weights checksum ([\d.]+)",
                                result.stdout, re.M))
    assert set(checksums) == {"worker:0", "worker:1"}
    assert checksums["worker:0"] == checksums["worker:1"], "workers ended with different weights"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and len(metrics["loss"]) == 4
    assert metrics["loss"][-1] < 0.5 * metrics["loss"][0]
    assert metrics["accuracy"] > 0.8  # chance is 0.25 with 4 classes


@pytest.mark.parametrize("config, accumulate", [("configs/own_loop.yaml", 0),
                                                ("configs/own_loop_local_sgd.yaml", 0),
                                                ("configs/own_loop.yaml", 2)])
def test_your_own_loop_example_learns_with_one_model_on_every_replica(config, accumulate):
    """The README's own-loop example (tfdist.function): compression with a delayed start,
    local SGD, accumulation — loss falls and both replicas end with the same weights."""
    result = subprocess.run(
        [sys.executable, "examples/quickstart/own_loop.py", "--config", config,
         "--accumulate", str(accumulate)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"^epoch \d+: loss ([\d.]+)", result.stdout, re.M)]
    assert len(losses) == 4 and losses[-1] < 0.6 * losses[0], losses
    checksums = re.findall(r"^replica (\d) weights checksum ([\d.]+)", result.stdout, re.M)
    assert [r for r, _ in checksums] == ["0", "1"]
    assert checksums[0][1] == checksums[1][1], "the replicas ended with different weights"
