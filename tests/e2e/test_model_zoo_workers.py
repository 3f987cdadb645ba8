"""The model zoo (tests/e2e/jobs/zoo.py) on 2 and 4 real worker processes
(MultiWorkerMirroredStrategy under `tfdist launch`): with the exact exchange and SGD every
family ends on every worker with one device's weights (TensorFlow's own MirroredStrategy's
on as many replicas where BatchNormalization and Dropout compute per replica), in `fit`
(NumPy and a dataset), the Trainer and your own loop; the other exchanges and local SGD
train them alike on every worker, also under mixed_float16. One launch per cluster runs
every case (tests/e2e/jobs/runs.py)."""

import json
import sys

import numpy as np
import pytest

from test_multiworker_training import batched_runs, one_launch, weights
from test_model_zoo import reference
from paths import JOBS

sys.path.insert(0, str(JOBS))
from zoo import EXCHANGES as ZOO_EXCHANGES  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("jobs_path", "two_cpus")]

JOB = JOBS / "zoo_job.py"
FAMILIES = ("transformer", "rnn", "conv", "multi_io", "finetune", "shared")
LOOPS = ("fit", "fit_dataset", "trainer", "own")
#: (workers, family, loop) of the exact runs: every family through fit on 2 workers,
#: every loop for the transformer and the multi-input model; on 4 workers the transformer
#: through fit and its own loop, and the conv model (BatchNormalization,
#: against TensorFlow's strategy). benchmarks/model_zoo.py runs every family and loop.
EXACT = ([(2, f, "fit") for f in FAMILIES]
         + [(2, f, loop) for f in ("transformer", "multi_io") for loop in LOOPS if loop != "fit"]
         + [(4, "transformer", loop) for loop in ("fit", "own")] + [(4, "conv", "fit")])
#: Other exchanges on 2 workers, as config sections: the Dense-over-a-sequence and
#: embedding model (the transformer) through top-k + EF and DiLoCo, the multi-input model
#: with top-k, the transformer under mixed_float16 (every exchange: test_model_zoo_exchanges).
EXCHANGES = {name: ZOO_EXCHANGES[name] for name in ("topk+ef", "diloco")}
TRAINED = ([("transformer", e, None) for e in ("topk+ef", "diloco")]
           + [("multi_io", "topk+ef", None), ("transformer", "none", "mixed_float16")])


def _flags(family, loop, exchange="none", policy=None, epochs=None):
    flags = ["--family", family, "--loop", loop]
    if exchange != "none":
        flags += ["--exchange", json.dumps(EXCHANGES[exchange])]
    if policy:
        flags += ["--policy", policy]
    return tuple(flags + (["--epochs", str(epochs)] if epochs else []))


TWO = {
    "test_every_family_on_workers_ends_where_one_device_does":
        lambda workers, family, loop: _flags(family, loop) if workers == 2 else None,
    "test_every_exchange_trains_the_zoo_alike_on_every_worker":
        lambda family, exchange, policy: _flags(family, "fit", exchange, policy, epochs=4),
}
FOUR = {
    "test_every_family_on_workers_ends_where_one_device_does":
        lambda workers, family, loop: _flags(family, loop) if workers == 4 else None,
}


def _per_replica(workers, family, loop, count):
    if family == "conv" and workers == count:
        return (*_flags(family, loop), "--reference", str(count))
    return None


#: TensorFlow's own MirroredStrategy on 2 and 4 logical CPUs, one process for each count:
#: for BatchNormalization, and under mixed_float16 (where one device's first step
#: overflows the loss scale that half a batch does not: one device skips a step that the
#: replicas take).
REFERENCES = {
    2: {"test_every_family_on_workers_ends_where_one_device_does":
        lambda workers, family, loop: _per_replica(workers, family, loop, 2),
        "test_every_exchange_trains_the_zoo_alike_on_every_worker":
        lambda family, exchange, policy: (
            *_flags(family, "fit", exchange, policy, epochs=4), "--reference", "2")
        if policy and exchange == "none" else None},
    4: {"test_every_family_on_workers_ends_where_one_device_does":
        lambda workers, family, loop: _per_replica(workers, family, loop, 4)},
}


@pytest.fixture(scope="module")
def zoo_two_workers(request, tmp_path_factory):
    return batched_runs(request, tmp_path_factory, "cluster: {worker: 2}\n"
                        "strategy: multi_worker_mirrored\n", TWO, job=JOB)


@pytest.fixture(scope="module")
def zoo_four_workers(request, tmp_path_factory):
    return batched_runs(request, tmp_path_factory, "cluster: {worker: 4}\n"
                        "strategy: multi_worker_mirrored\n", FOUR, job=JOB)


@pytest.fixture(scope="module")
def zoo_references(request, tmp_path_factory):
    """{workers: the runs' folders} of TensorFlow's MirroredStrategy on that many CPUs (a
    process per count: logical CPUs are fixed once per process)."""
    found = {}
    for count in REFERENCES:
        found[count] = batched_runs(request, tmp_path_factory, None, REFERENCES[count],
                                    job=JOB)[0]
    return found


def _tasks(workers):
    return [f"worker-{i}" for i in range(workers)]


@pytest.mark.parametrize("workers, family, loop", EXACT)
def test_every_family_on_workers_ends_where_one_device_does(request, workers, family, loop):
    fixture = "zoo_two_workers" if workers == 2 else "zoo_four_workers"
    results, out, _ = one_launch(request, fixture, TWO if workers == 2 else FOUR)
    if family == "conv":  # BatchNormalization and Dropout: TF's own strategy, trainable only
        from zoo import build

        outs = request.getfixturevalue("zoo_references")[workers]
        expected = weights(outs[(*_flags(family, loop), "--reference", str(workers))],
                           "reference")
        trainable = [i for i, w in enumerate(build(family).weights) if w.trainable]
    else:
        expected, losses = reference(family, loop)
        trainable = range(len(expected))
        for task in _tasks(workers):
            np.testing.assert_allclose(results[task]["losses"], losses, rtol=1e-5)
    for task in _tasks(workers):
        got = weights(out, task)
        assert len(got) == len(expected)
        for i in trainable:
            np.testing.assert_allclose(got[i], expected[i], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{task}: weight {i}")


@pytest.mark.parametrize("family, exchange, policy", TRAINED)
def test_every_exchange_trains_the_zoo_alike_on_every_worker(request, family, exchange, policy):
    """Finite, the loss falls, the same weights on both workers; under mixed_float16 the
    exact exchange also stays within float16's rounding of one device's run."""
    results, out, _ = one_launch(request, "zoo_two_workers", TWO)
    first, second = weights(out, "worker-0"), weights(out, "worker-1")
    for a, b in zip(first, second):
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, b)
    losses = results["worker-0"]["losses"]
    assert losses[-1] < losses[0], losses
    assert results["worker-0"]["logs"]["comm_payload_bytes"] > 0
    if policy and exchange == "none":  # TensorFlow's own strategy, within float16's rounding
        outs = request.getfixturevalue("zoo_references")[2]
        expected = weights(outs[(*_flags(family, "fit", exchange, policy, epochs=4),
                                 "--reference", "2")], "reference")
        for a, b in zip(first, expected):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
