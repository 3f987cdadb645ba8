"""The fault-injection grid: a chosen task gets SIGTERM (a preemption) or SIGKILL (a machine
gone) after a chosen step, while the job is in a chosen kind of step, under
`tfdist launch --max-restarts 1` with `tfdist.callbacks.BackupAndRestore`. Each cell: the job
finishes, every worker ends with the same weights, the step count is exact (after a
SIGTERM every step trains once; after a SIGKILL the steps since the last backup run again),
and the final loss is within the seed noise of a run never interrupted (after a SIGTERM,
but for `auto`'s timed choices, the weights are those of that run: every replica's
error-feedback residuals come back from the backup), on 3 workers. The ordinary
synchronous step is in test_multiworker_training.py (4 workers, every step checked), and
so are DiLoCo's outer synchronisation and Streaming DiLoCo's overlapped exchange (between
2 islands of 2 workers: the signal carried by an exchange in flight; each replica's
weights, the anchors and the outer momentum come back from the backup); a kill during a
backup in test_checkpoint_store.py."""

import json
import os
import re

import numpy as np
import pytest

from test_multiworker_training import batched_runs, launch, one_launch, weights

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("jobs_path")]

WORKERS = 3
CLUSTER = f"cluster: {{worker: {WORKERS}}}\nstrategy: multi_worker_mirrored\n"
STEPS = [(e, b) for e in range(3) for b in range(4)]  # 3 epochs of 4 steps
KINDS = {
    "compressed step (top-k + EF)": ("--compression", "topk", "--ratio", "0.25",
                                     "--error_feedback"),
    "compression: auto's probe": ("--auto", "6"),
}
VALIDATION = "validation (top-k + EF)"
KINDS[VALIDATION] = (*KINDS["compressed step (top-k + EF)"], "--validate")
CELLS = [(kind, "TERM") for kind in KINDS] + [("compressed step (top-k + EF)", "KILL")]
PREEMPT_AT = {VALIDATION: "0,-1,1"}  # else after step 1 of epoch 1
#: After a SIGTERM these end with the weights of a run never interrupted (the timed
#: decisions of `auto` may differ).
EXACT = [kind for kind in KINDS if kind != "compression: auto's probe"]


def report(kind, signal, seconds, lost, saved):
    """Appends a cell's measurements to $TFDIST_GRID_REPORT, if set (benchmarks/fault_grid.py
    runs the grid and tabulates them)."""
    path = os.environ.get("TFDIST_GRID_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"cell": kind, "signal": signal, "steps_lost": lost,
                                "seconds_to_training_again": round(seconds, 2),
                                "save_seconds_after_signal": [float(s) for s in saved]}) + "\n")


#: The same job never interrupted, per kind of step (validating changes no weight and no
#: loss: the validation cell's is the compressed step's), all run by one launch.
CLEAN = {"test_a_fault_in_each_kind_of_step": lambda kind: (
    "--model", "plain", "--epochs", "3",
    *KINDS["compressed step (top-k + EF)" if kind == VALIDATION else kind])}


@pytest.fixture(scope="module")
def clean_runs(request, tmp_path_factory):
    return batched_runs(request, tmp_path_factory, CLUSTER, CLEAN)


@pytest.mark.parametrize("kind,signal", CELLS)
def test_a_fault_in_each_kind_of_step(request, write_config, tmp_path, kind, signal):
    out, backup = tmp_path / "out", tmp_path / "backup"
    results, run = launch(write_config, out, CLUSTER, "--model", "plain", "--epochs", "3",
                          *KINDS[kind], "--backup", str(backup), "--preempt",
                          PREEMPT_AT.get(kind, "1,1,1"),
                          "--preempt_signal", signal, launcher_args=("--max-restarts", "1"),
                          timeout=420)
    code = 143 if signal == "TERM" else 137
    assert f"exited with code {code}; restarting the whole job (1/1)" in run.stderr, \
        run.stdout[-3000:] + run.stderr[-2000:]
    for index in range(WORKERS):
        log = [line.split() for line in (out / f"steps-worker-{index}.log").read_text()
               .split("\n")[:-1]]
        trained = [(int(epoch), int(step)) for epoch, step, *_ in log]
        if signal == "TERM":  # saved at the agreed step: each step once
            assert trained == STEPS, (index, trained)
        else:  # the steps of epoch 1 before the kill run again from the epoch-0 backup
            assert trained == STEPS[:6] + STEPS[4:], (index, trained)
    log = [line.split() for line in (out / "steps-worker-1.log").read_text().split("\n")[:-1]]
    # the first step of the relaunched job: after a SIGTERM, the second step logged after
    # the signal (the first carried it to every worker, who saved after it); after a
    # SIGKILL, the first
    signalled = float((out / "preempted").read_text().split()[0])  # "<time> <pid>"
    after = [float(line[3]) for line in log if float(line[3]) > signalled]
    report(kind, signal, seconds=after[1 if signal == "TERM" else 0] - signalled,
           lost=len(trained) - len(STEPS), saved=re.findall(
               r"preempted: saved .*?, ([\d.]+) s after the signal", run.stdout))
    for index in range(1, WORKERS):
        for a, b in zip(weights(out, "worker-0"), weights(out, f"worker-{index}")):
            assert (a == b).all()
    clean, clean_out, _ = one_launch(request, "clean_runs", CLEAN)
    resumed, reference = (r["worker-0"]["evaluate"]["loss"] for r in (results, clean))
    assert abs(resumed - reference) <= 0.05 * reference + 0.01, (resumed, reference)
    if signal == "TERM" and kind in EXACT:  # every replica's residuals, or weights and
        for mine, theirs in zip(weights(out, "worker-0"), weights(clean_out, "worker-0")):
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)  # anchors, came back
