"""Training across real worker processes launched by `tfdist launch`.

MultiWorkerMirroredStrategy with 2 workers (model.fit and tfdist.Trainer), and
ParameterServerStrategy with chief + 2 workers + 1 ps (tfdist.Trainer), all on localhost.
Each job is tests/e2e/jobs/train_job.py; it writes its results for the test to check.
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from paths import JOBS

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("jobs_path")]

JOB = JOBS / "train_job.py"
MWMS = "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
PS = "cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n"


def launch(write_config, out, cluster, *args, expect_success=True, timeout=240,
           launcher_args=(), job=JOB):
    """Runs the job on every task; returns ({task: result}, CompletedProcess).

    The tasks' temporary directory is `out`/../tmp, for the test to inspect.
    """
    out.mkdir(exist_ok=True)
    (out.parent / "tmp").mkdir(exist_ok=True)
    config = write_config(cluster, name="cluster.yaml")
    run = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds", "5",
         *launcher_args, "--",
         sys.executable, str(job), "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, TMPDIR=str(out.parent / "tmp")))
    if expect_success:
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return results, run


def weights(out, task):
    with np.load(out / f"{task}.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


RUNS = JOBS / "runs.py"
PLAIN = ("--model", "plain", "--epochs", "2")
#: The 2-worker jobs that end well, run by one launch (`two_worker_runs`): a test's name ->
#: the job's flags for its parameters.
ONE_LAUNCH = {
    "test_two_workers_match_single_device_training": lambda loop: ("--loop", loop, *PLAIN),
    "test_compressed_exchange_across_processes_matches_single_device":
        lambda compression: (*PLAIN, "--compression", compression,
                             *(("--ratio", "1.0") if compression == "topk" else ("--rank", "64"))),
    "test_local_sgd_workers_diverge_between_averages_and_end_identical":
        lambda loop: ("--loop", loop, *PLAIN, "--local_sgd", "3", "--warmup", "1"),
    "test_streaming_diloco_workers_end_identical_and_learn":
        lambda loop: ("--loop", loop, *PLAIN, "--local_sgd", "4", "--warmup", "1",
                      "--diloco", "2,1"),
    "test_accumulation_on_two_workers_equals_one_device_on_the_whole_batch":
        lambda: (*PLAIN, "--accumulate", "2"),
    "test_batchnorm_dropout_and_dict_models_learn_on_two_workers":
        lambda loop, model: ("--loop", loop, "--model", model, "--epochs", "4"),
    "test_compression_auto_decides_alike_on_every_worker":
        lambda: ("--loop", "trainer", "--model", "plain", "--epochs", "4", "--auto", "20"),
    "test_warmup_steps_auto_judges_alike_on_every_worker":
        lambda workers, shape: AUTO_WARMUP[shape] if workers == 2 else None,
    # the uninterrupted run the killed one is compared with (no dropout: the same weights
    # in a process that ran other jobs before)
    "test_killed_worker_resumes_diloco_with_its_outer_momentum":
        lambda: ("--loop", "fit", "--model", "plain", "--epochs", "4", "--local_sgd", "4",
                 "--diloco", "1,0"),
}


_AUTO_PLAIN = ("--loop", "fit", "--model", "plain", "--epochs", "4", "--local_sgd", "4",
               "--warmup", "auto")
#: `warmup_steps: auto` with DiLoCo (judged after auto's steps) and with plain local SGD
#: (judged before the first step too).
AUTO_WARMUP = {"diloco": (*_AUTO_PLAIN, "--diloco", "2,1"), "plain": _AUTO_PLAIN,
               # a 1 Mbit/s link: local from the first step, under mixed_float16
               "plain, slow link": (*_AUTO_PLAIN, "--link", "1", "--policy", "mixed_float16")}
#: The 4-worker runs never interrupted that the SIGTERM tests compare with, run by one
#: launch (`four_worker_runs`).
FOUR_WORKERS = "cluster: {worker: 4}\nstrategy: multi_worker_mirrored\n"
THREE_WORKERS = "cluster: {worker: 3}\nstrategy: multi_worker_mirrored\n"
#: The 3-worker jobs, run by one launch (`three_worker_runs`).
THREE_WORKER_RUNS = {
    "test_sixteen_over_three_workers_trains_as_one_device":
        lambda loop, compression: ("--loop", loop, *PLAIN, "--batch", "16",
                                   "--compression", compression),
}
FOUR_WORKER_CLEAN = {
    "test_sigterm_to_one_of_four_workers_loses_no_step":
        lambda loop, training: ("--loop", loop, "--model", "plain", "--epochs", "3", *training),
    "test_a_global_batch_four_workers_split_unevenly_trains_as_tf_weighs_it":
        lambda: ("--loop", "fit", *PLAIN, "--batch", "30"),
    "test_warmup_steps_auto_judges_alike_on_every_worker":
        lambda workers, shape: AUTO_WARMUP[shape] if workers == 4 else None,
}


def batched_flags(registry, item):
    """The job's flag lists for test `item`'s parameters, from `registry` (a test's name ->
    a function of its parameters giving one flag list, a list of them, or none)."""
    make = registry[item.originalname]
    params = getattr(item, "callspec", None)
    names = make.__code__.co_varnames[:make.__code__.co_argcount]
    made = make(*(params.params[name] for name in names))
    if not made:  # a case the test runs on its own
        return []
    return [tuple(made)] if isinstance(made[0], str) else [tuple(m) for m in made]


def batched_runs(request, tmp_path_factory, cluster, registry, job=JOB):
    """The selected tests of `registry` in the requesting module, run by one `tfdist launch`
    of `cluster` (or one process, if `cluster` is None): each task runs `job` once per
    distinct flag list, each on a new strategy (tests/e2e/jobs/runs.py), which spares a launch
    and a TensorFlow import per task and run. -> ({flags: out}, stdout)."""
    selected = sorted({flags for item in request.session.items
                       if item.module is request.module and item.originalname in registry
                       for flags in batched_flags(registry, item)})
    root = tmp_path_factory.mktemp("batched_runs")
    outs = {flags: root / f"run-{i}" for i, flags in enumerate(selected)}
    runs = [json.dumps(["--out", str(outs[flags]), *flags]) for flags in selected]
    for out in outs.values():
        out.mkdir()
    command = [sys.executable, str(RUNS), str(job), *runs]
    env = dict(os.environ, TMPDIR=str(root), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    if cluster is not None:
        config = root / "cluster.yaml"
        config.write_text(cluster)
        command = [sys.executable, "-m", "tfdist", "launch", str(config), "--", *command]
    run = subprocess.run(command, capture_output=True, text=True,
                         timeout=240 + 120 * len(runs), env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    return outs, run.stdout


@pytest.fixture(scope="module")
def two_worker_runs(request, tmp_path_factory):
    """ONE_LAUNCH's tests, on 2 workers (`batched_runs`)."""
    return batched_runs(request, tmp_path_factory, MWMS, ONE_LAUNCH)


@pytest.fixture(scope="module")
def four_worker_runs(request, tmp_path_factory):
    """FOUR_WORKER_CLEAN's runs, on 4 workers (`batched_runs`)."""
    return batched_runs(request, tmp_path_factory, FOUR_WORKERS, FOUR_WORKER_CLEAN)


@pytest.fixture(scope="module")
def three_worker_runs(request, tmp_path_factory):
    """THREE_WORKER_RUNS' runs, on 3 workers (`batched_runs`)."""
    return batched_runs(request, tmp_path_factory, THREE_WORKERS, THREE_WORKER_RUNS)


def one_launch(request, fixture="two_worker_runs", registry=ONE_LAUNCH, run=0):
    """(the test's {task: result}, its output folder, what the tasks printed during its
    run) from the batched runs of `fixture` (its `run`-th flag list)."""
    outs, stdout = request.getfixturevalue(fixture)
    out = outs[batched_flags(registry, request.node)[run]]
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return results, out, own_lines(stdout, out)


def own_lines(stdout, out):
    """The lines of a batched launch's `stdout` that its tasks ("[worker:0] ...") printed
    during the run writing to `out` (runs.py marks where each run begins)."""
    current, mine = {}, []
    marker = json.dumps(str(out))
    for line in stdout.splitlines():
        task, _, text = line.partition("] ")
        if text.startswith("tfdist-test-run "):
            current[task] = marker in text
        elif current.get(task):
            mine.append(line)
    return "\n".join(mine)


@pytest.mark.parametrize("loop", ["fit", "trainer"])
def test_two_workers_match_single_device_training(request, loop):
    import tensorflow as tf
    from test_strategies import fit_weights

    results, out, _ = one_launch(request)
    reference, reference_history = fit_weights(tf.distribute.get_strategy(), loop)
    assert set(results) == {"worker-0", "worker-1"}
    for task in results:
        assert results[task]["replicas"] == 2
        for w, r in zip(weights(out, task), reference):
            np.testing.assert_allclose(w, r, atol=2e-6)
        np.testing.assert_allclose(results[task]["history"]["loss"],
                                   reference_history["loss"], rtol=1e-5)
    for a, b in zip(weights(out, "worker-0"), weights(out, "worker-1")):
        np.testing.assert_array_equal(a, b)
    if loop == "fit":  # the Keras 3 calls tfdist's MWMS reduce fixes are still made
        fixes = results["worker-0"]["keras_fixes"]
        assert fixes.get("local_build_batch", 0) > 0 and fixes.get("scalar_axis", 0) > 0, fixes


def test_a_global_batch_four_workers_split_unevenly_trains_as_tf_weighs_it(request):
    """Global batches of 30 rows on 4 workers (8, 8, 8, 6; the last one 2 each): Keras 3's
    fit reduces its first batch across the workers and fails before the first step
    ("Shape mismatch in the collective instance"); tfdist answers that look locally
    (tfdist/strategies/keras_build_batch.py). Every worker must end with the weights of
    one device on which each row weighs what it weighs on its worker."""
    import tensorflow as tf
    from models import split_between_workers
    from test_strategies import fit_weights

    results, out, _ = one_launch(request, "four_worker_runs", FOUR_WORKER_CLEAN)
    reference, _ = fit_weights(tf.distribute.get_strategy(), "fit", batch=30,
                               weigh_as_replicas=4, split=split_between_workers)
    assert set(results) == {f"worker-{i}" for i in range(4)}
    for task in results:
        assert results[task]["replicas"] == 4
        assert results[task]["keras_fixes"].get("local_build_batch", 0) > 0
        for w, r in zip(weights(out, task), reference):
            np.testing.assert_allclose(w, r, atol=2e-6)


@pytest.mark.parametrize("loop", ["fit", "trainer"])
@pytest.mark.parametrize("compression, tolerance", [("none", 1e-5), ("fp16", 3e-4)])  # fp16: its rounding
def test_sixteen_over_three_workers_trains_as_one_device(request, loop, compression, tolerance):
    """Global batches of 16 rows on 3 workers, which TensorFlow splits 6/6/4: tfdist's
    exchange weighs each worker's gradient by its rows (tfdist/strategies/batch_rows.py),
    so every worker ends with one device's weights, every row weighing alike (before, the
    rows of the share of 4 weighed 1.5x)."""
    import tensorflow as tf
    from test_strategies import fit_weights

    results, out, _ = one_launch(request, "three_worker_runs", THREE_WORKER_RUNS)
    reference, _ = fit_weights(tf.distribute.get_strategy(), loop, batch=16)
    assert set(results) == {f"worker-{i}" for i in range(3)}
    for task in results:
        assert results[task]["replicas"] == 3
        for w, r in zip(weights(out, task), reference):
            np.testing.assert_allclose(w, r, atol=tolerance)


@pytest.mark.parametrize("compression,tolerance", [("topk", 2e-6), ("powersgd", 1e-4)])
def test_compressed_exchange_across_processes_matches_single_device(request, compression,
                                                                    tolerance):
    """topk keeping everything and full-rank PowerSGD send the payloads across processes
    (all-gather; two all-reduces) and must reproduce uncompressed training."""
    import tensorflow as tf
    from test_strategies import fit_weights

    results, out, _ = one_launch(request)
    reference, _ = fit_weights(tf.distribute.get_strategy(), "fit")
    for task in results:
        for w, r in zip(weights(out, task), reference):
            np.testing.assert_allclose(w, r, atol=tolerance)


@pytest.mark.parametrize("loop", ["fit", "trainer"])
def test_local_sgd_workers_diverge_between_averages_and_end_identical(request, loop):
    results, out, _ = one_launch(request)
    a, b = (results[t]["checksums"] for t in ("worker-0", "worker-1"))
    assert len(a) == len(b) == 8  # 2 epochs of 4 steps
    same = [x == y for x, y in zip(a, b)]
    # step 1 synchronous, 2-3 local, average after 4 (and at the epoch end), 5-6 local,
    # average after 7, 8 local then averaged at the end of the epoch
    assert same[:7] == [True, False, False, True, False, False, True], same
    for x, y in zip(weights(out, "worker-0"), weights(out, "worker-1")):
        np.testing.assert_array_equal(x, y)
    assert results["worker-0"]["history"]["loss"][-1] < results["worker-0"]["history"]["loss"][0]


@pytest.mark.parametrize("loop", ["fit", "trainer"])
def test_streaming_diloco_workers_end_identical_and_learn(request, loop):
    """Outer Nesterov, 2 fragments, int4 exchanges overlapped with one step: the workers
    differ between synchronisations and end with identical weights."""
    results, out, _ = one_launch(request)
    a, b = (results[t]["checksums"] for t in ("worker-0", "worker-1"))
    assert len(a) == len(b) == 8 and a[0] == b[0] and a[1:] != b[1:]
    for x, y in zip(weights(out, "worker-0"), weights(out, "worker-1")):
        np.testing.assert_array_equal(x, y)
    losses = results["worker-0"]["history"]["loss"]
    assert losses[-1] < losses[0]


def test_killed_worker_resumes_diloco_with_its_outer_momentum(request, write_config, tmp_path):
    """DiLoCo's outer optimizer state is in the backup: a job whose worker:1 is SIGKILLed
    mid-epoch 2 and restarted ends with the weights of an uninterrupted job."""
    diloco, = batched_flags(ONE_LAUNCH, request.node)
    out, backup = tmp_path / "out", tmp_path / "backup"
    launch(write_config, out, MWMS, *diloco, "--backup", str(backup), "--kill", "2",
           launcher_args=("--max-restarts", "1"))
    assert (out / "killed").exists()
    _, clean, _ = one_launch(request)
    for task in ("worker-0", "worker-1"):
        for resumed, uninterrupted in zip(weights(out, task), weights(clean, "worker-0")):
            np.testing.assert_allclose(resumed, uninterrupted, rtol=1e-4, atol=1e-6)


def test_accumulation_on_two_workers_equals_one_device_on_the_whole_batch(request):
    """2 workers x 2 micro-batches of 16 = one step on a batch of 64, exchanged once."""
    import keras
    from models import conv_model, dataset, loss

    _, out, _ = one_launch(request)
    model = conv_model(seed=3, batchnorm=False, dropout=0)
    model.compile(keras.optimizers.SGD(0.05), loss())
    model.fit(dataset(128, 64), epochs=2, verbose=0)
    for task in ("worker-0", "worker-1"):
        for w, r in zip(weights(out, task), model.get_weights()):
            np.testing.assert_allclose(w, r, atol=1e-5)


@pytest.mark.parametrize("loop,model", [("fit", "conv"), ("fit", "dict"),
                                        ("trainer", "conv"), ("trainer", "dict")])
def test_batchnorm_dropout_and_dict_models_learn_on_two_workers(request, loop, model):
    results, out, _ = one_launch(request)
    for task, result in results.items():
        loss = result["history"]["loss"]
        assert loss[-1] < 0.6 * loss[0], (task, loss)
        assert result["evaluate"]["sparse_categorical_accuracy"] > 0.8
    if loop == "fit":
        assert results["worker-0"]["predict_shape"] == [128, 3]
    for a, b in zip(weights(out, "worker-0"), weights(out, "worker-1")):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("loop,compression,workers", [("fit", "topk", 2), ("trainer", "none", 4)])
# (fit uncompressed and the Trainer with PowerSGD: test_transaction.py on 2 replicas, and a
# 3-worker PowerSGD+EF overflow below; two launches fewer for CI's time)
def test_a_nan_on_one_worker_is_refused_on_all_and_leaves_no_trace(write_config, tmp_path,
                                                                   loop, compression, workers):
    """One worker's batch holds a NaN (worker:1 of 2, worker:2 of 4), the others' do not:
    every worker raises tfdist's error counting one such replica (none hangs), none changes
    any of its state, and after one more good step all hold exactly what a run that never
    met the bad batch holds."""
    bad = workers // 2
    args = ("--loop", loop, "--compression", compression, "--bad_worker", str(bad))
    job, cluster = JOB.parent / "nan_job.py", MWMS.replace("worker: 2", f"worker: {workers}")
    results, _ = launch(write_config, tmp_path / "bad", cluster, *args, job=job, timeout=180)
    clean, _ = launch(write_config, tmp_path / "clean", cluster, *args, "--clean", job=job,
                      timeout=180)
    assert set(results) == {f"worker-{k}" for k in range(workers)}
    for task, result in results.items():
        assert "NaN or Inf gradient" in result["raised"], (task, result["raised"])
        assert "Replicas with a non-finite gradient:] [1]" in result["raised"]  # a count
        assert len(result["state"]) > 10 and result["changed"] == [], (task, result["changed"])
        assert result["finite"]
        for a, b in zip(result["final"], clean[task]["final"]):
            np.testing.assert_array_equal(a, b)
    for task in results:
        for a, b in zip(results["worker-0"]["final"], results[task]["final"]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("model,compression", [("dict", None),  # conv: compressed below
                                               ("conv", "int8")])  # (fp16's push: the
# sharded variables below; one launch fewer for CI's time)
def test_parameter_server_trainer_learns_and_counts_steps_exactly(write_config, tmp_path, model,
                                                                  compression):
    """The Trainer under parameter servers trains every step once, and the coordinator
    writes tfdist.callbacks.TensorBoard's event files and CSVLogger's file, which hold its
    history (read back with TensorBoard's reader)."""
    from test_logs import scalars

    out, board = tmp_path / "out", tmp_path / "board"
    extra = ("--compression", compression) if compression else ()
    results, run = launch(write_config, out, PS, "--strategy", "parameter_server",
                          "--model", model, "--epochs", "3", "--log_dir", str(board), *extra)
    assert set(results) == {"chief-0"}, "only the coordinator runs the script"
    result = results["chief-0"]
    assert "tfdist.Trainer" in result["fit_error"] and "keras #18624" in result["fit_error"]
    assert result["completed_steps"] == 36 and result["step"] == 36
    # every step of the last epoch counted once, weighted by its 32 rows (as fit weighs it)
    assert result["loss_count"] == 12.0 * 32
    loss = result["history"]["loss"]
    assert loss[-1] < 0.6 * loss[0], loss
    events = [n for n in os.listdir(board / "train") if n.startswith("events.out")]
    assert len(events) == 1, events  # the coordinator's writer
    read = scalars(board / "train")
    assert [s for s, _ in read["epoch_loss"]] == [0, 1, 2]
    np.testing.assert_allclose([v for _, v in read["epoch_loss"]], loss, rtol=1e-6)
    with open(board / "log.csv") as f:
        np.testing.assert_allclose([float(r["loss"]) for r in csv.DictReader(f)], loss,
                                   rtol=1e-6)
    assert os.listdir(out.parent / "tmp") == [], "no scratch left"
    assert "[worker:1] tfdist server" in run.stdout and "[ps:0] tfdist server" in run.stdout


@pytest.mark.parametrize("compression", ["fp16"])  # (uncompressed: the cells above)
def test_parameter_server_shards_large_variables_over_two_ps_and_learns(write_config, tmp_path,
                                                                        compression):
    """max_shards / min_shard_bytes: the conv model's 864-value dense kernel (3456 bytes)
    is split over both ps tasks; the Trainer (and the fp16 push) train it."""
    out = tmp_path / "out"
    extra = ("--compression", compression) if compression else ()
    results, _ = launch(write_config, out, PS.replace("ps: 1", "ps: 2"), "--strategy",
                        "parameter_server", "--model", "conv", "--epochs", "3",
                        "--shard_bytes", "2048", *extra)
    result = results["chief-0"]
    (path, devices), = result["shards"].items()  # only the kernel is large enough
    assert path.endswith("dense/kernel"), path
    assert len(devices) == 2 and {d.split("/task:")[1][0] for d in devices} == {"0", "1"}, devices
    assert all("/job:ps/" in d for d in devices), devices
    assert result["completed_steps"] == 36 and result["step"] == 36
    loss = result["history"]["loss"]
    assert loss[-1] < 0.6 * loss[0], loss


def test_metrics_updated_from_a_hand_written_coordinator_loop_count_every_update(write_config,
                                                                                tmp_path):
    """TensorFlow's parameter-server tutorial loop: 300 functions scheduled on 2 workers each
    update a Mean and an accuracy. Through tfdist.training.update_metric all 300 count."""
    results, run = launch(write_config, tmp_path / "out", PS, "--updates", "300",
                          job=JOB.parent / "coordinator_metrics_job.py")
    counted = results["chief-0"]
    assert counted["tfdist"] == {"mean_count": 300.0, "mean_total": 300 * 301 / 2,
                                 "accuracy_count": 300.0, "accuracy": 1.0}, counted
    # Keras' own update_state is a read-modify-write: concurrent workers may lose updates
    # (191 of 300 measured); it never counts more.
    assert counted["keras"]["mean_count"] <= 300.0
    print("keras update_state counted", counted["keras"])


def test_killed_worker_resumes_from_backup_without_losing_an_epoch(write_config, tmp_path):
    """worker:1 is SIGKILLed mid-epoch 2; `--max-restarts 1` restarts the whole job, which
    resumes from the backup of epoch 1: every epoch runs once, the result is close to an
    uninterrupted run, and nothing is left in the temporary directory."""
    out, backup = tmp_path / "out", tmp_path / "backup"
    args = ("--loop", "fit", "--epochs", "4", "--backup", str(backup), "--kill", "2")
    results, run = launch(write_config, out, MWMS, *args, launcher_args=("--max-restarts", "1"))
    assert "worker:1 exited with code 137; restarting the whole job (1/1)" in run.stderr
    assert (out / "killed").exists()
    lines = (out / "epochs.log").read_text().split("\n")[:-1]
    assert [line.split()[0] for line in lines] == ["0", "1", "2", "3"], lines  # each once
    losses = [float(line.split()[1]) for line in lines]
    assert results["worker-0"]["history"]["loss"] == pytest.approx(losses[2:], rel=1e-3)
    assert list(backup.iterdir()) == []  # the chief removed its backups (only its own files)
    saved = sorted(p.name for p in out.glob("model-*.weights.h5"))  # chief-only checkpoints
    assert saved == [f"model-{e}.weights.h5" for e in (1, 2, 3, 4)]
    assert not list((tmp_path / "tmp").iterdir())  # scratch dirs and private TMPDIRs: gone

    clean = tmp_path / "clean"  # the same job, never interrupted
    uninterrupted, _ = launch(write_config, clean, MWMS, "--loop", "fit", "--epochs", "4")
    first = uninterrupted["worker-0"]["history"]["loss"][0]
    for metric in ("loss", "sparse_categorical_accuracy"):  # both trained to the end
        resumed, clean_value = (r["worker-0"]["evaluate"][metric] for r in (results, uninterrupted))
        assert abs(resumed - clean_value) < 0.02 * max(first, 1), (metric, resumed, clean_value)
    for a, b in zip(weights(out, "worker-0"), weights(out, "worker-1")):
        np.testing.assert_array_equal(a, b)


def wait_for_file(path, timeout=120):
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.1)


def task_pids(out, job, index):
    """PIDs of this test's processes (launched with TFDIST_TEST_OUT=out) for job:index: by
    the TF_CONFIG in their environment, or (forked by `tfdist launch --preload`, whose
    /proc environment and command line are the server's) by the server's tasks/PID files."""
    pids, servers = set(), set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                forked = b"tfdist.launch.preload_server" in f.read()
        except OSError:
            continue
        if f"TFDIST_TEST_OUT={out}" not in environ:
            continue
        if any(e.startswith("TF_CONFIG=") and f'"task":{{"type":"{job}","index":{index}}}' in e
               for e in environ):
            pids.add(int(entry))
        if forked:
            servers.update(e[len("TMPDIR="):] for e in environ if e.startswith("TMPDIR="))
    for tasks in (os.path.join(tmp, "tasks") for tmp in servers):
        for pid in os.listdir(tasks) if os.path.isdir(tasks) else ():
            try:
                with open(os.path.join(tasks, pid)) as f:
                    if f.read() == f"{job}:{index}":
                        pids.add(int(pid))
            except OSError:
                continue
    return sorted(pids)


class Background:
    """`tfdist launch` of the job in the background; its output lines (the launcher's
    messages and every task's prefixed output) gathered as they come."""

    def __init__(self, write_config, out, cluster, *args, launcher_args=()):
        import threading

        out.mkdir(exist_ok=True)
        (out.parent / "tmp").mkdir(exist_ok=True)
        config = write_config(cluster, name="cluster.yaml")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds", "5",
             *launcher_args, "--", sys.executable, str(JOB), "--out", str(out), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, TMPDIR=str(out.parent / "tmp"), TFDIST_TEST_OUT=str(out)))
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout),
                                       daemon=True)
        self.reader.start()

    def wait_for_line(self, text, timeout=120):
        import time

        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None or self.reader.is_alive(), self.output()[-3000:]
            assert time.monotonic() < deadline, f"no line with {text!r}:\n{self.output()[-3000:]}"
            time.sleep(0.1)

    def finish(self, timeout=300):
        try:
            self.proc.wait(timeout)
        finally:
            self.proc.kill()
        self.reader.join(5)
        return self.proc.returncode, self.output()

    def output(self):
        return "".join(self.lines)


def test_parameter_server_worker_killed_the_others_go_on_and_it_is_used_again(write_config,
                                                                             tmp_path):
    """worker:1 is SIGKILLed after epoch 0; epoch 1 runs on worker:0 alone while the
    launcher restarts worker:1; epochs 2-3 run with both again. "Used again" by construction
    (--await_worker1 2): in epoch 2 a step on worker:0 holds (at most 120 s) until a training
    step has run on worker:1, and the chief fails the job if none did."""
    import signal

    out = tmp_path / "out"
    job = Background(write_config, out, PS, "--strategy", "parameter_server", "--loop",
                     "trainer", "--model", "conv", "--epochs", "4", "--pause_after", "0,1",
                     "--await_worker1", "2", launcher_args=("--max-restarts", "1"))
    try:
        wait_for_file(out / "paused-0")
        for pid in task_pids(out, "worker", 1):
            os.kill(pid, signal.SIGKILL)
        (out / "resume-0").touch()
        job.wait_for_line("worker:1 exited with code 137; restarting it (1/1)")
        wait_for_file(out / "paused-1")
        job.wait_for_line("Cluster successfully recovered")  # the coordinator sees worker:1 again
        (out / "resume-1").touch()
        code, output = job.finish()
    finally:
        stop_job(job, out)
    assert code == 0, output[-3000:]
    restarted = output.split("[worker:1] tfdist server: worker:1 serving")
    assert len(restarted) == 3, output[-3000:]  # started twice
    # used again: a training step (not the input pipeline) ran in worker:1's new process
    assert "[worker:1] training step" in restarted[2], output[-3000:]
    assert (out / "stepped-worker-1").read_text() == "worker:1"  # written by it in epoch 2
    result = json.loads((out / "chief-0.json").read_text())
    assert result["completed_steps"] == 48 and result["step"] == 48  # exact, no step lost
    assert result["history"]["loss"][-1] < result["history"]["loss"][0]


def stop_job(job, out):
    """Kills whatever is left of `job` (the launcher, then every task of the cluster), so
    that a failing test leaves no process behind."""
    import signal

    if job.proc.poll() is None:
        job.proc.kill()
        job.proc.wait(10)
    for task in (("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)):
        for pid in task_pids(out, *task):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_parameter_server_killed_stops_the_job_clearly_and_a_relaunch_resumes(write_config,
                                                                              tmp_path):
    import signal

    out, backup = tmp_path / "out", tmp_path / "backup"
    args = ("--strategy", "parameter_server", "--loop", "trainer", "--model", "conv",
            "--epochs", "4", "--backup", str(backup))
    job = Background(write_config, out, PS, *args, "--pause_after", "1")
    wait_for_file(out / "paused-1")
    for pid in task_pids(out, "ps", 0):
        os.kill(pid, signal.SIGKILL)
    (out / "resume-1").touch()
    code, output = job.finish(timeout=120)
    assert code == 137, output[-3000:]
    assert "[tfdist] ps:0 exited with code 137; stopping the other tasks" in output
    assert (out / "epochs.log").read_text().split("\n")[:-1][-1].startswith("1 ")

    results, _ = launch(write_config, out, PS, *args)  # the same command again
    lines = (out / "epochs.log").read_text().split("\n")[:-1]
    assert [line.split()[0] for line in lines] == ["0", "1", "2", "3"], lines  # each once
    result = results["chief-0"]
    assert result["completed_steps"] == 24  # epochs 2 and 3 only
    assert result["step"] == 48  # the optimizer's count went on from the backup's
    losses = [float(line.split()[1]) for line in lines]
    assert losses[2] < losses[0]  # went on from epoch 1's weights, not from scratch
    assert list(backup.iterdir()) == []  # its own files removed; the directory stays


def test_compression_auto_decides_alike_on_every_worker(request):
    """Each worker times its own steps and all-reduces; averaged over the workers first,
    the numbers, and so the choices, are the same on both (a different choice would pair
    different collectives and hang)."""
    results, out, stdout = one_launch(request)
    decisions = [[{k: v for k, v in d.items() if k != "link_seconds"}  # each worker's clock
                  for d in results[task]["auto"]] for task in ("worker-0", "worker-1")]
    # a probe shortened to 6 steps (the length agreed from averaged timings), 6 more to
    # time a compressing choice
    assert decisions[0] == decisions[1] and decisions[0][0]["step"] == 6
    assert stdout.count("tfdist compression auto at step 6:") == 1  # the chief says it
    first, chosen = decisions[0][0]["prior"], decisions[0][0]["choice"]
    assert stdout.count("at step 0: link") == 1 and f"starting with {first}" in stdout
    assert (f"keeping {first}" if chosen == first else f"trying {chosen}") in stdout
    assert decisions[0][0]["measured"] > 0
    for a, b in zip(weights(out, "worker-0"), weights(out, "worker-1")):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("workers, shape", [(2, "diloco"), (4, "diloco"), (4, "plain"),
                                            (4, "plain, slow link")])
def test_warmup_steps_auto_judges_alike_on_every_worker(request, workers, shape):
    """`warmup_steps: auto`: auto's decisions and the judgements of going local (from
    numbers averaged over the workers; plain local SGD is judged before the first step
    too) are the same on every worker, the chief says each once, and the workers end with
    the same weights, whichever way it went."""
    fixture, registry = (("two_worker_runs", ONE_LAUNCH) if workers == 2
                         else ("four_worker_runs", FOUR_WORKER_CLEAN))
    results, out, stdout = one_launch(request, fixture, registry)
    assert len(results) == workers
    mine = results["worker-0"]
    for task in results:
        assert results[task]["auto"] == mine["auto"], task
        assert results[task]["going_local"] == mine["going_local"], task
        for a, b in zip(weights(out, "worker-0"), weights(out, task)):
            np.testing.assert_array_equal(a, b, err_msg=task)
    first = [j for j in mine["going_local"] if j["first_step"]]
    assert len(first) == shape.startswith("plain")
    if shape == "plain, slow link":
        assert first[0]["local"] and first[0]["ratio"] < 0.95
    if first and first[0]["local"]:  # local from step 0: auto never measured a step
        assert not mine["auto"] and mine["going_local"] == first
    else:
        assert mine["auto"][0]["step"] == 6 and len(mine["going_local"]) == len(first) + 1
        judged = mine["going_local"][-1]
        assert judged["synchronous"] == mine["auto"][-1]["choice"]
    for judged in mine["going_local"]:
        verdict = ("local steps begin" if judged["local"] else "staying synchronous")
        said = [line for line in stdout.splitlines()
                if f"tfdist local_sgd warmup_steps auto at step {judged['step']}:" in line]
        assert len(said) == 1 and verdict in said[0], said
    assert mine["history"]["loss"][-1] < mine["history"]["loss"][0]


@pytest.mark.parametrize("loop,exchange,workers", [("trainer", "powersgd+EF", 3),
                                                   ("fit", "DiLoCo 2", 2)])
# (top-k + EF under fit: the NaN cell above refuses a non-finite gradient the same way)
def test_mixed_float16_workers_skip_one_workers_overflow_alike(write_config, tmp_path, loop,
                                                                exchange, workers):
    """mixed_float16 under tfdist launch: the last worker's batch overflows at steps 2 and
    5, the others' do not. Every worker skips the same steps, its loss scale follows the
    same trajectory (Keras' schedule), its weights stay finite and equal the others', and
    every worker ends exactly where a run without those batches ends."""
    from test_mixed_precision import expected_scales

    cluster = f"cluster: {{worker: {workers}}}\nstrategy: multi_worker_mirrored\n"
    job = JOB.parent / "mixed_precision_job.py"
    args = ("--loop", loop, "--exchange", exchange, "--bad_worker", str(workers - 1))
    results, _ = launch(write_config, tmp_path / "bad", cluster, *args, job=job)
    clean, _ = launch(write_config, tmp_path / "clean", cluster, *args, "--clean", job=job)
    tasks = [f"worker-{i}" for i in range(workers)]
    assert sorted(results) == tasks and sorted(clean) == tasks
    first = results["worker-0"]
    assert first["scales"] == expected_scales((2, 5))
    assert first["steps"] == [1, 2, 2, 3, 4, 4, 5, 6]
    for task in tasks:
        result = results[task]
        assert result["scales"] == first["scales"] and result["steps"] == first["steps"]
        assert np.isfinite(result["checksums"]).all()
        assert result["checksums"][2] == result["checksums"][1]  # skipped: nothing changed
        assert result["checksums"][5] == result["checksums"][4]
        if exchange != "DiLoCo 2":  # synchronous: one model after every step
            assert result["checksums"] == first["checksums"]
        for mine, theirs in zip(result["weights"], clean[task]["weights"]):
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
        for mine, theirs in zip(result["weights"], first["weights"]):
            np.testing.assert_array_equal(mine, theirs)


def test_mixed_float16_under_parameter_servers_is_refused_in_one_line(write_config, tmp_path):
    """Dynamic loss scaling needs one verdict per step for every replica; parameter-server
    workers step asynchronously: the Trainer says so and what to use instead."""
    _, run = launch(write_config, tmp_path / "out", PS, "--strategy", "parameter_server",
                    "--policy", "mixed_float16", "--epochs", "1", expect_success=False)
    assert run.returncode != 0
    refused = [line for line in run.stdout.splitlines() + run.stderr.splitlines()
               if "dynamic loss scaling needs one verdict per step" in line]
    assert refused and "use mixed_bfloat16" in refused[0], run.stdout[-3000:] + run.stderr[-2000:]


@pytest.mark.parametrize("loop, training, signal", [
    ("trainer", (), "1,1,2"),
    ("fit", ("--local_sgd", "3", "--diloco", "2,1", "--islands", "2"), "1,1,2")],
    ids=["trainer", "fit-streaming-diloco-2-islands"])
def test_sigterm_to_one_of_four_workers_loses_no_step(request, write_config, tmp_path, loop,
                                                       training, signal):
    """worker:2 gets SIGTERM (as from Kubernetes) after step 1 of epoch 1. The next step's
    all-reduce tells every worker; all save after that same step and exit with 143;
    `--max-restarts 1` relaunches the job, which resumes there: every step of every
    epoch trains exactly once on every worker (each task's step log), and the job ends
    with the weights of a run never interrupted, identical on the 4 workers. Also with
    Streaming DiLoCo between 2 islands of 2 workers, the signal between two
    synchronisations (it lands in the second island; each replica's weights, the anchors
    and the outer momentum resume from the backup; the islands agree on the signal at
    their next synchronisation, carried by an exchange in flight). (Plain DiLoCo's outer
    step across a SIGTERM: test_preemption.py in one process, and a killed worker's
    outer momentum in test_killed_worker_resumes_diloco_with_its_outer_momentum: one
    4-worker cell fewer for CI's time.) A signal agreed on an epoch's last step lets the epoch end
    first: the backup is of the epoch's end, and the resumed run starts the next epoch (not
    an empty one whose logs a user's callback would miss: the islands cell, whose signal is
    agreed at its epoch's last synchronisation; plain fit's epoch end on 2 replicas in
    tests/unit/step/test_input_position.py, one 4-worker cell fewer). (`warmup_steps: auto`
    going local from the first step under mixed_float16 across a SIGTERM: test_go_local.py
    on 2 replicas, its decision in the backup.) (`fit` with the signal
    inside an epoch: test_fault_grid.py's compressed-step cell, the same checks.)"""
    out, backup = tmp_path / "out", tmp_path / "backup"
    common, = batched_flags(FOUR_WORKER_CLEAN, request.node)
    _, run = launch(write_config, out, FOUR_WORKERS, *common, "--backup", str(backup),
                          "--preempt", signal, launcher_args=("--max-restarts", "1"),
                          timeout=420)
    assert (out / "preempted").exists()
    assert "exited with code 143; restarting the whole job (1/1)" in run.stderr, run.stderr[-3000:]
    saved = [line for line in run.stdout.splitlines() if "tfdist: preempted: saved" in line]
    # islands decide their local steps alone and agree on a signal when they synchronise:
    # before the epoch's logs are read at the end of epoch 1 here (with overlapped
    # fragments: where the exchange that carried it is applied, the epoch's last step),
    # so the epoch ends first and the backup is of its end (a resumed run starts epoch 2)
    at = "at the end of epoch 1" if "--islands" in training else "after step 3 of epoch 1"
    assert len(saved) == 4 and all(at in line for line in saved), saved
    steps = [(e, b) for e in range(3) for b in range(4)]
    for index in range(4):
        log = (out / f"steps-worker-{index}.log").read_text().split("\n")[:-1]
        trained = [tuple(int(v) for v in line.split()[:3]) for line in log]
        assert [(e, b) for e, b, _ in trained] == steps, (index, trained)  # each once
        assert [s for _, _, s in trained] == list(range(1, 13))
    _, clean, _ = one_launch(request, "four_worker_runs", FOUR_WORKER_CLEAN)
    for task in [f"worker-{i}" for i in range(4)]:
        for mine, theirs in zip(weights(out, task), weights(clean, task)):
            np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)
    for task in ("worker-1", "worker-2", "worker-3"):
        for a, b in zip(weights(out, "worker-0"), weights(out, task)):
            np.testing.assert_array_equal(a, b)
