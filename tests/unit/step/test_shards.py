"""The shards of sharded training state (tfdist.step.shards): the flat layout against
NumPy, and the reduce-scatter and all-gather against NumPy's sums, on every replica — on
2 logical CPUs (the strategy's collectives) and on worker processes (a collective group of
tfdist's own: all-to-all and a local sum on a CPU).
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from paths import JOBS
from tfdist.step import shards as sharding, wire

sys.path.insert(0, str(JOBS))
from shards_job import SHAPES, exchanged, shard_values  # noqa: E402

pytestmark = pytest.mark.usefixtures("two_cpus")


def summed(replicas, step, layout):
    """NumPy: the flat padded float32 sum over `replicas` of their `shard_values`."""
    total = sum(np.concatenate([v.ravel() for v in shard_values(r, step)])
                for r in range(replicas))
    return np.concatenate([total, np.zeros(layout.padding, np.float32)])


# --- the layout ----------------------------------------------------------------------------

@pytest.mark.parametrize("replicas, shard, padding", [(1, 31, 0), (2, 16, 1), (4, 8, 1),
                                                      (5, 7, 4), (31, 1, 0), (40, 1, 9)])
def test_a_layout_pads_to_whole_shards_and_gives_back_every_tensor(replicas, shard, padding):
    layout = sharding.Layout(SHAPES, replicas)
    assert (layout.shard, layout.padding, layout.padded) == (shard, padding, shard * replicas)
    values = shard_values(3, 1)
    flat = layout.flatten([tf.constant(v) for v in values]).numpy()
    expected = np.concatenate([v.ravel() for v in values] + [np.zeros(padding, np.float32)])
    np.testing.assert_array_equal(flat, expected)
    for got, want in zip(layout.unflatten(tf.constant(flat)), values):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)
    pieces = [layout.shard_of(tf.constant(flat), r).numpy() for r in range(replicas)]
    np.testing.assert_array_equal(np.concatenate(pieces), expected)


def test_a_layout_casts_to_float32_and_back_to_shapes_only():
    layout = sharding.Layout([(2,), (3,)], 2)
    flat = layout.flatten([tf.constant([1, 2], tf.int32), tf.constant([0.5, 1.5, 2.5],
                                                                        tf.float16)])
    assert flat.dtype == tf.float32
    np.testing.assert_array_equal(flat.numpy(), [1, 2, 0.5, 1.5, 2.5, 0])


@pytest.mark.parametrize("shapes, replicas", [([(None, 3)], 2), ([(2,)], 0)])
def test_a_layout_refuses_an_unknown_shape_or_no_replica(shapes, replicas):
    with pytest.raises(ValueError, match="known shapes and at least one replica"):
        sharding.Layout(shapes, replicas)


def test_a_layout_of_nothing_is_empty():
    layout = sharding.Layout([], 3)
    assert (layout.shard, layout.padded, layout.padding) == (0, 0, 0)


# --- on 2 logical CPUs ---------------------------------------------------------------------

def assert_exchanged(per_step, replicas, layout):
    """Every replica: the whole sum, and its own rank's shard of it; the ranks one each."""
    for step, results in enumerate(per_step):
        want = summed(replicas, step, layout)
        assert sorted(r["rank"] for r in results) == list(range(replicas))
        for result in results:
            np.testing.assert_allclose(result["whole"], want, rtol=1e-6)
            np.testing.assert_allclose(
                result["shard"], want[result["rank"] * layout.shard:][:layout.shard], rtol=1e-6)


def test_two_replicas_reduce_scatter_and_gather_what_numpy_sums(strategies):
    strategy = strategies("mirrored")
    steps, noted, shards, layout = exchanged(strategy)
    assert isinstance(shards, sharding.LocalShards)
    assert_exchanged(steps, 2, layout)
    assert [r["rank"] for r in steps[0]] == [0, 1]  # one process: shard i is replica i's
    assert (noted["scattered"], noted["gathered"]) == (4 * layout.padded, 4 * layout.shard)


def test_a_replica_alone_keeps_its_tensors_and_notes_nothing():
    steps, noted, shards, layout = exchanged(tf.distribute.get_strategy())
    assert_exchanged(steps, 1, layout)
    assert not any(noted.values())


# --- worker processes ----------------------------------------------------------------------

@pytest.mark.multiprocess
def test_five_workers_reduce_scatter_in_a_group_of_their_own_and_gather_back(
        write_config, tmp_path):
    workers = 5
    config = write_config(f"cluster: {{worker: {workers}}}\nstrategy: multi_worker_mirrored\n")
    (tmp_path / "tmp").mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds", "5", "--",
         sys.executable, str(JOBS / "shards_job.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "TMPDIR": str(tmp_path / "tmp")})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    results = [json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in range(workers)]
    layout = sharding.Layout(SHAPES, workers)
    assert layout.padding == 4
    assert {r["shards"] for r in results} == {"GroupShards"}
    per_step = [[{k: np.array(v) if k != "rank" else v for k, v in r["steps"][s].items()}
                 for r in results] for s in (0, 1)]
    assert_exchanged(per_step, workers, layout)
    for r in results:
        assert (r["noted"]["scattered"], r["noted"]["gathered"]) == (
            4 * layout.padded, 4 * layout.shard)


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_comm_stats_count_a_reduce_scatter_and_its_gather_as_one_all_reduce(workers):
    from tfdist.keras.callbacks.comm_stats import _figures

    layout = sharding.Layout(SHAPES, workers)
    none = dict.fromkeys(wire.KINDS, 0)
    sharded = _figures(dict(none, scattered=4 * layout.padded, gathered=4 * layout.shard),
                       workers)
    reduced = _figures(dict(none, reduced=4 * layout.padded), workers)
    assert sharded["comm_bytes_per_worker"] == pytest.approx(reduced["comm_bytes_per_worker"])
    assert sharded["comm_bytes_per_worker"] == pytest.approx(
        2 * (workers - 1) / workers * 4 * layout.padded)
