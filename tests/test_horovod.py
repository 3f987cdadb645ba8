"""`tfdist.horovod`: Horovod's API for Horovod scripts (issue 57; so far the ranks)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tfdist.cluster.errors import ClusterError
from tfdist.horovod import basics
from tfdist.horovod.ranks import Ranks, ranks_of


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


@pytest.fixture
def horovod(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("CLUSTER_SPEC", raising=False)
    basics.shutdown()
    yield basics
    basics.shutdown()


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
    sys.path.insert(0, str(pathlib.Path(__file__).parent / "jobs"))
    from horovod_collectives_job import contribution

    job = pathlib.Path(__file__).parent / "jobs" / "horovod_collectives_job.py"
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


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers, fp16", [(4, False)], ids=["4-none"])
def test_a_horovod_keras_script_trains_as_one_process_on_the_workers_batches(tmp_path,
                                                                             workers, fp16):
    """Horovod's Keras idiom with only the import changed (tests/jobs/horovod_fit_job.py):
    every worker ends with the same weights and the same averaged loss, and they equal one
    process trained on the batches the workers' shards make together (fp16 on the wire: to
    float16's precision)."""
    job = str(pathlib.Path(__file__).parent / "jobs" / "horovod_fit_job.py")
    flags = ["--fp16"] if fp16 else []
    run = subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", str(workers), "--",
                          sys.executable, job, str(tmp_path), *flags], capture_output=True,
                         text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    single = subprocess.run([sys.executable, job, str(tmp_path), "--single", str(workers)],
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    reference = np.load(tmp_path / "single.npz")
    ranks = [np.load(tmp_path / f"{r}.npz") for r in range(workers)]
    names = [n for n in reference.files]
    for rank, weights in enumerate(ranks):
        for name in names:  # every worker alike, bit for bit
            np.testing.assert_array_equal(weights[name], ranks[0][name], err_msg=f"{rank} {name}")
        np.testing.assert_array_equal(weights["loss"], ranks[0]["loss"])
    tolerance = dict(rtol=2e-3, atol=2e-3) if fp16 else dict(rtol=1e-5, atol=1e-6)
    for name in names:
        np.testing.assert_allclose(ranks[0][name], reference[name], err_msg=name, **tolerance)
    assert ranks[0]["loss"][-1] < ranks[0]["loss"][0]  # it learns


def test_fp16_compression_sends_floats_as_float16_and_gives_them_back_in_their_dtype():
    """Horovod's Compression.fp16: floating tensors cross as float16 (NumPy's rounding),
    anything else as it is; Compression.none changes nothing."""
    import tensorflow as tf

    from tfdist.horovod.optimizer import Compression

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
