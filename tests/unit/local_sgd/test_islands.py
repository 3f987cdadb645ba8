"""Islands (tfdist/local_sgd/islands.py): synchronous inside a group of workers, local SGD /
DiLoCo between groups — checked on every replica against a NumPy simulation
(tests/e2e/jobs/islands_job.py `reference`), in one process on logical CPUs and as real
workers on localhost."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import tfdist
from tfdist.config import ConfigError, config_from_dict
from tfdist.errors import UnsupportedError
from tfdist.local_sgd.islands import island_groups, present_islands
from paths import JOBS as JOB_DIR

JOBS = str(JOB_DIR)
sys.path.insert(0, JOBS)
from islands_job import FEATURES, reference  # noqa: E402
from test_multiworker_training import batched_runs, one_launch  # noqa: E402

JOB = os.path.join(JOBS, "islands_job.py")
TFDIST = [sys.executable, "-m", "tfdist"]


# --- the groups ------------------------------------------------------------------------

def test_island_groups_from_a_count_hosts_or_lists():
    assert island_groups(None, 3) == [[0], [1], [2]]
    assert island_groups(2, 4) == [[0, 1], [2, 3]]
    assert island_groups("host", 4, ["a", "b", "a", "b"]) == [[0, 2], [1, 3]]
    assert island_groups([[3, 0], [2, 1]], 4) == [[0, 3], [1, 2]]
    with pytest.raises(UnsupportedError, match="divisible by 3; this job has 4"):
        island_groups(3, 4)
    with pytest.raises(UnsupportedError, match="every worker index 0..3 exactly once"):
        island_groups([[0, 1], [2]], 4)


@pytest.mark.parametrize("spec, places, groups, kept", [
    (2, "0,1,2,3/4", [[0, 1], [2, 3]], [0, 1]),  # all there: as without a resize
    (2, "0,1,3/4", [[0, 1], [2]], [0, 1]),  # an island that lost a worker goes on smaller
    (2, "0,1/4", [[0, 1]], [0]),  # an island lost: the other trains alone
    (2, "2,3/4", [[0, 1]], [1]),
    ([[0, 3], [1, 2]], "0,1,2/4", [[0], [1, 2]], [0, 1]),
    (3, "0,1,4,5/6", [[0, 1], [2, 3]], [0, 2]),
    ("host", "0,2/4", [[0, 1]], [0]),  # by host: the hosts of the tasks here
])
def test_islands_of_the_whole_cluster_are_found_among_the_places_left(spec, places, groups,
                                                                     kept):
    """An elastic job's islands are given for the whole cluster; at a smaller size the
    launcher names the places its tasks hold (TFDIST_ELASTIC_PLACES), and each island
    holds the tasks here whose places it lists."""
    units = places.split("/")[0].count(",") + 1
    found = present_islands(spec, units, environ={"TFDIST_ELASTIC_PLACES": places})
    assert found[:2] == (groups, kept)
    assert found[2] == (len(island_groups(spec, int(places.split("/")[1])))
                        if spec != "host" else 1)
    assert present_islands(2, 4, environ={}) == ([[0, 1], [2, 3]], [0, 1], 2)


@pytest.mark.parametrize("value", ["0,1/4", "0,1,2", "", "a,b,c/4", "2,1,0/4", "0,0,1/4",
                                   "0,1,4/4", "0,1,2/99999", " 0,1,2/4", "0,1,2/4\n",
                                   "-1,0,1/4", "0,1," + "9" * 9 + "/4", "0,1,2/" + "9" * 5000,
                                   "0,1,\x1b[2J/4"])
def test_a_malformed_places_variable_is_refused_in_one_line_naming_it(value):
    with pytest.raises(UnsupportedError) as raised:
        present_islands(2, 3, environ={"TFDIST_ELASTIC_PLACES": value})
    message = str(raised.value)
    assert "TFDIST_ELASTIC_PLACES" in message and "\n" not in message, message
    assert message.isprintable() and len(message) < 400, message


@pytest.mark.parametrize("islands, message", [
    (0, "between 1 and 64"), (True, "an integer"), ("hosts", "did you mean 'host'"),
    ([], "empty list"), ([[0, 1], [1, 2, 3]], "worker 1 is in two islands"),
    ([[0], []], "non-empty list"), ([[0], [2, 3, 4]], "missing: \\[1\\]"),
    ([[0, 1], [2]], "they list 3"), (3, "divisible by 3; the cluster has 4"),
    ([["a"]], "an integer"),
])
def test_bad_islands_are_located_config_errors(islands, message):
    with pytest.raises(ConfigError, match=message) as raised:
        config_from_dict({"cluster": {"worker": 4}, "strategy": "multi_worker_mirrored",
                          "local_sgd": {"period": 4, "islands": islands}})
    assert "local_sgd.islands" in str(raised.value)


@pytest.mark.parametrize("options, islands, message", [
    ({"logical_cpus": 2}, 3, "divisible by 3; the strategy's devices give 2"),
    ({"devices": ["/cpu:0", "/cpu:1"]}, [[0], [1], [2]], "every replica index 0..1 exactly"),
    ({"logical_cpus": 4}, [[0, 1]], "they list 2"),
])
def test_islands_one_machines_replicas_cannot_hold_are_refused_by_validate(options, islands,
                                                                          message):
    """On one machine islands group its replicas: where the strategy's options name them
    (devices, logical_cpus), islands that cannot group them are refused with the key."""
    with pytest.raises(ConfigError, match=message) as raised:
        config_from_dict({"strategy": {"name": "mirrored", **options},
                          "local_sgd": {"period": 4, "islands": islands}})
    assert "local_sgd.islands" in str(raised.value)


@pytest.mark.parametrize("options, islands", [({"logical_cpus": 4}, 2), ({}, 3),
                                              ({"logical_cpus": 3}, [[0, 2], [1]])])
def test_islands_one_machine_can_hold_or_whose_replicas_it_decides_pass(options, islands):
    config_from_dict({"strategy": {"name": "mirrored", **options},
                      "local_sgd": {"period": 4, "islands": islands}})


def test_the_constructor_refuses_what_the_config_refuses():
    with pytest.raises(ConfigError, match=r"ModelAverager\(\): islands\[1\]\[0\]: worker 0"):
        tfdist.local_sgd.ModelAverager(4, islands=[[0], [0]])
    averager = tfdist.local_sgd.ModelAverager(4, islands=[[1, 0], [2]])
    assert averager.islands == ((1, 0), (2,))


# --- one process: 2 logical CPUs, model.fit ------------------------------------------------

@pytest.mark.usefixtures("two_cpus", "jobs_path")
def test_one_island_of_every_replica_is_synchronous_training(strategies):
    """islands: 1 all-reduces every step, and averaging identical weights changes
    nothing: the weights of synchronous training."""
    from test_local_sgd import assert_same, fit, weights

    strategy = strategies("mirrored")
    synchronous, _ = fit(strategy)
    island, _ = fit(strategy, [tfdist.callbacks.LocalSGD(period=3, islands=1)])
    assert_same(weights(island), weights(synchronous))


@pytest.mark.usefixtures("two_cpus", "jobs_path")
def test_an_island_per_replica_is_plain_local_sgd(strategies):
    from test_local_sgd import fit, weights

    strategy = strategies("mirrored")
    plain, _ = fit(strategy, [tfdist.callbacks.LocalSGD(period=3)])
    island, _ = fit(strategy, [tfdist.callbacks.LocalSGD(period=3, islands=2)])
    for a, b in zip(weights(island), weights(plain)):
        np.testing.assert_array_equal(a, b)


# --- 4 replicas, against NumPy ----------------------------------------------------------

def launch_job(tmp_path, *argv, launch=None, timeout=300):
    """The job (under `tfdist launch` with a `launch` config), as a finished process."""
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, JOB, "--out", str(out), *argv]
    if launch is not None:
        config = tmp_path / "job.yaml"
        config.write_text(launch)
        command = [*TFDIST, "launch", str(config), "--", *command]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def run_job(tmp_path, *argv, launch=None, timeout=300):
    out = tmp_path / "out"
    result = launch_job(tmp_path, *argv, launch=launch, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-4000:]
    return replicas_in(out)


def replicas_in(out):
    """{replica: {"kernel": ..., "bias": ...}} of every worker's saved weights in `out`."""
    replicas = {}
    for path in out.glob("*.npz"):
        saved = np.load(path)
        for key in saved.files:
            _, replica, name = key.split("_")
            replicas.setdefault(int(replica), {})[name] = saved[key]
    return replicas


def batched(request, on, run=0):
    """(every replica's weights, the output folder) of the test's `run`-th job among those
    batched `on` FOUR_WORKERS or ONE_MACHINE."""
    fixture = "four_worker_runs" if on is ON_FOUR_WORKERS else "machine_runs"
    _, out, _ = one_launch(request, fixture, on, run)
    return replicas_in(out), out


def assert_matches(replicas, groups, count, atol=1e-6, **schedule):
    expected = reference(count, groups, **schedule)
    assert sorted(replicas) == list(range(count))
    for r in range(count):  # every replica of every worker
        np.testing.assert_allclose(replicas[r]["kernel"], expected[r][0], atol=atol)
        np.testing.assert_allclose(replicas[r]["bias"], expected[r][1], atol=atol)
    flat = reference(count, [[r] for r in range(count)], **schedule)
    assert not np.allclose(expected[0][0], flat[0][0], atol=1e-4)  # islands made a difference


SCHEDULE = dict(period=3, warmup=2, steps=9, lr=0.05)


def schedule_args(period, warmup, steps, lr):
    return ["--period", str(period), "--warmup", str(warmup), "--steps", str(steps),
            "--lr", str(lr)]


FOUR_WORKERS = "cluster: {worker: 4}\nstrategy: multi_worker_mirrored\n"
STREAMING = ("--fragments", "2", "--overlap", "1")
SCHEDULE_ARGS = tuple(schedule_args(**SCHEDULE))
SLOWED = dict(period=6, warmup=2, steps=26, lr=0.05)  # a slowed island's: measured paces
#: The jobs that end well, batched: on FOUR_WORKERS by one launch (`four_worker_runs`),
#: and on one machine's 4 logical CPUs in one process (`machine_runs`), each a new strategy
#: (tests/e2e/jobs/runs.py): a test's name -> a function of its parameters giving its flags
#: (several lists for several jobs; none: the case runs on its own).
ON_FOUR_WORKERS = {
    "test_workers_on_localhost_train_as_numpy_says": lambda workers, islands: (
        ("--islands", islands, *SCHEDULE_ARGS) if workers == 4 else ()),
    "test_islands_send_their_change_once_in_quantised_shards": lambda: (
        "--islands", "2", "--compression", "int8", "--warmup-compression", "int8",
        *SCHEDULE_ARGS),
    "test_a_slower_island_trains_fewer_local_steps_and_weighs_less": lambda loop: (
        "--islands", "2", "--island-steps", "3,1", "--loop", loop, *SCHEDULE_ARGS),
    "test_measured_island_steps_let_a_slowed_island_train_fewer_calls": lambda policy: (
        "--islands", "2", "--island-steps", "auto", "--slow-workers", "2,3", "--slow-seconds",
        "0.05", *(["--policy", policy] if policy else []), *schedule_args(**SLOWED)),
    "test_overlapped_fragments_between_islands_of_workers_train_as_on_one_machine": lambda: (
        "--islands", "2", *STREAMING, *SCHEDULE_ARGS),
    "test_a_loss_scale_skip_is_one_islands_own": lambda: (
        "--islands", "2", "--spoil", "4:2:huge", "--policy", "mixed_float16", *SCHEDULE_ARGS),
    "test_keras_fit_and_your_own_loop_train_as_numpy_says": lambda loop, policy, launch: (
        ("--islands", "2", "--loop", loop, *SCHEDULE_ARGS) if launch else ()),
}
ON_ONE_MACHINE = {
    "test_four_logical_cpus_train_as_numpy_says": lambda islands: (
        "--replicas", "4", "--islands", islands, *SCHEDULE_ARGS),
    "test_overlapped_fragments_between_islands_of_workers_train_as_on_one_machine": lambda: [
        ("--replicas", "4", "--islands", "2", *STREAMING, *SCHEDULE_ARGS),
        ("--replicas", "4", *STREAMING, *SCHEDULE_ARGS)],
    "test_keras_fit_and_your_own_loop_train_as_numpy_says": lambda loop, policy, launch: (
        () if launch else ("--replicas", "4", "--islands", "2", "--loop", loop,
                           *(["--policy", policy] if policy else []), *SCHEDULE_ARGS)),
    "test_islands_under_mixed_float16": lambda: (
        "--replicas", "4", "--islands", "2", "--policy", "mixed_float16", *SCHEDULE_ARGS),
}


@pytest.fixture(scope="module")
def four_worker_runs(request, tmp_path_factory):
    return batched_runs(request, tmp_path_factory, FOUR_WORKERS, ON_FOUR_WORKERS, job=JOB)


@pytest.fixture(scope="module")
def machine_runs(request, tmp_path_factory):
    return batched_runs(request, tmp_path_factory, None, ON_ONE_MACHINE, job=JOB)


@pytest.mark.multiprocess
@pytest.mark.parametrize("islands, groups", [("2", [[0, 1], [2, 3]]),
                                             ("[[0, 3], [1, 2]]", [[0, 3], [1, 2]]),
                                             ("[[0], [1, 2, 3]]", [[0], [1, 2, 3]])],
                         ids=["two-equal", "explicit", "unequal"])
def test_four_logical_cpus_train_as_numpy_says(request, islands, groups):
    replicas, _ = batched(request, ON_ONE_MACHINE)
    assert_matches(replicas, groups, 4, **SCHEDULE)


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers, islands, groups", [
    (4, "2", [[0, 1], [2, 3]]), (3, "[[0], [1, 2]]", [[0], [1, 2]]),
    (4, "host", [[0, 1, 2, 3]])], ids=["4-workers-2-islands", "3-workers-unequal", "host"])
def test_workers_on_localhost_train_as_numpy_says(request, tmp_path, workers, islands, groups):
    """Real workers under tfdist launch: sub-group collectives inside each island on
    TensorFlow's own collective runtime."""
    if workers == 4:
        replicas, out = batched(request, ON_FOUR_WORKERS)
    else:
        out = tmp_path / "out"
        replicas = run_job(tmp_path, "--islands", islands, *SCHEDULE_ARGS,
                           launch=f"cluster: {{worker: {workers}}}\n"
                                  "strategy: multi_worker_mirrored\n")
    if islands == "host":  # one host: one island, i.e. synchronous training
        expected = reference(4, groups, **SCHEDULE)
        for r in range(4):
            np.testing.assert_allclose(replicas[r]["kernel"], expected[r][0], atol=1e-6)
        return
    assert_matches(replicas, groups, workers, **SCHEDULE)
    if islands == "2":  # between synchronisations nothing crosses between the islands
        sent = [json.loads(p.read_text()) for p in out.glob("*.json")]
        assert len(sent) == workers
        model, verdict = 4 * (FEATURES + 1), 4  # float32 kernel and bias; one flag
        shard = 4 * -(-(FEATURES + 1) // 2)  # each worker's half of its island's change
        warmup, local = SCHEDULE["warmup"], SCHEDULE["steps"] - SCHEDULE["warmup"]
        synchronisations = -(-local // SCHEDULE["period"])  # the last one: before the read
        for totals in sent:  # every step of the warm-up, then only at each synchronisation;
            # a half of the model per worker: the islands' sums cross once, not per worker
            assert totals["reduced"] == (warmup + synchronisations) * (shard + verdict)
            # inside: each step's gradients and verdict; the halves put back together
            assert totals["island"] == ((warmup + local) * (model + verdict)
                                        + (warmup + synchronisations) * 2 * shard)




@pytest.mark.multiprocess
def test_islands_send_their_change_once_in_quantised_shards(request):
    """Between islands of equal size the change goes hierarchically: each of an island's
    two workers quantises (int8) and sends its half of the island's change — in the
    warm-up, of the island's gradient sum —, the island puts the halves back together:
    NumPy with exactly those quantisations, and not the flat exchange's (each replica's
    whole change quantised)."""
    replicas, _ = batched(request, ON_FOUR_WORKERS)
    groups = [[0, 1], [2, 3]]
    assert_matches(replicas, groups, 4, atol=1e-5, compression="int8",
                   warmup_compression="int8", **SCHEDULE)
    for quantised in ({}, {"compression": "int8"}):  # the warm-up's quantisation counts too
        other = reference(4, groups, **quantised, **SCHEDULE)
        assert not np.allclose(replicas[0]["kernel"], other[0][0], atol=1e-5)


@pytest.mark.multiprocess
@pytest.mark.parametrize("loop", ["trainer", "fit", "own"])
def test_a_slower_island_trains_fewer_local_steps_and_weighs_less(request, loop):
    """Heterogeneous islands (`island_steps: [3, 1]`, period 3): the second island trains
    on one call of each period (the third) — reading no batch on the others in fit and
    the Trainer; your own loop's batch is dropped — and still synchronises with the first
    at every period; the averages weigh the islands 3:1 by the samples they trained on.
    Every replica of the 4 workers as NumPy says."""
    schedule = dict(SCHEDULE, island_steps=[3, 1], loop_reads=loop == "own")
    replicas, out = batched(request, ON_FOUR_WORKERS)
    expected = reference(4, [[0, 1], [2, 3]], **schedule)
    for r in range(4):
        np.testing.assert_allclose(replicas[r]["kernel"], expected[r][0], atol=1e-6)
        np.testing.assert_allclose(replicas[r]["bias"], expected[r][1], atol=1e-6)
    equal = reference(4, [[0, 1], [2, 3]], **SCHEDULE)
    assert np.abs(expected[0][0] - equal[0][0]).max() > 1e-3  # the counts made a difference
    if loop == "fit":  # the steps' logs were each worker's own; the epoch's are every worker's
        logs = [json.loads(p.read_text()) for p in sorted(out.glob("*.logs"))]
        assert len(logs) == 4 and all(log == logs[0] for log in logs), logs


@pytest.mark.multiprocess
@pytest.mark.parametrize("policy", [None, "mixed_float16"])
def test_measured_island_steps_let_a_slowed_island_train_fewer_calls(request, policy):
    """`island_steps: auto` with the second island's workers 50 ms slower per step: from
    the second period on, the islands' agreed times give the fast island every call of a
    period and the slow one fewer — the same counts on every worker — and every replica
    trains as NumPy says with those counts, each island weighed by its samples (under
    mixed_float16 too, within float16's rounding)."""
    schedule = SLOWED
    replicas, out = batched(request, ON_FOUR_WORKERS)
    histories = [json.loads(p.read_text()) for p in sorted(out.glob("*.pace.json"))]
    assert len(histories) == 4 and all(h == histories[0] for h in histories), histories
    history = histories[0]
    assert history[0] == [0, [6, 6]] and len(history) >= 2, history  # measured, then used
    assert history[1][0] == 1 and all(fast == 6 and 1 <= slow < 6
                                      for _, (fast, slow) in history[1:]), history
    expected = reference(4, [[0, 1], [2, 3]], island_steps=history, **schedule)
    atol = 5e-3 if policy else 1e-6
    for r in range(4):
        np.testing.assert_allclose(replicas[r]["kernel"], expected[r][0], atol=atol)
        np.testing.assert_allclose(replicas[r]["bias"], expected[r][1], atol=atol)
    equal = reference(4, [[0, 1], [2, 3]], **schedule)
    assert np.abs(expected[0][0] - equal[0][0]).max() > 4 * max(atol, 1e-3)  # the counts made a difference


@pytest.mark.parametrize("section, message", [
    ({"period": 3, "island_steps": [3, 1]}, "island_steps needs islands"),
    ({"period": 3, "islands": 2, "island_steps": [3]}, "islands gives 2, island_steps lists 1"),
    ({"period": 3, "islands": [[0], [1]], "island_steps": [3, 4]}, "between 1 and 3"),
    ({"period": 3, "islands": 2, "island_steps": [3, 0]}, "between 1 and 3"),
    ({"period": 3, "islands": 2, "island_steps": 3}, "a list of local steps per island"),
    ({"period": 3, "islands": 2, "island_steps": "measured"}, "expected auto or a list"),
    ({"period": 3, "islands": 2, "island_steps": [3, True]}, "island_steps"),
    ({"period": 3, "islands": 2, "island_steps": []}, "a list of local steps per island")])
def test_bad_island_steps_are_located_errors_in_the_config_and_the_constructor(section, message):
    with pytest.raises(ConfigError, match=message) as error:
        config_from_dict({"strategy": "multi_worker_mirrored", "local_sgd": section})
    assert "local_sgd.island_steps" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=message):
        tfdist.local_sgd.ModelAverager(**section)


@pytest.mark.parametrize("sections, fragment", [
    ({"strategy": "mirrored", "local_sgd": {"period": 4, "islands": 2, "island_steps": [2, 4]}},
     "island_steps needs islands of workers"),
    ({"cluster": {"worker": 2}, "strategy": "multi_worker_mirrored",
      "local_sgd": {"period": 4, "islands": 65}}, "between 1 and 64"),
    ({"cluster": {"worker": 65}, "strategy": "multi_worker_mirrored",
      "local_sgd": {"period": 4, "islands": [[i] for i in range(65)]}}, "at most 64 islands"),
])
def test_validate_refuses_the_islands_a_job_would_refuse_at_start(sections, fragment):
    """What the job refuses at start from the config alone (`_weigh_islands`,
    `IslandReduce`'s 64 groups), `tfdist validate` refuses first, in one located line."""
    from tfdist.config import config_from_dict

    with pytest.raises(ConfigError, match=fragment) as refused:
        config_from_dict(sections)
    assert "local_sgd.island" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.usefixtures("two_cpus")
def test_island_steps_on_one_machines_replicas_are_refused(strategies):
    """A machine's replicas share one loop: they cannot train at two paces."""
    from test_local_sgd import fit

    with pytest.raises(UnsupportedError, match="island_steps needs islands of workers"):
        fit(strategies("mirrored"), [tfdist.callbacks.LocalSGD(
            period=3, islands=2, island_steps=[3, 1])], steps=2)


@pytest.mark.multiprocess
@pytest.mark.parametrize("training, where", [
    ((), "at the synchronisation after local step 3"),
    (STREAMING, "at the synchronisation applied after local step 4")],
    ids=["synchronisation", "overlapped-exchange"])
def test_a_nan_in_one_island_stops_every_worker_at_the_next_synchronisation(tmp_path, training,
                                                                          where):
    """A NaN gradient on worker 0 at step 3 (local step 2) is refused by its island, which
    decides alone; every worker of both islands then fails with the refusal's message at
    the next synchronisation (after local step 3) — no island left waiting in a collective.
    With overlapped exchanges the agreement rides the next exchange sent: fragment 1's,
    after local step 3 (period 3, 2 fragments; fragment 0's, sent before the NaN, carries
    nothing of it), and every worker fails where it is applied, one step later."""
    result = launch_job(tmp_path, "--islands", "2", "--spoil", "3:0:nan", *training,
                        *schedule_args(**SCHEDULE), launch=FOUR_WORKERS, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-3000:]
    refused = sorted((tmp_path / "out").glob("*.refused"))
    assert [p.stem for p in refused] == [f"worker-{i}" for i in range(4)], output[-3000:]
    for path in refused:
        message = path.read_text()
        assert message.startswith("tfdist: a NaN or Inf gradient on some replica: 1 local "
                                  "step(s) of an island"), message
        assert f"{where}: every worker stops" in message


@pytest.mark.multiprocess
def test_overlapped_fragments_between_islands_of_workers_train_as_on_one_machine(request):
    """Streaming DiLoCo's overlapped fragments between 2 islands of 2 workers (the
    exchange hierarchical, the islands' agreement carried by each exchange) end with the
    weights of the same training on 4 logical CPUs of one machine (islands of replicas:
    the flat exchange, an agreement of no one), on every replica."""
    workers, _ = batched(request, ON_FOUR_WORKERS)
    machine, _ = batched(request, ON_ONE_MACHINE, run=0)
    assert sorted(workers) == sorted(machine) == list(range(4))
    for r in range(4):
        for name in ("kernel", "bias"):
            np.testing.assert_allclose(workers[r][name], machine[r][name], atol=1e-6)
    flat, _ = batched(request, ON_ONE_MACHINE, run=1)
    assert not np.allclose(flat[0]["kernel"], machine[0]["kernel"], atol=1e-4)


@pytest.mark.multiprocess
def test_a_loss_scale_skip_is_one_islands_own(request):
    """mixed_float16: worker 2's float16 gradient overflows at step 4 (local); its island
    skips that step (and halves its scale), the other island does not, and the islands
    still synchronise at the same steps: every replica as the NumPy simulation says."""
    replicas, _ = batched(request, ON_FOUR_WORKERS)
    skipped = reference(4, [[0, 1], [2, 3]], skip=(4, 2), **SCHEDULE)
    assert_matches(replicas, [[0, 1], [2, 3]], 4, atol=5e-3, skip=(4, 2), **SCHEDULE)
    everywhere = reference(4, [[0, 1], [2, 3]], skip=(4, None), **SCHEDULE)
    assert np.abs(skipped[0][0] - everywhere[0][0]).max() > 1e-2  # 4x the tolerance: not
    # what a step skipped by every island gives


@pytest.mark.multiprocess
@pytest.mark.parametrize("loop, policy, launch", [
    ("fit", None, None), ("own", None, None), ("own", "mixed_float16", None),
    ("fit", None, "cluster: {worker: 4}\nstrategy: multi_worker_mirrored\n")],
    ids=["fit", "own-loop", "own-loop-mixed-float16", "fit-4-workers"])
def test_keras_fit_and_your_own_loop_train_as_numpy_says(request, loop, policy, launch):
    """The same hook in `model.fit` (the LocalSGD callback) and in the tutorial's
    `tf.GradientTape` loop under `tfdist.function` (loss scaling by the optimizer's
    `scale_loss` under mixed_float16)."""
    replicas, _ = batched(request, ON_FOUR_WORKERS if launch else ON_ONE_MACHINE)
    assert_matches(replicas, [[0, 1], [2, 3]], 4, atol=5e-3 if policy else 1e-6, **SCHEDULE)


@pytest.mark.multiprocess
def test_islands_under_mixed_float16(request):
    """float16 compute with dynamic loss scaling (an initial scale of 2: no step
    overflows, so the simulation's steps are the run's): the island mean of the unscaled
    gradients, within float16's precision of the float32 simulation."""
    replicas, _ = batched(request, ON_ONE_MACHINE)
    assert_matches(replicas, [[0, 1], [2, 3]], 4, atol=5e-3, **SCHEDULE)


def test_the_config_carries_islands_to_the_averager():
    config = config_from_dict({"cluster": {"worker": 4}, "strategy": "multi_worker_mirrored",
                               "local_sgd": {"period": 8, "outer": "nesterov",
                                             "islands": [[0, 1], [2, 3]]}})
    averager = tfdist.local_sgd.ModelAverager.from_config(config.local_sgd)
    assert averager.islands == ((0, 1), (2, 3))
    assert json.dumps(averager.islands) == "[[0, 1], [2, 3]]"


# --- a compressed warm-up (the synchronous steps are where local SGD sends most) ----------

TOPK_EF = {"name": "topk", "ratio": 0.1, "error_feedback": True, "min_size": 0}


@pytest.mark.usefixtures("two_cpus", "jobs_path")
def test_a_compressed_warm_up_trains_as_that_compression_does(strategies):
    """During the warm-up, ModelAverager(warmup_compression=top-k + EF) exchanges exactly
    as DistributedOptimizer(top-k + EF) does: the same weights after 6 steps."""
    import keras
    from test_local_sgd import assert_same, fit, weights

    strategy = strategies("mirrored")
    averaged, _ = fit(strategy, [tfdist.callbacks.LocalSGD(
        period=100, warmup_steps=6, warmup_compression=TOPK_EF)], steps=6)
    with strategy.scope():
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), TOPK_EF)
    compressed, _ = fit(strategy, steps=6, optimizer=optimizer)
    plain, _ = fit(strategy, [tfdist.callbacks.LocalSGD(period=100, warmup_steps=6)], steps=6)
    assert_same(weights(averaged), weights(compressed), atol=1e-6)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in
                   zip(weights(averaged), weights(plain)))  # top-k really ran


def test_warm_up_compression_is_checked_like_any_compression_section():
    config = config_from_dict({"strategy": "mirrored", "local_sgd": {
        "period": 8, "warmup_steps": 4, "warmup_compression": TOPK_EF}})
    assert config.local_sgd.warmup_compression.name == "topk"
    averager = tfdist.local_sgd.ModelAverager.from_config(config.local_sgd)
    assert averager.warmup_exchange.compressor.ratio == 0.1
    for section, message in (({"name": "topk", "start_step": 3}, "no delayed start"),
                             ({"name": "top-k"}, "did you mean 'topk'")):
        with pytest.raises(ConfigError, match=message):
            config_from_dict({"strategy": "mirrored", "local_sgd": {
                "period": 8, "warmup_compression": section}})
    with pytest.raises(ValueError, match="no phases of its own"):
        tfdist.local_sgd.ModelAverager(8, warmup_compression={
            "name": "topk", "ratio": 0.01, "ratio_warmup_steps": 5})


def test_more_islands_than_collective_groups_are_refused():
    import types

    from tfdist.local_sgd.islands import MAX_ISLANDS, IslandReduce

    strategy = types.SimpleNamespace(num_replicas_in_sync=MAX_ISLANDS + 1)
    with pytest.raises(UnsupportedError, match=f"at most {MAX_ISLANDS} islands"):
        IslandReduce(strategy, MAX_ISLANDS + 1)
    assert len(IslandReduce(types.SimpleNamespace(num_replicas_in_sync=4), 2).groups) == 2


@pytest.mark.usefixtures("two_cpus")
def test_a_finite_dataset_that_couples_islands_is_named(strategies):
    """TensorFlow's seam: a distributed iterator over a finite dataset without static
    shapes checks every batch for a partial last one with a collective across workers
    (so do finite ones in any multi-worker job); an infinite one does not. tfdist warns
    when islands step apart on such an iterator (fails loudly if the seam moves)."""
    import tensorflow as tf

    from tfdist.loop.runner import COUPLED_INPUT, check_input
    from tfdist.strategies.input_pipelines import checks_partial_batches

    strategy = strategies("mirrored")
    finite = tf.data.Dataset.range(10).batch(3)  # the last batch is partial: no static shape
    coupled = iter(strategy.experimental_distribute_dataset(finite))
    apart = iter(strategy.experimental_distribute_dataset(finite.repeat()))
    assert checks_partial_batches(coupled) and not checks_partial_batches(apart)
    with pytest.warns(UserWarning, match="read a finite dataset") as caught:
        check_input(coupled)
    assert str(caught[0].message) == COUPLED_INPUT
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_input(apart)
        check_input(apart, paced=True)
    # heterogeneous islands would run that collective out of step: refused in one line
    with pytest.raises(UnsupportedError, match="island_steps: a slower island skips") as no:
        check_input(coupled, paced=True)
    assert "dataset.repeat()" in str(no.value) and "\n" not in str(no.value)


@pytest.mark.usefixtures("two_cpus")
def test_fit_apart_needs_one_step_per_call(strategies):
    """fit's step for islands between synchronisations runs one `train_step` per call: a
    model compiled with steps_per_execution > 1 is refused in one line saying what to do."""
    import keras

    from tfdist.keras.callbacks.training_hooks import _train_function_apart

    with strategies("mirrored").scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", steps_per_execution=4)
    with pytest.raises(UnsupportedError, match="compile with steps_per_execution=1") as error:
        _train_function_apart(model)
    assert "\n" not in str(error.value) and "steps_per_execution=4" in str(error.value)
