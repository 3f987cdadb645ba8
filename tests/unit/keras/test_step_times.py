"""The step-time breakdown and the straggler named (issue 58): `tfdist.step.step_clock`
measures, `tfdist.callbacks.StepTimes` reports; checked on real workers with one slowed on
purpose, against each worker's own host clock, and its figures against plain NumPy."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tfdist.config import ConfigError
from paths import JOBS as JOB_DIR

JOBS = str(JOB_DIR)
SLEEP = 0.2  # what the slowed worker sleeps in each forward pass
RUNS = {"fit": 2, "trainer": 1}  # the loop -> the worker slowed in it


@pytest.fixture(scope="module")
def four_workers(tmp_path_factory):
    """tests/e2e/jobs/step_times_job.py on 4 workers under one launch, once per loop of RUNS
    (tests/e2e/jobs/runs.py): {loop: (the chief's report lines, [each worker's record])}."""
    root = tmp_path_factory.mktemp("step_times")
    flags = []
    for loop, slow in RUNS.items():
        (root / loop).mkdir()
        flags.append([str(root / loop), "--loop", loop, "--slow", str(slow),
                      "--sleep", str(SLEEP), "--every", "4"])
    run = subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", "4", "--",
                          sys.executable, "runs.py", "step_times_job.py",
                          *(json.dumps(f) for f in flags)],
                         cwd=JOBS, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    chief = [line[len("[worker:0] "):] for line in run.stdout.splitlines()
             if line.startswith("[worker:0] ")]
    marks = [i for i, line in enumerate(chief) if line.startswith("tfdist-test-run")]
    said = {loop: chief[i:j] for loop, i, j in zip(RUNS, marks, marks[1:] + [len(chief)])}
    for line in run.stdout.splitlines():  # no other worker reports
        assert "tfdist step times" not in line or line.startswith("[worker:0] "), line
    return {loop: (said[loop], [json.loads((root / loop / f"worker-{i}.json").read_text())
                                for i in range(4)]) for loop in RUNS}


@pytest.mark.multiprocess
@pytest.mark.parametrize("loop", list(RUNS))
def test_a_slowed_worker_of_four_is_named_and_the_others_wait_for_it(four_workers, loop):
    """One worker of 4 sleeps 0.2 s in each forward pass: every report on the chief names
    it, the warning names it and its host, the others' wait per step is most of the sleep
    and its own is near none, every worker logs every worker's figures alike, and each
    worker's breakdown adds up to its own host-measured step time within 10%."""
    said, records = four_workers[loop]
    slow = RUNS[loop]
    reports = [line for line in said if line.startswith("tfdist step times")]
    assert len(reports) >= 3, said  # every 4 steps of 12, and the whole run
    for line in reports:
        assert re.search(rf": worker:{slow} slowest, computing", line), line
    warned = [line for line in said if "has been the slowest worker" in line]
    assert warned and all(f"worker:{slow} (host localhost)" in line for line in warned), said
    history = records[0]["history"]
    assert history["straggler"] == [float(slow)] * 2
    for record in records:
        me = record["index"]
        mine = record["history"]
        for name, values in history.items():  # one set of figures, on every worker
            if name.startswith(("worker_", "straggler")):
                assert mine[name] == pytest.approx(values, rel=1e-6), (me, name)
        assert mine["step_wait_s"] == pytest.approx(history[f"worker_{me}/step_wait_s"])
        last = mine["step_wait_s"][-1]
        assert last < 0.25 * SLEEP if me == slow else last > 0.5 * SLEEP, (me, mine)
        totals = record["totals"]  # the whole run's, this worker's column
        parts = sum(totals[part][me] for part in ("compute", "exchange", "wait"))
        measured = np.mean(record["walls"])  # each epoch's steps but its first, on the host
        assert totals["steps"] == len(record["walls"]) - 1  # the last, carried by none
        assert parts / totals["steps"] == pytest.approx(measured, rel=0.1), (me, totals)
    share = history["straggler_wait_share"][-1]
    assert 0.3 < share < 1.0


def test_the_breakdown_and_the_straggler_are_numpys():
    """`per_step` and `straggler` from two totals, against the same sums in NumPy."""
    from tfdist.keras.callbacks.step_times import per_step, step_time_logs, straggler

    rng = np.random.default_rng(0)
    start = {"steps": 3, **{p: list(rng.uniform(0, 1, 5)) for p in ("compute", "exchange",
                                                                      "wait")}}
    end = {"steps": 13, **{p: list(np.array(start[p]) + rng.uniform(0, 2, 5))
                           for p in ("compute", "exchange", "wait")}}
    figures = per_step(start, end)
    delta = {p: (np.array(end[p]) - np.array(start[p])) / 10 for p in ("compute", "exchange",
                                                                       "wait")}
    for part, values in delta.items():
        np.testing.assert_allclose(figures[part], values)
    slow, lead, share = straggler(figures)
    assert slow == int(np.argmax(delta["compute"]))
    others = [i for i in range(5) if i != slow]
    median = np.median(delta["compute"][others])
    assert lead == pytest.approx((delta["compute"][slow] - median) / median)
    step = sum(delta[p][others].sum() for p in delta)
    assert share == pytest.approx(delta["wait"][others].sum() / step)
    logs = step_time_logs(figures, 3)
    assert logs["step_wait_s"] == pytest.approx(delta["wait"][3])
    assert logs["worker_4/step_compute_s"] == pytest.approx(delta["compute"][4])
    assert per_step(end, end) is None  # no step between them


def test_on_one_machine_step_times_add_nothing_and_fit_trains_as_without(strategies):
    """Two replicas of one worker: no clock (nothing to wait for between workers), no
    figures in the logs, and the same weights as without the callback."""
    import keras

    import tfdist

    strategy = strategies("mirrored")
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    weights = []
    for callbacks in ([], [tfdist.callbacks.StepTimes(every_steps=1)]):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            net.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
        history = net.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=callbacks)
        assert not any(k.startswith(("step_", "worker_", "straggler")) for k in history.history)
        weights.append(net.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("arguments, says", [
    ({"every_steps": 0}, "every_steps"), ({"every_steps": 2.5}, "every_steps"),
    ({"threshold": -0.1}, "threshold"), ({"threshold": float("nan")}, "threshold"),
    ({"persistence": 0}, "persistence"), ({"persistence": True}, "persistence")])
def test_step_times_arguments_are_checked_as_a_config_files_are(arguments, says):
    import tfdist

    with pytest.raises(ConfigError, match=says):
        tfdist.callbacks.StepTimes(**arguments)
