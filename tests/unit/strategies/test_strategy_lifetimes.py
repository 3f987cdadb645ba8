"""A new strategy per run in one process (the Keras multi-GPU guide's pattern).

TF's mirrored strategies all number their collectives from the same keys, so a second
strategy's first all-reduce of another shape fails ("Shape mismatch in the collective
instance 100") and aborts the process's collectives. tfdist's subclasses take a fresh
key range each (and its MultiWorkerMirroredStrategy waits for every worker to have
built it). The canary runs in its own process: the failure it expects would abort
this one's collectives. Run as a script, this file is that process, or a worker of
the 2-worker job (`tfdist launch`).
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

COMPRESSORS = ["none", "fp16", "bf16", "int8", "qsgd", "sign", "topk", "randomk", "powersgd"]
OPTIONS = {"topk": {"ratio": 0.2, "error_feedback": True},
           "randomk": {"ratio": 0.2, "error_feedback": True},
           "sign": {"error_feedback": True}, "powersgd": {"rank": 2}}
WIDTHS = (4, 16)  # two models of different sizes: 475 and 1,891 weights
SHAPE_MISMATCH = "Shape mismatch in the collective instance"


def make_model(width):
    """Conv(width) + Dense: no dropout, no batch norm, so replicas match one device."""
    import keras
    from models import CLASSES, IMAGE

    keras.utils.set_random_seed(width)
    return keras.Sequential([keras.Input((IMAGE, IMAGE, 1)),
                             keras.layers.Conv2D(width, 3, activation="relu"),
                             keras.layers.Flatten(), keras.layers.Dense(CLASSES)])


def train(strategy, width, compression, epochs=2):
    """Builds, compiles and fits one model under `strategy`; returns (weights, losses).

    Args:
        compression: a compressor name for `tfdist.keras.DistributedOptimizer`, or None
            for a plain Keras SGD (Keras' own all-reduce).
    """
    import keras
    from models import dataset, loss

    import tfdist

    with strategy.scope():
        model = make_model(width)
        optimizer = keras.optimizers.SGD(0.05)
        if compression is not None:
            optimizer = tfdist.keras.DistributedOptimizer(
                optimizer, compression, min_size=64, **OPTIONS.get(compression, {}))
        model.compile(optimizer, loss())
    history = model.fit(dataset(128, batch=32), epochs=epochs, verbose=0).history
    return [w.numpy() for w in model.weights], history["loss"]


# --- in this process: 2 logical CPUs, a new "mirrored" per run ---------------------

@pytest.fixture(scope="module")
def single_device(two_cpus, jobs_path):
    """single_device(width) -> (weights, losses) of plain single-device `fit`."""
    import tensorflow as tf

    cache = {}

    def get(width):
        if width not in cache:
            cache[width] = train(tf.distribute.get_strategy(), width, None)
        return cache[width]

    return get


@pytest.mark.parametrize("compression", [None, *COMPRESSORS])
def test_a_new_strategy_per_run_trains_every_model(single_device, compression):
    """small, large, small again: each run on its own new strategy learns, the repeated
    run reproduces the first exactly, and without compression every run equals
    single-device training (an independent computation)."""
    import tfdist

    runs = [train(tfdist.get_strategy("mirrored"), width, compression)
            for width in (*WIDTHS, WIDTHS[0])]
    for (_, losses), width in zip(runs, (*WIDTHS, WIDTHS[0])):
        assert losses[-1] < 0.8 * losses[0], (width, losses)
    for a, b in zip(runs[0][0], runs[2][0]):
        np.testing.assert_array_equal(a, b)
    if compression in (None, "none"):
        for (weights, losses), width in zip(runs, WIDTHS):
            reference, reference_losses = single_device(width)
            for w, r in zip(weights, reference):
                np.testing.assert_allclose(w, r, atol=2e-6)
            np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)


def test_each_instance_has_its_own_keys_and_tf_is_untouched(two_cpus):
    import tensorflow as tf

    import tfdist
    from tfdist.strategies import MirroredStrategy

    strategies = [tfdist.get_strategy("mirrored") for _ in range(3)]
    assert all(type(s) is MirroredStrategy for s in strategies)
    assert all(isinstance(s, tf.distribute.MirroredStrategy) for s in strategies)
    bases = [s.extended._collective_key_base for s in strategies]
    assert len(set(bases)) == 3 and min(bases) > 0, bases
    assert tf.distribute.MirroredStrategy._collective_key_base == 0


def test_the_broadcast_seam_and_which_optimizer_slots_skip_it(two_cpus):
    """TF still broadcasts initial values in the method tfdist's MWMS replaces per
    instance; Keras' own optimizers' slots (zeros, constants) skip the broadcast, a
    subclass of yours (slots maybe random) keeps it; no region outlives its block."""
    import contextlib
    import inspect

    import keras

    import tfdist
    from tfdist.seam.routed_step import slots_context
    from tfdist.strategies import initial_values

    for cls in (initial_values.BROADCASTING, initial_values.LOCAL):
        assert initial_values.SEAM in vars(cls), (cls, "the upstream seam moved")
    assert "broadcast_send" in inspect.getsource(
        getattr(initial_values.BROADCASTING, initial_values.SEAM))

    class Yours(keras.optimizers.Adam):
        pass

    routed = [tfdist.keras.DistributedOptimizer(o) for o in (keras.optimizers.Adam(), Yours())]
    assert not initial_values.in_region()
    with slots_context(routed[0]):
        assert initial_values.in_region()
    assert isinstance(slots_context(routed[1]), contextlib.nullcontext)
    assert not initial_values.in_region()


def test_a_tensorflow_without_the_seam_is_refused_with_the_install_line(monkeypatch):
    from tfdist.strategies import initial_values

    monkeypatch.setattr(initial_values, "BROADCASTING", type("Moved", (), {}))
    with pytest.raises(TypeError, match=r"Moved has no _get_variable_creator_initial_value.*"
                                        r"pip install \"tensorflow>="):
        initial_values.skip_broadcast_of_identical(object())


def test_canary_tf_mirrored_strategy_still_reuses_collective_keys():
    """When this fails, TF gives each MirroredStrategy its own collective keys and
    tfdist.strategies.MirroredStrategy (and the key half of tfdist's MWMS) can go."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}  # no cluster
    run = subprocess.run([sys.executable, __file__, "canary"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    outcome = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcome["tfdist"] == outcome["tfdist_mwms"] == "ok", outcome
    assert SHAPE_MISMATCH in outcome["tf"], (
        "TF's MirroredStrategy no longer fails on a second instance: upstream fixed the "
        f"collective keys. Received: {outcome['tf']!r}")


def canary():
    """Two strategies of one class, all-reducing different shapes, for each class.

    tfdist's classes go first: TF's failure aborts the process's collectives. The
    MultiWorkerMirroredStrategy runs without a cluster on both local CPUs, as on one
    machine with several GPUs.
    """
    import tensorflow as tf

    import tfdist

    tfdist.strategies.ensure_logical_cpus(2)
    local_mwms = tfdist.strategies.MultiWorkerMirroredStrategy._from_local_devices
    outcome = {}
    for name, new_strategy in (
            ("tfdist", tfdist.strategies.MirroredStrategy),
            ("tfdist_mwms", lambda: local_mwms(["/cpu:0", "/cpu:1"])),
            ("tf", tf.distribute.MirroredStrategy)):
        try:
            for size in (3, 5):
                assert all_reduce(new_strategy(), size).tolist() == [2.0] * size
            outcome[name] = "ok"
        except tf.errors.OpError as e:
            outcome[name] = e.message
    print(json.dumps(outcome))


def all_reduce(strategy, size):
    """The sum over replicas of ones([size]), by one all-reduce."""
    import tensorflow as tf

    ones = tf.function(lambda: strategy.run(lambda: tf.distribute.get_replica_context()
                                            .all_reduce("SUM", tf.ones([size]))))
    return strategy.experimental_local_results(ones())[0].numpy()


# --- two worker processes: a new multi_worker_mirrored per run ----------------------

@pytest.mark.multiprocess
@pytest.mark.parametrize("compression", [None, "topk"])
def test_two_workers_build_a_new_strategy_per_run(write_config, tmp_path, single_device,
                                                  compression):
    """small, large, small on two workers: the same results on both, learning, and
    without compression the single-device results (same global batch)."""
    out = tmp_path / "out"
    out.mkdir()
    config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    run = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds", "5", "--",
         sys.executable, __file__, "worker", str(out), str(compression)],
        capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert set(results) == {"worker-0", "worker-1"}
    # a variable is the chief's (broadcast) unless created in identical_initial_values()
    initial = {name: r.pop("initial") for name, r in results.items()}
    assert initial == {"worker-0": {"broadcast": 0.0, "identical": 0.0},
                       "worker-1": {"broadcast": 0.0, "identical": 1.0}}, initial
    assert results["worker-0"] == results["worker-1"]
    for losses in results["worker-0"]["losses"]:
        assert losses[-1] < 0.8 * losses[0], results
    if compression is None:
        for width, losses, checksum in zip(WIDTHS, results["worker-0"]["losses"],
                                           results["worker-0"]["checksums"]):
            reference, reference_losses = single_device(width)
            np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)
            np.testing.assert_allclose(checksum, checksum_of(reference), rtol=1e-5)


def worker(out, compression):
    """One worker of the 2-worker job: small, large, small, each on a new strategy."""
    import tfdist

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    initial = initial_values(tfdist.get_strategy("multi_worker_mirrored"), task["index"])
    losses, checksums = [], []
    for width in (*WIDTHS, WIDTHS[0]):
        weights, history = train(tfdist.get_strategy("multi_worker_mirrored"), width,
                                 None if compression == "None" else compression)
        losses.append(history)
        checksums.append(checksum_of(weights))
    assert checksums[0] == checksums[2], checksums
    path = pathlib.Path(out) / f"{task['type']}-{task['index']}.json"
    path.write_text(json.dumps({"losses": losses, "checksums": checksums,
                                "initial": initial}))


def initial_values(strategy, index):
    """Two variables each worker creates with its own index: the first is broadcast
    (every worker gets the chief's), the second, in `identical_initial_values()`, not."""
    import tensorflow as tf

    from tfdist.strategies.initial_values import identical_initial_values

    with strategy.scope():
        broadcast = tf.Variable(float(index))
        with identical_initial_values():
            identical = tf.Variable(float(index))
    return {"broadcast": float(broadcast.numpy()), "identical": float(identical.numpy())}


def checksum_of(weights):
    return float(sum(np.abs(w).sum() for w in weights))


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests" / "e2e" / "jobs"))
    {"canary": canary, "worker": worker}[sys.argv[1]](*sys.argv[2:])
