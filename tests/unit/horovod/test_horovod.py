"""`tfdist.horovod`: Horovod's API for Horovod scripts (issue 57)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tfdist.cluster.errors import ClusterError
from tfdist.errors import UnsupportedError
from tfdist.horovod.ranks import Ranks, ranks_of
from paths import JOBS


def tf_config(cluster, job, index):
    return {"cluster": cluster, "task": {"type": job, "index": index}}


#: horovodrun -np 5 -H a:3,b:2 as TF_CONFIG (the chief on a), each task's ranks by hand.
TWO_HOSTS = {"chief": ["a:2000"], "worker": ["a:2001", "a:2002", "b:2000", "b:2001"]}
BY_HAND = {("chief", 0): Ranks(0, 5, 0, 3, 0, 2), ("worker", 0): Ranks(1, 5, 1, 3, 0, 2),
           ("worker", 1): Ranks(2, 5, 2, 3, 0, 2), ("worker", 2): Ranks(3, 5, 0, 2, 1, 2),
           ("worker", 3): Ranks(4, 5, 1, 2, 1, 2)}


def test_the_ranks_of_every_task_are_horovods():
    for (job, index), expected in BY_HAND.items():
        assert ranks_of(tf_config(TWO_HOSTS, job, index)) == expected, (job, index)


@pytest.mark.parametrize("hosts", [["h"] * 4, ["a", "b", "a", "b", "c"], ["[::1]", "x", "[::1]"],
                                   ["solo"]])
def test_ranks_number_the_workers_and_each_host_once(hosts):
    """Whatever the hosts: ranks 0..size-1 once each, every host's local ranks 0..n-1 once,
    and (cross_rank, local_rank) names one worker."""
    cluster = {"worker": [f"{h}:{2000 + i}" for i, h in enumerate(hosts)]}
    ranks = [ranks_of(tf_config(cluster, "worker", i)) for i in range(len(hosts))]
    assert [r.rank for r in ranks] == list(range(len(hosts)))
    assert {r.size for r in ranks} == {len(hosts)}
    assert {r.cross_size for r in ranks} == {len(set(hosts))}
    for host in set(hosts):
        mine = [r for r, h in zip(ranks, hosts) if h == host]
        assert sorted(r.local_rank for r in mine) == list(range(hosts.count(host)))
        assert {r.local_size for r in mine} == {hosts.count(host)}
        assert len({r.cross_rank for r in mine}) == 1
    assert len({(r.cross_rank, r.local_rank) for r in ranks}) == len(hosts)


@pytest.mark.parametrize("job", ["ps", "evaluator"])
def test_a_task_that_trains_no_step_is_refused_in_one_line(job):
    cluster = {**TWO_HOSTS, job: ["c:1"]}
    with pytest.raises(ClusterError, match=f"one process per worker.*this task is {job}:0") as e:
        ranks_of(tf_config(cluster, job, 0))
    assert "\n" not in str(e.value)


def test_without_init_every_rank_is_refused_as_horovod_refuses(horovod):
    for ask in (horovod.size, horovod.rank, horovod.local_rank, horovod.local_size,
                horovod.cross_rank, horovod.cross_size):
        with pytest.raises(ValueError, match=r"Horovod has not been initialized; use hvd.init"):
            ask()
    assert not horovod.is_initialized()


def test_init_without_tf_config_is_a_job_of_one_and_reads_tf_config_when_set(horovod,
                                                                              monkeypatch):
    horovod.init()
    assert horovod.is_initialized() and (horovod.size(), horovod.rank()) == (1, 0)
    assert horovod.group() is None  # a job of one joins no group
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config(TWO_HOSTS, "worker", 2)))
    joined = []
    monkeypatch.setattr(horovod, "_join", lambda ranks: joined.append(ranks) or "group")
    monkeypatch.setitem(horovod._state, "group", None)
    horovod.init()
    assert joined == [Ranks(3, 5, 0, 2, 1, 2)] and horovod.group() == "group"
    assert (horovod.rank(), horovod.size(), horovod.local_rank(), horovod.local_size(),
            horovod.cross_rank(), horovod.cross_size()) == (3, 5, 0, 2, 1, 2)


@pytest.mark.parametrize("raw, says", [
    ("{not json", "TF_CONFIG"), ('{"cluster": {"worker": ["a:1"]}}', "task"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "index"),
])
def test_init_refuses_a_broken_tf_config_in_one_line(horovod, monkeypatch, raw, says):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(ClusterError, match=says) as e:
        horovod.init()
    assert "\n" not in str(e.value) and not horovod.is_initialized()


def test_init_refuses_an_mpi_communicator_and_process_sets(horovod):
    for options in ({"comm": object()}, {"process_sets": [[0, 1]]}):
        with pytest.raises(ValueError, match="no MPI communicator or process sets"):
            horovod.init(**options)


@pytest.mark.multiprocess
def test_the_collectives_on_three_workers_equal_numpy(tmp_path):
    """`tfdist launch -n 3` as horovodrun -np 3: each worker's ranks (one host), and
    allreduce (Average, Sum, Max, average=False, pre/postscale, int32, an IndexedSlices,
    inside a tf.function called thrice), allgather of unequal first dimensions, broadcast
    and broadcast_variables, on every worker."""
    sys.path.insert(0, str(JOBS))
    from horovod_collectives_job import contribution

    job = JOBS / "horovod_collectives_job.py"
    result = subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", "3", "--",
                             sys.executable, str(job), str(tmp_path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    size = 3
    each = [contribution(r) for r in range(size)]
    total = np.sum(each, axis=0)
    expected = {"average": total / size, "sum": total, "max": np.max(each, axis=0),
                "average_deprecated_false": total, "scaled": total,
                "int_sum": [sum(range(size)), size],
                "gather": np.concatenate([contribution(r, rows=r + 1) for r in range(size)]),
                "broadcast": each[-1], "variable": each[0],
                "sparse": np.stack([e[0] for e in each]) / size,
                "traced": [total * k for k in (1.0, 2.0, 3.0)]}
    for rank in range(size):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        assert got["ranks"] == [rank, size, rank, size, 0, 1]
        for key, want in expected.items():
            np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want, np.float64),
                                       rtol=1e-6, atol=1e-6, err_msg=f"rank {rank}: {key}")


@pytest.mark.multiprocess
def test_a_rank_that_raises_stops_the_job_with_its_rank_named(tmp_path):
    """Rank 1 of 3 raises after an all-reduce while the others wait in the next one: the
    launch fails within its grace, naming worker:1 and its error, none left running."""
    job = JOBS / "horovod_collectives_job.py"
    result = subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", "3",
                             "--grace-seconds", "5", "--", sys.executable, str(job),
                             str(tmp_path), "1"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "[worker:1] ValueError: rank 1 raises" in result.stdout + result.stderr
    assert "job failed, worker:1 first (exited with code 1)" in result.stderr, \
        result.stderr[-3000:]
    assert "worker:0 stopped" in result.stderr and "worker:2 stopped" in result.stderr
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("options, says", [
    ({"op": "Adasum"}, "no Adasum"), ({"op": "Mean"}, "op must be one of"),
    ({"op": "Sum", "average": True}, "not both")])
def test_allreduce_refuses_what_it_cannot_do_in_one_line(horovod, options, says):
    import tensorflow as tf

    horovod.init()
    from tfdist.horovod import ops

    with pytest.raises(ValueError, match=says):
        ops.allreduce(tf.constant([1.0]), **options)


@pytest.mark.parametrize("root", [-1, 1, True, "0", 0.0])
def test_a_root_rank_outside_the_job_is_refused(horovod, root):
    import tensorflow as tf

    horovod.init()
    from tfdist.horovod import ops

    with pytest.raises(ValueError, match="root_rank must be a rank of this job, 0 to 0"):
        ops.broadcast(tf.constant(1.0), root)


JOB = str(JOBS / "horovod_fit_job.py")


def run_horovod_job(tmp_path, workers, *flags, launcher=(), launched=()):
    """tests/e2e/jobs/horovod_fit_job.py under `tfdist launch -n workers` (and `launcher`'s
    options; `launched`: flags of the launched job only), then in one process as that many
    workers; {mode: ([each rank's npz], the single process's)}, the launch's result."""
    run = subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", str(workers),
                          *launcher, "--", sys.executable, JOB, str(tmp_path), *flags,
                          *launched], capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    single = subprocess.run([sys.executable, JOB, str(tmp_path), "--single", str(workers),
                             *flags], capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    modes = dict(zip(flags[::2], flags[1::2])).get("--modes", "fit").split(",")
    return {mode: ([np.load(tmp_path / f"{mode}-{r}.npz") for r in range(workers)],
                   np.load(tmp_path / f"{mode}-single.npz")) for mode in modes}, run


def assert_alike_and_as_one_process(ranks, reference, tolerance, same_loss=True,
                                    learns=True):
    """Every worker's weights bit for bit alike (and its loss, if averaged), equal to the
    single process's to `tolerance`; the loss falls (if `learns`: a resumed run's first
    epoch is a part of one)."""
    names = [n for n in reference.files if n != "loss"]
    for rank, weights in enumerate(ranks):
        for name in names:
            np.testing.assert_array_equal(weights[name], ranks[0][name], err_msg=f"{rank} {name}")
        if same_loss:
            np.testing.assert_array_equal(weights["loss"], ranks[0]["loss"])
        assert not learns or weights["loss"][-1] < weights["loss"][0]
    for name in names:
        np.testing.assert_allclose(ranks[0][name], reference[name], err_msg=name, **tolerance)


@pytest.mark.multiprocess
def test_a_horovod_keras_script_trains_as_one_process_on_the_workers_batches(tmp_path):
    """Horovod's Keras idiom with only the import changed (tests/e2e/jobs/horovod_fit_job.py),
    on 4 workers: every worker ends with the same weights and the same averaged loss, and
    they equal one process trained on the batches the workers' shards make together; under
    mixed_float16 too (to float16's rounding), with the same loss scale and update count
    on every worker and in the one process; and DiLoCo of 2 fragments through
    hvd.DistributedOptimizer under mixed_float16 ends where tfdist's own DiLoCo does on 4
    replicas."""
    results, _ = run_horovod_job(tmp_path, 4, "--modes", "fit,mixed,diloco+mixed")
    assert_alike_and_as_one_process(*results["fit"], dict(rtol=1e-5, atol=1e-6))
    ranks, reference = results["mixed"]
    assert_alike_and_as_one_process(ranks, reference, dict(rtol=1e-2, atol=2e-3))
    scale, updates = (f"arr_{len(reference.files) - 3}", f"arr_{len(reference.files) - 2}")
    assert ranks[0][scale] == reference[scale] == 256
    assert ranks[0][updates] == reference[updates] == 8
    ranks, native = results["diloco+mixed"]
    assert_alike_and_as_one_process(ranks, native, dict(rtol=1e-3, atol=1e-4))
    scale, updates = (f"arr_{len(native.files) - 3}", f"arr_{len(native.files) - 2}")
    assert ranks[0][scale] == native[scale] == 256 and ranks[0][updates] == 8


@pytest.mark.multiprocess
def test_backward_passes_a_tape_fp16_and_a_nan_on_one_worker_end_as_one_process(tmp_path):
    """On 2 workers: fit with backward_passes_per_step=2 (Horovod sums the two passes'
    averaged gradients: one process on both passes' batches at twice the rate), and a
    tf.function loop with hvd.DistributedGradientTape and broadcast_variables after the
    first batch, each equal to one process on the workers' batches together; fit with
    Compression.fp16 ends bit for bit where tfdist's own fp16 exchange does (on 2
    replicas the float16 sum has one order; on more, the two collectives may add in
    different orders, a float16 rounding apart), away from the float32 run; a NaN in one
    worker's batch refuses that step on both (Horovod's exchange carries the verdict), and
    each is left with the weights of one process after the step before it. A model saved
    after an epoch and loaded on both (with keras.models.load_model on one, hvd.load_model on
    the other) trains on as one process that never stopped, momentum and all; and a model
    with an Embedding, a Dense over a sequence, two inputs and outputs and a frozen layer
    trains as one process too; with tfdist's top-k and error feedback through
    hvd.DistributedOptimizer(compression=...), it ends bit for bit where tfdist's own
    top-k does on 2 replicas, away from the uncompressed run. Local SGD (a local_sgd:
    section: a warm-up, momentum averaged) and DiLoCo (2 fragments) through the same
    argument end bit for bit where tfdist's own ModelAverager does on 2 replicas, each
    worker training apart between synchronisations (DiLoCo away from the synchronous run)."""
    results, _ = run_horovod_job(tmp_path, 2, "--modes",
                                 "fit,tape,fp16,nan,reload,families,topk,local_sgd,diloco",
                                 "--passes", "2")
    tolerance = dict(rtol=1e-5, atol=1e-6)
    assert_alike_and_as_one_process(*results["fit"], tolerance)
    assert_alike_and_as_one_process(*results["tape"], tolerance, same_loss=False)
    fit_weights = results["fit"][0][0]
    tape_weights = results["tape"][0][0]  # two updates a pass apart: not the same run
    assert not np.allclose(fit_weights["arr_0"], tape_weights["arr_0"])
    ranks, native = results["fp16"]
    assert_alike_and_as_one_process(ranks, native, dict(rtol=0, atol=0))
    float32 = tape_weights  # one update a step, as fp16's, in float32 (the tape loop)
    assert not np.allclose(ranks[0]["arr_0"], float32["arr_0"], rtol=0, atol=1e-5)
    ranks, before = results["nan"]  # a NaN in rank 1's batch of step 1 (its second)
    for rank in range(2):
        said = (tmp_path / f"refused-{rank}.txt").read_text()
        assert "the step was refused on every replica and worker" in said, said
    assert_alike_and_as_one_process(ranks, before, dict(rtol=1e-5, atol=1e-6), learns=False)
    assert ranks[0][f"arr_{len(before.files) - 2}"] == 1  # one update, the first step's
    for mode in ("reload", "families"):
        ranks, reference = results[mode]
        assert_alike_and_as_one_process(ranks, reference, tolerance)
        assert ranks[0][f"arr_{len(reference.files) - 2}"] == 8  # 2 epochs of 4 updates
    for mode in ("topk", "local_sgd", "diloco"):
        ranks, native = results[mode]
        assert_alike_and_as_one_process(ranks, native, dict(rtol=0, atol=0))
        assert ranks[0][f"arr_{len(native.files) - 2}"] == 8
    for mode in ("topk", "diloco"):
        assert not np.allclose(results[mode][0][0]["arr_0"], results["families"][0][0]["arr_0"],
                               atol=1e-5), mode


@pytest.mark.multiprocess
def test_a_sigterm_to_one_rank_of_a_horovod_script_loses_no_step(tmp_path):
    """A Horovod Keras script that adds tfdist's BackupAndRestore, on 3 workers: rank 2
    gets SIGTERM after step 1 of epoch 0; every rank saves after the same step (agreed
    through the Horovod exchange) and exits 143, `--max-restarts` relaunches the job,
    which resumes there: each rank trains every step once, and the job ends with one
    process's weights on the workers' batches, alike on every rank. The same with local
    SGD through hvd.DistributedOptimizer, whose save falls on its first local step: each
    worker's own weights and momenta are in the backup and given back to it, and the job
    ends where tfdist's own local SGD ends uninterrupted on 3 replicas."""
    backup = tmp_path / "backup"
    results, run = run_horovod_job(tmp_path, 3, "--modes", "fit,local_sgd",
                                   launcher=("--max-restarts", "2"),
                                   launched=("--backup", str(backup), "--preempt", "0,1,2"))
    for restart in (1, 2):
        assert f"exited with code 143; restarting the whole job ({restart}/2)" in run.stderr, \
            run.stderr[-3000:]
    saved = [line for line in run.stdout.splitlines() if "tfdist: preempted: saved" in line]
    assert len(saved) == 6 and all("after step 3 of epoch 0" in line for line in saved), saved
    for mode in ("fit", "local_sgd"):
        assert (tmp_path / f"preempted-{mode}").exists()
        for rank in range(3):
            log = (tmp_path / f"steps-{mode}-{rank}.log").read_text().split("\n")[:-1]
            trained = [tuple(int(v) for v in line.split()) for line in log]
            assert trained == [(e, b, e * 4 + b + 1) for e in range(2) for b in range(4)], \
                (mode, trained)
        ranks, reference = results[mode]
        assert_alike_and_as_one_process(ranks, reference, dict(rtol=1e-5, atol=1e-6),
                                        same_loss=False, learns=False)


def test_fp16_compression_sends_floats_as_float16_and_gives_them_back_in_their_dtype():
    """Horovod's Compression.fp16: floating tensors cross as float16 (NumPy's rounding),
    anything else as it is; Compression.none changes nothing."""
    import tensorflow as tf

    from tfdist.horovod.gradients import Compression

    values = np.array([0.1, 1.0 / 3.0, 65504.0, -2.5e-8], np.float32)
    sent, ctx = Compression.fp16.compress(tf.constant(values))
    assert sent.dtype == tf.float16
    np.testing.assert_array_equal(sent.numpy(), values.astype(np.float16))
    back = Compression.fp16.decompress(sent, ctx)
    assert back.dtype == tf.float32
    np.testing.assert_array_equal(back.numpy(), values.astype(np.float16).astype(np.float32))
    ints, ctx = Compression.fp16.compress(tf.constant([1, 2]))
    assert ints.dtype == tf.int32 and Compression.fp16.decompress(ints, ctx) is ints
    same, ctx = Compression.none.compress(tf.constant(values))
    assert Compression.none.decompress(same, ctx) is same


# --- in one process: the tape, the learning-rate callbacks, what is refused ---------------

def _rates_seen(callback, epochs=3, steps=4, rate=0.4):
    """The learning rate each batch of a fit trained with, under `callback`."""
    import keras

    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(self.model.optimizer.learning_rate.numpy()))

    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    net.compile(keras.optimizers.SGD(rate), "mse")
    x = np.ones((steps * 2, 2), np.float32)
    net.fit(x, x[:, :1], batch_size=2, epochs=epochs, verbose=0, shuffle=False,
            callbacks=[callback, Record()])
    return np.asarray(seen).reshape(epochs, steps)


def test_the_warmup_callback_ramps_the_rate_as_horovods_formula_says(horovod, monkeypatch,
                                                                     capsys):
    """Horovod's warm-up, from initial_lr/size at the first batch to initial_lr at the
    last batch of warmup_epochs (Goyal et al.'s ramp, a little every batch), then left
    alone; computed here by hand for a job of 4."""
    horovod.init()
    monkeypatch.setattr(horovod, "size", lambda: 4)
    rates = _rates_seen(horovod_keras().LearningRateWarmupCallback(0.4, warmup_epochs=2,
                                                                   verbose=1))
    size, initial, warmup, steps = 4, 0.4, 2, 4
    expected = [[initial / size * ((e + (b + 1) / steps) * (size - 1) / warmup + 1)
                 for b in range(steps)] for e in range(warmup)]
    np.testing.assert_allclose(rates[:2], expected, rtol=1e-6)
    np.testing.assert_allclose(rates[1, -1], initial, rtol=1e-6)
    np.testing.assert_allclose(rates[2], initial, rtol=1e-6)  # after the ramp: as it ended
    assert "Epoch 2: finished gradual learning rate warmup to 0.4." in capsys.readouterr().out


def test_the_schedule_callback_sets_a_rate_per_epoch_or_per_batch(horovod):
    horovod.init()
    hvd = horovod_keras()
    steps = _rates_seen(hvd.LearningRateScheduleCallback(0.4, 0.5, start_epoch=1, end_epoch=2))
    np.testing.assert_allclose(steps, [[0.4] * 4, [0.2] * 4, [0.2] * 4], rtol=1e-6)
    smooth = _rates_seen(hvd.LearningRateScheduleCallback(1.0, lambda epoch: 0.1 * epoch,
                                                          staircase=False))
    expected = [[0.1 * (e + b / 4) for b in range(4)] for e in range(3)]
    np.testing.assert_allclose(smooth, expected, rtol=1e-5, atol=1e-7)
    # fractional epochs, as Horovod's ImageNet example passes them: from the first epoch
    # at or past 0.5 to the last one before 1.5 (the fit's rate is 0.4)
    fractions = _rates_seen(hvd.LearningRateScheduleCallback(0.3, lambda epoch: epoch + 1,
                                                             start_epoch=0.5, end_epoch=1.5))
    np.testing.assert_allclose(fractions, [[0.4] * 4, [0.6] * 4, [0.6] * 4], rtol=1e-6)


def horovod_keras():
    import tfdist.horovod.tensorflow.keras as hvd

    return hvd


@pytest.mark.parametrize("make, says", [
    (lambda hvd: hvd.LearningRateWarmupCallback(0.1, warmup_epochs=0), "warmup_epochs"),
    (lambda hvd: hvd.LearningRateWarmupCallback(float("nan")), "initial_lr"),
    (lambda hvd: hvd.LearningRateScheduleCallback(0.1, -1.0), "multiplier"),
    (lambda hvd: hvd.LearningRateScheduleCallback(0.1, 1.0, start_epoch=-1), "start_epoch"),
    (lambda hvd: hvd.LearningRateScheduleCallback(0.1, 1.0, end_epoch="3"), "end_epoch"),
    (lambda hvd: hvd.LearningRateScheduleCallback(0.1, 1.0, steps_per_epoch=0),
     "steps_per_epoch"),
    (lambda hvd: hvd.LearningRateScheduleCallback(0.1, 1.0, staircase="yes"), "staircase"),
])
def test_the_learning_rate_callbacks_refuse_bad_arguments_in_one_line(horovod, make, says):
    horovod.init()
    with pytest.raises(ValueError, match=says) as e:
        make(horovod_keras())
    assert "\n" not in str(e.value)


def test_a_learning_rate_schedule_is_not_overwritten_by_a_callback(horovod):
    import keras

    horovod.init()
    net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    net.compile(keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)),
                "mse")
    with pytest.raises(ValueError, match="is a schedule .ExponentialDecay"):
        net.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0,
                callbacks=[horovod_keras().LearningRateWarmupCallback(0.1)])


def test_a_distributed_tape_in_a_job_of_one_is_the_tape_itself(horovod):
    """Nested sources, a None gradient and an embedding's IndexedSlices come back as the
    tape gives them; everything else is the tape's (watched_variables)."""
    import keras
    import tensorflow as tf

    horovod.init()
    hvd = horovod_keras()
    embedding = keras.layers.Embedding(5, 3)
    embedding.build((None,))
    unused = tf.Variable(1.0)
    w = tf.Variable([[1.0], [2.0], [3.0]])
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(embedding(tf.constant([1, 3])) @ w)
    plain = tape.gradient(loss, {"w": w, "parts": [embedding.embeddings, unused]})
    got = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16).gradient(
        loss, {"w": w, "parts": [embedding.embeddings, unused]})
    assert got["parts"][1] is None
    assert isinstance(got["parts"][0], tf.IndexedSlices)
    np.testing.assert_array_equal(tf.convert_to_tensor(got["parts"][0]),
                                  tf.convert_to_tensor(plain["parts"][0]))
    np.testing.assert_array_equal(got["w"], plain["w"])
    assert len(hvd.DistributedGradientTape(tape).watched_variables()) == 2
    with pytest.raises(TypeError, match="wraps a tf.GradientTape"):
        hvd.DistributedGradientTape(object())


@pytest.mark.parametrize("options, says", [
    ({"backward_passes_per_step": 0}, "backward_passes_per_step must be a whole number"),
    ({"backward_passes_per_step": 1.5}, "backward_passes_per_step must be a whole number"),
    ({"backward_passes_per_step": True}, "backward_passes_per_step must be a whole number"),
    ({"groups": 2}, "does not take num_groups, groups"),
    ({"gradient_predivide_factor": 2.0}, "gradient_predivide_factor"),
    ({"compression": "fp17"}, "compression must be hvd.Compression.none, hvd.Compression."
                              "fp16 or one of tfdist's .* did you mean 'fp16'"),
    ({"compression": {"name": "topk", "ratio": 0}}, "ratio: expected a value > 0"),
    ({"compression": "auto"}, "under hvd.DistributedOptimizer name a compressor"),
    ({"compression": "diloco"}, "diloco needs its period: compression="),
    ({"compression": {"name": "local_sgd", "period": 0}}, "period: expected a value >= 1"),
    ({"compression": {"name": "local_sgd", "period": 4, "perod": 2}}, "did you mean 'period'"),
    ({"compression": {"name": "diloco", "period": 4, "islands": 2}},
     "islands and auto's measurements need a tfdist strategy"),
    ({"compression": {"name": "local_sgd", "period": 4, "warmup_steps": "auto"}},
     "Received: {'warmup_steps': 'auto'}"),
    ({"compression": {"name": "diloco", "period": 4, "compression": "auto"}},
     "compression.name: auto chooses a gradient compression"),
    ({"compression": {"name": "local_sgd", "period": 4}, "op": "Sum"},
     "local SGD and DiLoCo average the workers' models: they take op=hvd.Average"),
    ({"compression": {"name": "local_sgd", "period": 4}, "backward_passes_per_step": 2},
     "and no backward_passes_per_step"),
    ({"compression": "topk", "op": "Max"}, "tfdist's compressors sum or average"),
    ({"op": "Adasum"}, "no Adasum"),
])
def test_the_distributed_optimizer_refuses_what_it_cannot_do_in_one_line(horovod, options,
                                                                         says):
    import keras

    horovod.init()
    with pytest.raises(ValueError, match=says) as e:
        horovod_keras().DistributedOptimizer(keras.optimizers.SGD(0.1), **options)
    assert "\n" not in str(e.value)


def test_local_sgd_through_horovod_is_refused_under_a_strategy_of_several_replicas(
        horovod, tensorflows_mirrored):
    """Each process is one replica of Horovod's workers: a MirroredStrategy's replicas
    would train apart and never be averaged; refused when the optimizer builds."""
    import keras

    import tfdist

    horovod.init()
    strategy = tensorflows_mirrored()
    with strategy.scope():
        net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        optimizer = horovod_keras().DistributedOptimizer(
            keras.optimizers.SGD(0.1), compression=tfdist.local_sgd.ModelAverager(2))
        with pytest.raises(UnsupportedError, match="outside any strategy scope"):
            optimizer.build(net.trainable_variables)


def test_diloco_through_horovod_without_the_broadcast_callback_says_what_to_add(horovod):
    """DiLoCo copies its anchors from the weights before the first local step; fit
    outside a strategy builds the optimizer inside that step, so without the callback
    (which builds it first) the anchors would be zeros: refused, naming the callback."""
    import keras

    import tfdist

    horovod.init()
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    net.compile(horovod_keras().DistributedOptimizer(
        keras.optimizers.SGD(0.1), compression=tfdist.local_sgd.DiLoCo(2)), "mse")
    x = np.ones((8, 3), "float32")
    with pytest.raises(UnsupportedError, match="BroadcastGlobalVariablesCallback"):
        net.fit(x, x[:, :1], batch_size=4, verbose=0,
                callbacks=[tfdist.callbacks.TrainingHooks()])


def test_backward_passes_and_gradient_accumulation_steps_together_are_refused(horovod):
    import keras

    horovod.init()
    with pytest.raises(ValueError, match="not both"):
        horovod_keras().DistributedOptimizer(
            keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), backward_passes_per_step=2)


@pytest.mark.parametrize("name", ["run", "TensorFlowKerasState", "KerasState",
                                  "CommitStateCallback", "UpdateEpochStateCallback"])
def test_elastic_refuses_in_one_line_saying_what_to_use(name):
    hvd = horovod_keras()
    with pytest.raises(NotImplementedError, match="--min-workers K.*BackupAndRestore") as e:
        getattr(hvd.elastic, name)(lambda state: None)
    assert "\n" not in str(e.value) and f"hvd.elastic.{name}" in str(e.value)


def test_horovod_keras_and_horovod_tensorflow_keras_are_one_api():
    import tfdist.horovod.keras as standalone

    hvd = horovod_keras()
    assert standalone.DistributedOptimizer is hvd.DistributedOptimizer
    assert set(standalone.__all__) == set(hvd.__all__)
    assert all(hasattr(hvd, name) for name in hvd.__all__)


def test_the_broadcast_callback_beside_tfdists_training_hooks_trains_the_same(horovod):
    """Both drive fit's steps (backward_passes_per_step needs a driver); listed together
    they train as the broadcast callback alone, each update counted once."""
    import keras

    import tfdist

    horovod.init()
    hvd = horovod_keras()
    x = np.random.default_rng(0).normal(size=(16, 3))
    ends = []
    for extra in ([], [tfdist.callbacks.TrainingHooks()]):
        keras.utils.set_random_seed(0)
        net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        net.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                             backward_passes_per_step=2), "mse")
        net.fit(x, x.sum(1, keepdims=True), batch_size=4, epochs=2, verbose=0,
                callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), *extra])
        assert int(net.optimizer.iterations.numpy()) == 4  # 8 batches, 2 a pass
        ends.append(net.get_weights())
    for alone, together in zip(*ends):
        np.testing.assert_array_equal(alone, together)

