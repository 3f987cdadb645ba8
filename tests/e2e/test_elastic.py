"""An elastic job (`tfdist launch --min-workers`, `elastic:`; tfdist/launch/elastic.py): a
lost worker does not stop the job, which goes on with fewer from its last backup and takes
the place back at an agreed step.

The launcher's side with a stand-in script (tests/e2e/jobs/elastic_fake_job.py, no TensorFlow),
then real 4-worker jobs (tests/e2e/jobs/train_job.py) compared with runs never interrupted."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from test_multiworker_training import Background, batched_runs, launch, one_launch, weights
from tfdist.config.errors import ConfigError
from tfdist.config.load import config_from_dict
from tfdist.launch.elastic import Places
from tfdist.launch.errors import LaunchError
from tfdist.launch.launcher import Launcher
from paths import JOBS

FAKE = JOBS / "elastic_fake_job.py"
FOUR = "cluster: {worker: 4}\nstrategy: multi_worker_mirrored\n"


# --- the launcher, with a stand-in script ------------------------------------------------

def fake_env(tmp_path):
    """The stand-in's launch environment: its tasks forked from a process that preloaded
    only what the stand-in imports (json: the resizes of forked tasks, without TensorFlow's
    import the stand-in never needs)."""
    return dict(os.environ, TMPDIR=str(tmp_path), TFDIST_PRELOAD="json")


def fake_launch(write_config, tmp_path, *launcher_args, job_args=(), cluster=FOUR,
                timeout=120):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    config = write_config(cluster, name="cluster.yaml")
    run = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds", "5",
         *launcher_args, "--", sys.executable, str(FAKE), "--out", str(out), *job_args],
        capture_output=True, text=True, timeout=timeout, env=fake_env(tmp_path))
    starts = [line.split() for line in (out / "starts.log").read_text().splitlines()]
    return run, starts


def sizes(starts):
    """The cluster sizes the tasks were started at, in order (one entry per size)."""
    seen = []
    for members, *_ in starts:
        if not seen or seen[-1][0] != int(members) or seen[-1][1] == int(members):
            seen.append([int(members), 0])
        seen[-1][1] += 1
    return [members for members, _ in seen]


pytestmark = pytest.mark.multiprocess


def test_a_lost_worker_the_job_goes_on_with_three_then_takes_it_back(write_config, tmp_path):
    """worker:3 is SIGKILLed: the other three are killed at once and the job restarts with
    3 workers (TF_CONFIG of 3, indices 0-2); 1 s later its place is offered back, every task
    is asked (SIGUSR1) to stop at an agreed step, answers 143, and the job goes on with 4."""
    run, starts = fake_launch(write_config, tmp_path, "--min-workers", "2",
                              "--rejoin-seconds", "1", job_args=("--kill", "3:3"))
    assert run.returncode == 0, run.stderr
    assert sizes(starts) == [4, 3, 4], starts
    assert sorted(int(i) for m, i, *_ in starts if m == "3") == [0, 1, 2]
    assert {s for _, _, s, _ in starts} == {"SIGUSR1"}  # every task knows the resize signal
    assert [p for m, _, _, p in starts] == ["0,1,2,3/4"] * 4 + ["0,1,2/4"] * 3 + [
        "0,1,2,3/4"] * 4  # and the places of the whole cluster its tasks hold
    assert ("worker:3 exited with code 137; going on with 3 of 4 workers (--min-workers 2) "
            "from the last backup; the lost place is offered back in 1 s") in run.stderr
    assert "asking every task to stop at an agreed step (SIGUSR1) to go on with 4" in run.stderr
    assert "job succeeded: 4 tasks" in run.stderr and "2 resizes" in run.stderr


def test_the_places_left_after_a_middle_worker_is_lost_are_named_to_every_task(
        write_config, tmp_path):
    """worker:1 is lost: the 3 tasks of the next size hold places 0, 2 and 3 of the whole
    cluster (islands given for it are found there: tfdist.local_sgd.islands)."""
    run, starts = fake_launch(write_config, tmp_path, "--min-workers", "3",
                              "--rejoin-seconds", "86400", job_args=("--kill", "1:3",
                                                                     "--steps", "15"))
    assert run.returncode == 0, run.stderr
    assert sizes(starts) == [4, 3], starts
    assert [p for m, _, _, p in starts if m == "3"] == ["0,2,3/4"] * 3


def test_a_preemption_restarts_an_elastic_job_without_counting_a_restart(write_config,
                                                                        tmp_path):
    """Every task exits 143 (saved at an agreed step after a SIGTERM): the job restarts at
    its size at once, although --max-restarts is 0 (nothing was lost)."""
    run, starts = fake_launch(write_config, tmp_path, "--min-workers", "2",
                              job_args=("--preempt", "2", "--steps", "10"))
    assert run.returncode == 0, run.stderr
    assert sizes(starts) == [4, 4], starts
    assert "not counted against --max-restarts" in run.stderr
    assert "0 restarts, 1 resize" in run.stderr


def test_a_stopped_worker_is_found_hung_and_lost_alone(write_config, tmp_path):
    """worker:1 is SIGSTOPped (a frozen machine): after --hang-seconds it is the one killed
    as hung and lost, and the job goes on with 3."""
    run, starts = fake_launch(write_config, tmp_path, "--min-workers", "2",
                              "--rejoin-seconds", "86400", "--hang-seconds", "2",
                              job_args=("--stop", "1:2", "--steps", "60"))
    assert run.returncode == 0, run.stderr
    assert sizes(starts) == [4, 3], starts
    assert "worker:1 is hung" in run.stderr
    assert "going on with 3 of 4 workers" in run.stderr


def test_fewer_workers_left_than_the_minimum_stops_the_job_in_one_line(write_config,
                                                                       tmp_path):
    """Every task fails with an error (a bug, not a lost machine): one place is lost each
    time (an error exit after a peer's may be TensorFlow aborting the group: not a loss),
    the job fails again at each smaller size, and once fewer than --min-workers are left it
    stops with the failure's exit code, as a job without --min-workers."""
    run, starts = fake_launch(write_config, tmp_path, "--min-workers", "2",
                              job_args=("--crash",))
    assert run.returncode == 3, run.stderr
    assert sizes(starts) == [4, 3, 2], starts
    assert "workers left, fewer than --min-workers 2" in run.stderr, run.stderr
    assert "job failed" in run.stderr.splitlines()[-1]


def test_a_script_that_ignores_the_resize_signal_trains_on_at_its_size(write_config,
                                                                      tmp_path):
    """A script that does not stop at the request (no backup watching) is never killed for
    it: the job ends at 3 workers, as it would have."""
    run, starts = fake_launch(write_config, tmp_path, "--min-workers", "3",
                              "--rejoin-seconds", "0.5",
                              job_args=("--kill", "0:2", "--on-resize", "ignore", "--steps", "40"))
    assert run.returncode == 0, run.stderr
    assert sizes(starts) == [4, 3]
    assert "asking every task to stop" in run.stderr and "1 resize," in run.stderr


def test_a_script_killed_by_the_resize_signal_restarts_at_the_new_size(write_config,
                                                                      tmp_path):
    """A command with no handler dies of SIGUSR1 (138): as good as stopped, the job goes on
    with 4 from its last backup."""
    run, starts = fake_launch(write_config, tmp_path, "--min-workers", "3",
                              "--rejoin-seconds", "0.5",
                              job_args=("--kill", "1:2", "--on-resize", "default"))
    assert run.returncode == 0, run.stderr
    assert sizes(starts) == [4, 3, 4], starts


def test_discover_decides_when_a_place_comes_back(write_config, tmp_path):
    """--discover prints how many workers can run: while it says 3 the lost place stays
    away (well past --rejoin-seconds), once it says 4 the job takes it back; the config's
    elastic: section does the same."""
    avail = tmp_path / "avail"
    avail.write_text("3\n")
    cluster = FOUR + f"elastic: {{min_workers: 2, rejoin_seconds: 0, discover: 'cat {avail}'}}\n"
    config = write_config(cluster, name="cluster.yaml")
    out = tmp_path / "out"
    out.mkdir()
    job = subprocess.Popen([sys.executable, "-m", "tfdist", "launch", config, "--",
                            sys.executable, str(FAKE), "--out", str(out), "--kill", "2:2",
                            "--steps", "150"],
                           stderr=subprocess.PIPE, text=True, env=fake_env(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while sizes_in(out) != [4, 3]:
            assert time.monotonic() < deadline, sizes_in(out)
            time.sleep(0.1)
        time.sleep(6)  # more than a discovery round: the answer 3 leaves no room
        assert sizes_in(out) == [4, 3]
        avail.write_text("4\n")
        _, stderr = job.communicate(timeout=90)
    finally:
        job.kill()
    assert job.returncode == 0, stderr
    assert sizes_in(out) == [4, 3, 4]
    assert "once --discover reports room for it" in stderr


def sizes_in(out):
    path = out / "starts.log"
    return sizes([line.split() for line in path.read_text().splitlines()]) if path.exists() else []


@pytest.mark.parametrize("answer, said", [
    ("printf 'four'", "printed no whole number of workers. Received: b'four'"),
    ("sh -c 'exit 4'", "exited with code 4"),
    ("sleep 60", "gave no answer within 10 s"),  # the job trains on meanwhile
    ("yes 4", "printed more than 4096 bytes"),
    ("/nonexistent/discover", "could not be run (No such file or directory)"),
    ("printf '4 5'", "printed no whole number of workers"),
    ("printf -- '-1'", "printed no whole number of workers"),
])
def test_a_discovery_answer_it_cannot_use_is_said_once_and_changes_nothing(
        write_config, tmp_path, answer, said):
    """A wrong answer (not a count, a failure, a hang, a flood, no such command) is said in
    one line, once, and no place comes back on it; the job trains on to its end."""
    steps = "130" if answer.startswith("sleep") else "40"
    run, starts = fake_launch(write_config, tmp_path, "--min-workers", "2",
                              "--rejoin-seconds", "0", "--discover", answer,
                              job_args=("--kill", "0:1", "--steps", steps))
    assert run.returncode == 0, run.stderr
    assert sizes(starts) == [4, 3]
    lines = [line for line in run.stderr.splitlines() if "--discover" in line and said in line]
    assert len(lines) == 1, run.stderr
    assert "keeping the last answer (none yet)" in lines[0]


def test_a_place_lost_again_waits_twice_as_long():
    places = Places(4, 2, 10.0)
    assert places.lose([3], now=0.0) == [3]
    assert places.active() == [0, 1, 2] and places.due(9.9) == [] and places.due(10.0) == [3]
    assert places.take_back(10.0) == 1 and places.size() == 4
    places.lose([1], now=20.0)
    assert places.lose([2], now=20.0) == [3]  # task 2 of [0, 2, 3] is place 3
    assert places.due(39.9) == [1] and places.due(40.0) == [1, 3]  # place 3: 2 x 10 s
    assert places.due(40.0, room=1) == [1]


# --- hostile input: the command line and the config --------------------------------------

@pytest.mark.parametrize("args, said", [
    (("--min-workers", "0"), "expected a number of workers from 1 to"),
    (("--min-workers", "two"), "expected a number of workers from 1 to"),
    (("--min-workers", "5"), "--min-workers is more than the cluster has (4 chief and worker "
                             "tasks, the most the job runs with). Received: min-workers=5"),
    (("--min-workers", "2", "--rejoin-seconds", "nan"), "rejoin_seconds: expected a finite"),
    (("--min-workers", "2", "--rejoin-seconds", "-1"), "rejoin_seconds: expected a value "
                                                       "between 0 and 86400"),
    (("--rejoin-seconds", "5"), "--rejoin-seconds is for an elastic job: give --min-workers"),
    (("--discover", "cat n"), "--discover is for an elastic job: give --min-workers"),
    (("--min-workers", "2", "--discover", ""), "expected a non-empty string"),
    (("--min-workers", "2", "--discover", "cat 'n"), "expected a command line (No closing "
                                                     "quotation)"),
    (("--min-workers", "2", "--discover", "   "), "expected a command that prints how many"),
    (("--min-workers", "2", "--task", "worker:0"), "--task"),
])
def test_bad_elastic_options_are_refused_in_one_line(write_config, tmp_path, args, said):
    config = write_config(FOUR, name="cluster.yaml")
    run = subprocess.run([sys.executable, "-m", "tfdist", "launch", config, *args, "--",
                          sys.executable, "-c", "pass"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2, run.stderr
    assert said in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.parametrize("cluster, said", [
    ("cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n",
     "Received: strategy=parameter_server"),
    ("cluster: {worker: [localhost:23456, localhost:23457]}\nstrategy: multi_worker_mirrored\n",
     "needs the chief and workers given by counts"),
    ("cluster: {worker: 1}\nstrategy: mirrored\n", "Received: strategy=mirrored"),
    ("strategy: multi_worker_mirrored\n", "Received: strategy=multi_worker_mirrored"),
])
def test_a_cluster_that_cannot_resize_is_refused_before_anything_starts(cluster, said):
    with pytest.raises(LaunchError, match="--min-workers") as refused:
        Launcher(config_from_dict(__import__("yaml").safe_load(cluster)),
                 ["true"], min_workers=1)
    assert said in str(refused.value)


@pytest.mark.parametrize("section, said", [
    ("{min_workers: 5}", "min_workers is more than the cluster has (4 chief and worker"),
    ("{min_workers: 0}", "min_workers: expected a value >= 1"),
    ("{rejoin_seconds: 5}", "missing key 'min_workers'"),
    ("{min_workers: 2, rejoin: 5}", "did you mean 'rejoin_seconds'?"),
    ("{min_workers: 2, rejoin_seconds: .inf}", "rejoin_seconds: expected a finite"),
    ("{min_workers: 2, rejoin_seconds: 86401}", "between 0 and 86400"),
    ("{min_workers: 2, discover: ''}", "expected a non-empty string"),
    ("{min_workers: 2, discover: [cat, n]}", "expected a non-empty string"),
    ("{min_workers: 2, discover: \"a\\0b\"}", "without NUL characters"),
    ("{min_workers: true}", "expected an integer"),
    ("3", "expected a mapping of min_workers, rejoin_seconds and discover"),
])
def test_a_bad_elastic_section_is_refused_with_file_and_key(write_config, section, said):
    from tfdist.config import load_config

    path = write_config(FOUR + f"elastic: {section}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert said in str(refused.value) and ":3: elastic" in str(refused.value), str(refused.value)


def test_elastic_with_another_strategy_is_refused_by_the_config_but_islands_are_not(
        write_config):
    from tfdist.config import load_config

    with pytest.raises(ConfigError, match="strategy=mirrored"):
        load_config(write_config("cluster: {worker: 2}\nstrategy: mirrored\n"
                                 "elastic: {min_workers: 1}\n"))
    config = load_config(write_config(FOUR + "local_sgd: {period: 2, islands: 2}\n"
                                      "elastic: {min_workers: 2}\n"))
    assert config.local_sgd.islands == 2 and config.elastic.min_workers == 2


# --- real 4-worker jobs -------------------------------------------------------------------

PLAIN3 = ("--model", "plain", "--epochs", "3")
#: DiLoCo (outer Nesterov, int4-compressed exchange) between 2 islands of 2 workers.
DILOCO_ISLANDS = ("--loop", "fit", "--local_sgd", "2", "--diloco", "1,0", "--islands", "2")
TRAINING = {"fit": ("--loop", "fit"),
            "fit-topk-ef-mixed_float16": ("--loop", "fit", "--compression", "topk", "--ratio",
                                          "0.1", "--error_feedback", "--policy",
                                          "mixed_float16"),
            "trainer-powersgd-ef": ("--loop", "trainer", "--compression", "powersgd", "--rank",
                                    "2", "--error_feedback")}
#: The 4-worker runs never interrupted that the elastic ones are compared with, run by one
#: launch (`clean_runs`); the first of each list is the same run, the second (plain fit)
#: another seed: the seed noise.
CLEAN = {
    "test_a_worker_killed_for_good_the_job_goes_on_with_three":
        lambda training: [(*TRAINING[training], *PLAIN3),  # and the seed noise, which
                          (*TRAINING["fit"], *PLAIN3),  # every cell compares with (a cell
                          (*TRAINING["fit"], *PLAIN3, "--seed", "4")],  # run alone too)
    "test_a_worker_back_is_taken_back_at_an_agreed_step_and_all_four_agree":
        lambda: ("--loop", "trainer", *PLAIN3),
    "test_an_island_lost_the_other_goes_on_and_it_rejoins_from_the_anchors":
        lambda: [(*DILOCO_ISLANDS, *PLAIN3), (*DILOCO_ISLANDS, *PLAIN3, "--seed", "4")],
}


@pytest.fixture(scope="module")
def clean_runs(request, tmp_path_factory):
    return batched_runs(request, tmp_path_factory, FOUR, CLEAN)


def trained_steps(out, index):
    """(epoch, step, optimizer step, replicas) of every step worker:`index` trained."""
    lines = (out / f"steps-worker-{index}.log").read_text().split("\n")[:-1]
    return [(int(e), int(b), int(s), int(r)) for e, b, s, _, r in map(str.split, lines)]


def final_trajectory(steps):
    """The steps that count: a step trained again after a restart from a backup replaces
    the run of it that was lost (the log lists both)."""
    kept = []
    for step in steps:
        while kept and kept[-1][2] >= step[2]:
            kept.pop()
        kept.append(step)
    return kept


EVERY_STEP = [(e, b, 4 * e + b + 1) for e in range(3) for b in range(4)]


def final_loss(out, task="worker-0"):
    return json.loads((out / f"{task}.json").read_text())["evaluate"]["loss"]


@pytest.mark.parametrize("training", list(TRAINING))
def test_a_worker_killed_for_good_the_job_goes_on_with_three(request, write_config, tmp_path,
                                                             training):
    """worker:3 is SIGKILLed after step 1 of epoch 1 and never comes back (rejoin in a day):
    the job goes on with 3 from the backup of epoch 0, keeps the global batch (TensorFlow
    splits the 32 examples of each step 11/11/10), ends with the 3 survivors identical, and
    its final loss is within the seed noise of a run of 4 never interrupted (the gap to it
    smaller than the gap between two seeds). Every step of every epoch counts once: the two
    steps the loss cost are trained again from the backup, on 3 workers. Also with top-k
    and error feedback under mixed_float16: the lost replica's residuals folded into the
    survivors (tfdist/step/resize.py), the loss scale kept; and PowerSGD with error
    feedback under the Trainer: its Q kept on every replica."""
    out, backup = tmp_path / "out", tmp_path / "backup"
    _, run = launch(write_config, out, FOUR, *TRAINING[training], *PLAIN3, "--backup",
                    str(backup), "--preempt", "1,1,3", "--preempt_signal", "KILL",
                    launcher_args=("--min-workers", "2", "--rejoin-seconds", "86400"),
                    timeout=420)
    assert "worker:3 exited with code 137; going on with 3 of 4 workers" in run.stderr
    assert "job succeeded: 3 tasks" in run.stderr, run.stderr[-2000:]
    assert not (out / "worker-3.json").exists()
    for index in range(3):
        steps = trained_steps(out, index)
        assert [s[:3] for s in final_trajectory(steps)] == EVERY_STEP, (index, steps)
        assert [s[3] for s in final_trajectory(steps)] == [4] * 4 + [3] * 8
        assert [s[:2] for s in steps[4:6]] == [(1, 0), (1, 1)]  # lost with the kill
    for task in ("worker-1", "worker-2"):
        for a, b in zip(weights(out, "worker-0"), weights(out, task)):
            np.testing.assert_array_equal(a, b)
    outs, _ = request.getfixturevalue("clean_runs")
    clean = [outs[flags] for flags in CLEAN[request.node.originalname](training)]
    seed_noise = abs(final_loss(outs[(*TRAINING["fit"], *PLAIN3)])
                     - final_loss(outs[(*TRAINING["fit"], *PLAIN3, "--seed", "4")]))
    gap = abs(final_loss(out) - final_loss(clean[0]))
    assert gap < seed_noise, (final_loss(out), final_loss(clean[0]), seed_noise)


def test_a_worker_back_is_taken_back_at_an_agreed_step_and_all_four_agree(request,
                                                                         write_config,
                                                                         tmp_path):
    """Under tfdist.Trainer: worker:3 is SIGKILLed after step 1 of epoch 1; --discover says
    3 workers can run, so the job goes on with 3. Once the 3 have trained epoch 1 (the
    chief holds at its end), the discovery says 4: the launcher asks every task to stop
    at an agreed step (SIGUSR1), all save after that same step and exit 143, and the job
    goes on with 4 from that backup: every step trains once (none lost to the take-back),
    the 4 workers end identical, and the weights are those of a run of 4 never
    interrupted up to the seed noise."""
    out = tmp_path / "out"
    output = lose_then_take_back(write_config, tmp_path, ("--loop", "trainer", *PLAIN3), "3",
                                 left=3)
    saved = [line for line in output.splitlines() if "tfdist: preempted: saved" in line]
    # the same agreed step on every worker (how long after the signal each saved differs)
    steps = {re.search(r"after step \d+ of epoch \d+", line).group() for line in saved}
    assert len(saved) == 3 and len(steps) == 1, saved
    assert "every task stopped at the agreed step; going on with 4 of 4 workers" in output
    assert "job succeeded: 4 tasks" in output and "2 resizes" in output
    for index in range(3):
        trajectory = final_trajectory(trained_steps(out, index))
        assert [s[:3] for s in trajectory] == EVERY_STEP, (index, trajectory)
        replicas = [s[3] for s in trajectory]
        assert replicas[:8] == [4] * 4 + [3] * 4 and replicas[-1] == 4, replicas
    back = trained_steps(out, 3)  # the new worker:3 trains the rest
    assert back[-1][:3] == EVERY_STEP[-1] and all(s[3] == 4 for s in back)
    for index in (1, 2, 3):
        for a, b in zip(weights(out, "worker-0"), weights(out, f"worker-{index}")):
            np.testing.assert_array_equal(a, b)
    _, clean, _ = one_launch(request, "clean_runs", CLEAN)
    for mine, theirs in zip(weights(out, "worker-0"), weights(clean, "worker-0")):
        np.testing.assert_allclose(mine, theirs, rtol=0.05, atol=0.01)


def test_an_island_lost_the_other_goes_on_and_it_rejoins_from_the_anchors(request,
                                                                          write_config,
                                                                          tmp_path):
    """DiLoCo between 2 islands of 2 workers under fit: the second island (workers 2 and 3)
    is SIGKILLed after step 1 of epoch 1. The first goes on alone from the backup of epoch
    0, its islands found among the places left (tfdist.local_sgd.islands), the outer state
    kept. Once it has trained epoch 1, --discover reports room for 4: every task stops at
    one agreed synchronisation and the lost island rejoins from the current anchors (the
    backup of 2 replicas carried onto 4: anchors kept, the weights their mean). Every step
    trains once, the 4 workers end identical, and the final loss is within the seed noise
    of the same job never interrupted."""
    out = tmp_path / "out"
    output = lose_then_take_back(write_config, tmp_path, (*DILOCO_ISLANDS, *PLAIN3), "2+3",
                                 left=2)
    lost = [line for line in output.splitlines() if "going on with 2 of 4 workers" in line]
    assert "worker:2" in lost[0] and "worker:3" in lost[0], lost
    assert "every task stopped at the agreed step; going on with 4 of 4 workers" in output
    assert "job succeeded: 4 tasks" in output and "2 resizes" in output
    carried = [line for line in output.splitlines()
               if "exchange state of 2 replicas carried onto 4" in line]
    assert carried and "kept on every replica (PowerSGD's Q, DiLoCo's anchors)" in carried[0]
    for index in range(2):
        trajectory = final_trajectory(trained_steps(out, index))
        assert [s[:3] for s in trajectory] == EVERY_STEP, (index, trajectory)
        replicas = [s[3] for s in trajectory]
        assert replicas[:8] == [4] * 4 + [2] * 4 and replicas[-1] == 4, replicas
    for index in (2, 3):  # the island back trains the rest
        back = trained_steps(out, index)
        assert back[-1][:3] == EVERY_STEP[-1] and back[-1][3] == 4, back
    for index in (1, 2, 3):
        for a, b in zip(weights(out, "worker-0"), weights(out, f"worker-{index}")):
            np.testing.assert_array_equal(a, b)
    outs, _ = request.getfixturevalue("clean_runs")
    clean, other_seed = (outs[flags] for flags in CLEAN[request.node.originalname]())
    seed_noise = abs(final_loss(clean) - final_loss(other_seed))
    gap = abs(final_loss(out) - final_loss(clean))
    print(f"final loss {final_loss(out):.4f}, clean {final_loss(clean):.4f}, "
          f"another seed {final_loss(other_seed):.4f}")
    assert gap < seed_noise, (final_loss(out), final_loss(clean), seed_noise)


ZOO_JOB = JOBS / "zoo_job.py"


@pytest.mark.usefixtures("jobs_path")
@pytest.mark.parametrize("family", ["transformer", "multi_io", "finetune"])
def test_the_models_users_bring_go_on_with_two_where_one_device_ends(write_config,
                                                                      tmp_path, family):
    """The model families of tests/e2e/jobs/zoo.py through tfdist's exact exchange (SGD with
    momentum), 4 workers, two of them SIGKILLed for good after step 0 of epoch 1: the job
    goes on with 2 from the backup of epoch 0 and each survivor ends with one device's
    weights — an Embedding and a Dense over a sequence (keras-io's transformer), several
    inputs and outputs with loss weights, and keras-io's fine-tuning (a frozen base, then
    unfrozen and compiled again). On 2, as on 4, the global batch of 16 (and the last one of
    8) splits evenly; over 3 (6/6/4) Keras' fit, like TensorFlow's, averages each replica's
    mean and the examples of the smaller share weigh more (docs/guides/elastic.md)."""
    from test_model_zoo import reference

    out = tmp_path / "out"
    out.mkdir()
    config = write_config(FOUR, name="cluster.yaml")
    run = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds", "5",
         "--min-workers", "2", "--rejoin-seconds", "86400", "--", sys.executable,
         str(ZOO_JOB), "--out", str(out), "--family", family, "--loop", "fit",
         "--backup", str(tmp_path / "backup"), "--kill", "1:2+3"],
        capture_output=True, text=True, timeout=420,
        env=dict(os.environ, TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="2"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    lost = [line for line in run.stderr.splitlines() if "going on with 2 of 4 workers" in line]
    assert lost and "worker:2" in lost[0] and "worker:3" in lost[0], run.stderr[-2000:]
    assert not (out / "worker-2.npz").exists() and not (out / "worker-3.npz").exists()
    expected, _ = reference(family, "fit")
    for task in ("worker-0", "worker-1"):
        got = weights(out, task)
        assert len(got) == len(expected)
        for i, (a, b) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{task}: {i}")


def lose_then_take_back(write_config, tmp_path, training, lost, left):
    """4 workers running `training`; workers `lost` SIGKILLed for good after step 1 of epoch
    1, the job goes on with `left` (--discover says so); once they have trained epoch 1
    (the chief holds at its end), --discover says 4 and the job takes the places back at
    an agreed step. -> everything the launch printed (it succeeded)."""
    out, backup, avail = tmp_path / "out", tmp_path / "backup", tmp_path / "avail"
    avail.write_text(f"{left}\n")
    job = Background(write_config, out, FOUR, *training, "--backup", str(backup),
                     "--preempt", f"1,1,{lost}", "--preempt_signal", "KILL",
                     "--pause_after", "1",
                     launcher_args=("--min-workers", "2", "--rejoin-seconds", "0",
                                    "--discover", f"cat {avail}"))
    try:
        job.wait_for_line(f"going on with {left} of 4 workers", timeout=240)
        wait_for(out / "paused-1", timeout=240)
        avail.write_text("4\n")
        job.wait_for_line("asking every task to stop at an agreed step (SIGUSR1)")
        (out / "resume-1").touch()
        code, output = job.finish(timeout=300)
    finally:
        stop_tasks(job, out)
    assert code == 0, output[-3000:]
    return output


def wait_for(path, timeout):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.1)


def stop_tasks(job, out):
    """Kills what is left of `job`: the launcher, then (it sweeps its own on a normal
    end) any task of this test still running."""
    if job.proc.poll() is None:
        job.proc.kill()
        job.proc.wait(10)
    from test_multiworker_training import task_pids

    for index in range(4):
        for pid in task_pids(out, "worker", index):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("extra", [(), ("--format", "trainjob")])
def test_manifests_say_they_do_not_resize(write_config, extra):
    """Kubernetes restarts a job at its declared size: `tfdist manifest` still writes the
    TFJob or TrainJob for a config with an elastic: section, and says in one line on stderr
    that it is not expressed there (the same config may run under `tfdist launch`)."""
    config = write_config(FOUR + "elastic: {min_workers: 2}\n")
    run = subprocess.run([sys.executable, "-m", "tfdist", "manifest", config, "--image",
                          "registry/me/train:1", *extra, "--", "python", "train.py"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() and "elastic" not in run.stdout
    note, = run.stderr.strip().splitlines()
    assert "tfdist manifest: note:" in note and "elastic: section is not expressed here" in note


SLURM = "cluster: {slurm: {chief: 1}}\nstrategy: multi_worker_mirrored\n"


def test_a_batch_script_asks_slurm_for_a_range_of_nodes(write_config):
    """`tfdist sbatch` of an elastic job asks for MIN-MAX nodes with one TF task each
    (min_workers counts the chief) instead of a fixed --ntasks, and keeps --requeue: a lost
    node requeues the job, which starts again on the nodes SLURM has."""
    from tfdist.cluster.sbatch import batch_script
    from tfdist.config import load_config

    config = load_config(write_config(SLURM + "elastic: {min_workers: 3}\n"))
    script = batch_script(config, ["python", "train.py"], ntasks=5).splitlines()
    assert "#SBATCH --nodes=3-5" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --requeue" in script and not any("--ntasks=" in line for line in script)
    assert "up to 5 TF task(s), chief x1, worker x4" in script[1]


@pytest.mark.parametrize("section, args, said", [
    ("{min_workers: 6}", ("--ntasks", "5"), "elastic.min_workers must be between 2 and the 5 "
                                            "chief and worker tasks of --ntasks=5"),
    ("{min_workers: 1}", ("--ntasks", "5"), "must be between 2"),  # the chief and a worker
    ("{min_workers: 2}", ("--ntasks", "5", "--nodes", "3"), "leave out --nodes"),
    ("{min_workers: 2}", ("--ntasks", "5", "--ntasks-per-node", "2"),
     "leave out --ntasks-per-node"),
])
def test_a_batch_script_that_cannot_hold_the_range_is_refused(write_config, section, args,
                                                              said):
    config = write_config(SLURM + f"elastic: {section}\n")
    run = subprocess.run([sys.executable, "-m", "tfdist", "sbatch", config, *args, "--",
                          "python", "train.py"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and said in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not run.stdout


def test_the_resize_signal_before_training_is_kept_for_the_first_step(monkeypatch):
    """In a task of an elastic launch, SIGUSR1 while no loop watches (building the model,
    restoring) is taken note of by the guard, not fatal; the preemption watch takes it when
    training begins, so the first step carries it. Without the launcher's variable, or with
    any other value of it, the guard leaves SIGUSR1 alone."""
    from tfdist.step.preemption import preemption
    from tfdist.strategies import sigterm_guard

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        for value in (None, "SIGKILL", "SIGUSR1\n", "sigusr1", "10", ""):
            if value is None:
                monkeypatch.delenv("TFDIST_RESIZE_SIGNAL", raising=False)
            else:
                monkeypatch.setenv("TFDIST_RESIZE_SIGNAL", value)
            sigterm_guard.guard()
            assert signal.getsignal(signal.SIGUSR1) == before[signal.SIGUSR1], value
        monkeypatch.setenv("TFDIST_RESIZE_SIGNAL", "SIGUSR1")
        sigterm_guard.guard()
        os.kill(os.getpid(), signal.SIGUSR1)  # handled at once, in this thread
        assert not preemption().requested
        preemption().install()
        assert preemption().requested and preemption().signal_name == "SIGUSR1"
        assert signal.getsignal(signal.SIGUSR1) == preemption()._on_signal
    finally:
        preemption().uninstall()
        preemption().requested, preemption().received_at = False, None
        preemption().signal_name = None
        for number, handler in before.items():
            signal.signal(number, handler)


def test_a_discovery_answer_is_only_taken_while_it_is_fresh(tmp_path):
    """The launcher acts on what the command said lately: an answer older than
    DISCOVER_FRESH, or from before a loss (`forget`), is no answer (a machine that was up
    before a loss may be the one lost). The command answers at once the first time and
    takes 20 s the next (else the next run's answer, fresh, could come between polls)."""
    from tfdist.launch import elastic

    said, seen = [], tmp_path / "answered"
    discovery = elastic.Discovery(["sh", "-c", f"[ -e {seen} ] && sleep 20; touch {seen}; "
                                               "echo 4"], said.append)
    assert discovery.poll(0.0) is None  # started
    deadline = time.monotonic() + 30
    while discovery.poll(0.1) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert discovery.poll(elastic.DISCOVER_FRESH) == 4  # answered at 0.0, the run's start
    assert discovery.poll(elastic.DISCOVER_FRESH + 0.1) is None  # stale (a new run started)
    discovery.stop()
    discovery.forget()
    assert discovery.poll(1.0) is None and not said
    discovery.stop()
