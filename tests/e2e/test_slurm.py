"""tfdist on a real SLURM: munge + slurmctld + slurmd on this machine (.ci/slurm_up.sh).

`srun` steps run `tfdist exec`, which derives each task's TF_CONFIG from SLURM's
environment; the UNet example trains across chief + 2 workers submitted with the script
`tfdist sbatch` prints. CI exports TFDIST_REQUIRE_SLURM=1, so a missing SLURM fails
there; elsewhere these tests skip, saying how to start one.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from paths import JOBS, ROOT

pytestmark = pytest.mark.multiprocess

TRAIN = ROOT / "examples" / "unet_segmentation" / "train.py"
JOB = JOBS / "train_job.py"
TFDIST = [sys.executable, "-m", "tfdist"]

# The UNet example's own main, unchanged; afterwards every task saves its final weights
# (the example writes its outputs on the chief only). TF_CONFIG says which task it is.
WEIGHTS_JOB = f"""
import json, os, sys
sys.path.insert(0, {str(TRAIN.parent)!r})
sys.argv[0] = {str(TRAIN)!r}
import numpy as np
from absl import app
import train

built, initial = [], []
def unet(*args, **kwargs):
    built.append(train_unet(*args, **kwargs))
    initial.append(built[-1].get_weights())
    return built[-1]
train_unet, train.unet = train.unet, unet  # the example module's name, not Keras'

def main(argv):
    train.main(argv)
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    out = os.path.join(train.FLAGS.output_dir, f"{{task['type']}}-{{task['index']}}.npz")
    np.savez(out, *built[-1].get_weights())
    np.savez(out.replace(".npz", ".initial"), *initial[-1])

app.run(main)
"""


def slurm_ready():
    """None when SLURM can run a step here, else the reason."""
    for tool in ("srun", "sbatch", "sinfo", "scancel"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                                timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 20 s (slurmctld down?)"
    if not any(s.startswith(("idle", "mixed")) for s in states.stdout.split()):
        return f"no idle SLURM node (sinfo: {states.stdout.strip() or states.stderr.strip()!r})"
    return None


@pytest.fixture(scope="module")
def slurm():
    reason = slurm_ready()
    if reason is None:
        return
    message = f"needs a running SLURM ({reason}); start one with .ci/slurm_up.sh (root)"
    if os.environ.get("TFDIST_REQUIRE_SLURM") == "1":
        pytest.fail(message + " — TFDIST_REQUIRE_SLURM=1 (CI) requires it")
    pytest.skip(message)


@pytest.fixture
def job_name():
    """A unique SLURM job name; whatever still runs under it is cancelled afterwards."""
    name = f"tfdist-test-{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["scancel", "--name", name], capture_output=True, timeout=30)


def free_port_run(count):
    """A port p with p..p+count-1 free here (tasks on one node use port + local index)."""
    from tfdist.cluster.ports import free_ports, port_in_use

    for port in free_ports(8):
        if port + count <= 65535 and not any(port_in_use(p) for p in range(port, port + count)):
            return port
    raise RuntimeError(f"no run of {count} free ports found")


def load(path):
    with np.load(path) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def run(command, timeout, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, f"{command}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def test_srun_tasks_get_the_tf_config_tf_config_prints(slurm, write_config, tmp_path, job_name):
    """srun -n 4 under chief 1 + evaluator 1: each task's TF_CONFIG equals what `tfdist
    tf-config` prints for that task of a config listing the same hosts and ports by hand
    (chief, evaluator, workers in SLURM_PROCID order; ports counted up on the shared node)."""
    port = free_port_run(4)
    config = write_config(f"""
        cluster: {{slurm: {{chief: 1, evaluator: 1, port: {port}}}}}
        strategy: multi_worker_mirrored
        """)
    out = tmp_path / "tf_configs"
    out.mkdir()
    run(["srun", "-n", "4", "--time=2", f"--job-name={job_name}", *TFDIST, "exec", config,
         "--", "sh", "-c", f'printf %s "$TF_CONFIG" > {out}/$SLURM_PROCID.json'], timeout=120)
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    by_hand = write_config(f"""
        cluster:
          chief: ["{host}:{port}"]
          evaluator: ["{host}:{port + 1}"]
          worker: ["{host}:{port + 2}", "{host}:{port + 3}"]
        strategy: multi_worker_mirrored
        """, name="by_hand.yaml")
    tasks = ["chief:0", "evaluator:0", "worker:0", "worker:1"]
    for rank, task in enumerate(tasks):
        expected = run([*TFDIST, "tf-config", by_hand, "--task", task], timeout=60).stdout
        assert json.loads((out / f"{rank}.json").read_text()) == json.loads(expected), task


def test_a_batch_script_is_refused_as_a_task(slurm, write_config, tmp_path, job_name):
    """`tfdist exec` in the batch script itself (not under srun) says to use srun."""
    config = write_config("cluster: slurm\nstrategy: multi_worker_mirrored\n")
    log = tmp_path / "batch.out"
    script = f"#!/bin/sh\n{' '.join(TFDIST)} exec {config} -- true\n"
    result = subprocess.run(["sbatch", "--wait", "-n", "1", "--time=2", f"--job-name={job_name}",
                             f"--output={log}"], input=script, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "not a task of an srun step" in log.read_text()


def test_unet_trains_on_chief_and_two_workers_from_sbatch(slurm, tmp_path, job_name):
    """configs/unet_slurm.yaml through the script `tfdist sbatch` prints, submitted with
    `sbatch --wait`: srun -n 3 runs the UNet example (MultiWorkerMirrored, chief + 2
    workers) for 3 steps; every task finishes and all three end with identical weights."""
    from tfdist.cluster.ports import port_in_use

    config = str(ROOT / "configs" / "unet_slurm.yaml")
    busy = [p for p in range(23456, 23459) if port_in_use(p)]
    assert not busy, f"ports {busy} of configs/unet_slurm.yaml are taken by another process"
    job = tmp_path / "weights_job.py"
    job.write_text(WEIGHTS_JOB)
    out = tmp_path / "out"
    out.mkdir()
    log = tmp_path / "slurm.out"
    script = run([*TFDIST, "sbatch", config, "--ntasks", "3", "--time", "6",
                  "--job-name", job_name, "--output", str(log), "--",
                  sys.executable, str(job), "--config", config, "--output_dir", str(out),
                  "--epochs", "1", "--steps_per_epoch", "3", "--validation_steps", "1",
                  "--image_size", "16", "--batch_size", "6", "--depth", "1",
                  "--base_filters", "8"],  # a one-level UNet: quick to trace
                 timeout=60).stdout
    assert "#SBATCH --ntasks=3" in script and " exec " + config + " -- " in script
    submitted = subprocess.run(["sbatch", "--wait", "--parsable"], input=script,
                               capture_output=True, text=True, timeout=480, cwd=tmp_path)
    output = log.read_text() if log.exists() else "(no output file)"
    assert submitted.returncode == 0, submitted.stderr + output[-6000:]
    tasks = ["chief-0", "worker-0", "worker-1"]
    assert sorted(p.stem for p in out.glob("*-?.npz")) == tasks, output[-6000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3 and metrics["replicas"] == 3
    weights = {task: load(out / f"{task}.npz") for task in tasks}
    assert weights["chief-0"], "no weights saved"
    initial = load(out / "chief-0.initial.npz")
    assert any((a != b).any() for a, b in zip(initial, weights["chief-0"])), "nothing trained"
    for task in tasks[1:]:
        assert len(weights[task]) == len(weights["chief-0"])
        for a, b in zip(weights["chief-0"], weights[task]):
            np.testing.assert_array_equal(a, b)


def test_parameter_server_step_ends_with_the_chief(slurm, write_config, tmp_path, job_name):
    """srun -n 4 under parameter_server (chief, ps, 2 workers): the chief trains the UNet
    example for 3 steps through tfdist.Trainer; the worker and ps servers stop once it is
    done (tfdist.cluster.server_watch), so the step ends and exits 0."""
    port = free_port_run(4)
    config = write_config(f"""
        cluster: {{slurm: {{chief: 1, ps: 1, port: {port}}}}}
        strategy: parameter_server
        train: {{image_size: 16, batch_size: 8, epochs: 1, steps_per_epoch: 3,
                 validation_steps: 1, loop: ctl, depth: 1, base_filters: 8}}
        """)
    job = tmp_path / "weights_job.py"
    job.write_text(WEIGHTS_JOB)
    out = tmp_path / "out"
    out.mkdir()
    result = run(["srun", "-n", "4", "--time=6", "--kill-on-bad-exit=1", "--label",
                  f"--job-name={job_name}", *TFDIST, "exec", config, "--",
                  sys.executable, str(job), "--config", config, "--output_dir", str(out)],
                 timeout=480)
    for rank, task in enumerate(["chief:0", "ps:0", "worker:0", "worker:1"][1:], start=1):
        assert f"{rank}: tfdist server: {task} serving" in result.stdout, result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3 and metrics["strategy"] == "parameter_server"
    trained, initial = load(out / "chief-0.npz"), load(out / "chief-0.initial.npz")
    assert any((a != b).any() for a, b in zip(initial, trained)), "nothing trained"


def job_state(job_id):
    """(JobState, Restarts) of a job, from `scontrol show job`."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                           text=True, timeout=30).stdout
    fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
    return fields.get("JobState", "?"), int(fields.get("Restarts", "0"))


def nodes_idle():
    """Whether every node is idle (no job, no step still completing)."""
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                            timeout=30).stdout.split()
    return bool(states) and all(state == "idle" for state in states)


def steps_alive(job_id):
    """Whether a step of `job_id` still runs or ends on this machine: its `slurmstepd:
    [<job>.<step>]` process (sinfo may already call the node idle while one ends)."""
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(f"slurmstepd: [{job_id}.".encode()):
                return True
        except OSError:  # gone meanwhile
            continue
    return False


def wait_until(condition, seconds, what, log):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            output = log.read_text()[-6000:] if log.exists() else "(no output file)"
            pytest.fail(f"{what} did not happen within {seconds} s\n{output}")
        time.sleep(0.5)


def test_a_preempted_batch_job_is_requeued_and_trains_every_step_once(slurm, write_config,
                                                                      tmp_path, job_name):
    """The script `tfdist sbatch` prints, submitted to the real SLURM: 2 tasks train
    tests/e2e/jobs/train_job.py (fit, BackupAndRestore with preemption). After step 1 of
    epoch 1, `scancel --signal=TERM --batch` — what SLURM's `--signal=B:TERM@N` and a
    preemption send — reaches the batch shell, which passes it through srun to both tasks:
    they save after one agreed step and exit with 143, the script requeues the job, SLURM
    starts it again (its begin time moved to now: SLURM otherwise holds a requeued job for
    2 minutes), and it resumes there: each task's step log holds every step exactly once,
    and the two end with identical weights."""
    port = free_port_run(2)
    config = write_config(f"cluster: {{slurm: {{port: {port}}}}}\n"
                          "strategy: multi_worker_mirrored\n")
    out, backup, log = tmp_path / "out", tmp_path / "backup", tmp_path / "slurm.out"
    out.mkdir()
    script = run([*TFDIST, "sbatch", config, "--ntasks", "2", "--time", "10",
                  "--job-name", job_name, "--output", str(log), "--grace-seconds", "30", "--",
                  sys.executable, str(JOB), "--out", str(out), "--loop", "fit", "--model",
                  "plain", "--epochs", "3", "--backup", str(backup), "--preempt", "1,1,0",
                  "--preempt_signal", "EXTERNAL"], timeout=60).stdout
    job_id = run(["sbatch", "--parsable"], input=script, timeout=60,
                 cwd=tmp_path).stdout.strip().split(";")[0]
    wait_until(lambda: (out / "ready").exists(), 300, "step 1 of epoch 1", log)
    run(["scancel", "--signal=TERM", "--batch", job_id], timeout=30)
    (out / "signalled").touch()
    wait_until(lambda: job_state(job_id) == ("PENDING", 1), 180, "the requeue", log)
    # SLURM holds a requeued job 2 minutes, while the preempted run's step is cleaned up;
    # released sooner, it found that step still ending and failed ("Job credential revoked";
    # sinfo can call the node idle while the step's slurmstepd still ends: wait for both)
    wait_until(lambda: nodes_idle() and not steps_alive(job_id), 180,
               "the preempted run's end on the node", log)
    run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], timeout=30)
    wait_until(lambda: job_state(job_id)[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
               420, "the requeued job's end", log)
    output = log.read_text()
    assert job_state(job_id) == ("COMPLETED", 1), output[-6000:]
    assert f"tfdist: preempted; requeueing job {job_id}" in output, output[-6000:]
    saved = [line for line in output.splitlines() if "tfdist: preempted: saved" in line]
    assert len(saved) == 2 and all("after step 3 of epoch 1" in line for line in saved), saved
    steps = [(e, b) for e in range(3) for b in range(4)]
    for task in ("worker-0", "worker-1"):
        log_lines = (out / f"steps-{task}.log").read_text().split("\n")[:-1]
        trained = [tuple(int(v) for v in line.split()[:3]) for line in log_lines]
        assert [(e, b) for e, b, _ in trained] == steps, (task, trained)  # each step once
        assert [s for _, _, s in trained] == list(range(1, 13))
    for a, b in zip(load(out / "worker-0.npz"), load(out / "worker-1.npz")):
        np.testing.assert_array_equal(a, b)
