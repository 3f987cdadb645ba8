"""Every example once per epoch on several workers, or one line saying why not.

The multi-process tests run tests/e2e/jobs/epoch_coverage_job.py on 2 workers (global batch 32)
and 4 workers (global batch 30, which 4 replicas do not divide: TF splits it 8/8/7/7):
every input kind in turn in the same workers, each worker recording the ids its replica
trained per epoch. The others check the pieces in one process.
"""

import collections
import hashlib
import json
import math
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.strategies import input_order, keras_inputs
from paths import JOBS

JOB = JOBS / "epoch_coverage_job.py"
EXAMPLES, EPOCHS = 192, 3
AGREED = ("numpy", "numpy_batch", "tf_seeded", "trainer_tf_seeded", "py_dataset_seeded")
WARNED = {"generator": "Python generator", "tf_unseeded": "shuffle() without a seed",
          "trainer_tf_unseeded": "shuffle() without a seed",
          "py_dataset_unseeded": "PyDataset's batches differ between workers",
          "py_dataset_tail": "batches of a pass together differ"}


def run_job(tmp_path_factory, workers, batch):
    """{task: {kind: record}} of one launch of the job on `workers` workers."""
    out = tmp_path_factory.mktemp(f"coverage{workers}")
    config = out / "cluster.yaml"
    config.write_text(f"cluster: {{worker: {workers}}}\nstrategy: multi_worker_mirrored\n")
    run = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", str(config), "--grace-seconds", "5", "--",
         sys.executable, str(JOB), "--out", str(out), "--batch", str(batch),
         "--epochs", str(EPOCHS), "--examples", str(EXAMPLES)],
        capture_output=True, text=True, timeout=420)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))}


@pytest.fixture(scope="module", params=[(2, 32), (4, 30)], ids=["2workers", "4workers"])
def coverage(request, tmp_path_factory):
    workers, batch = request.param
    return workers, batch, run_job(tmp_path_factory, workers, batch)


def counts(records, kind, epoch):
    """How often each id was trained in `epoch`, over all workers."""
    return collections.Counter(i for r in records.values() for i in r[kind]["epochs"][epoch])


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", AGREED)
def test_every_id_once_per_epoch_without_a_word(coverage, kind):
    workers, _, records = coverage
    assert len(records) == workers
    for epoch in range(EPOCHS):
        assert counts(records, kind, epoch) == {i: 1 for i in range(EXAMPLES)}, (kind, epoch)
    assert all(r[kind]["warnings"] == [] for r in records.values())


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["numpy", "py_dataset_seeded", "tf_seeded"])
def test_the_order_still_changes_from_epoch_to_epoch(coverage, kind):
    _, _, records = coverage
    chief = records["worker-0"][kind]["epochs"]
    assert chief[0] != chief[1] and chief[1] != chief[2]


@pytest.mark.multiprocess
def test_numpy_is_rebuilt_by_tfdist_and_batch_shuffle_keeps_keras_batches(coverage):
    workers, batch, records = coverage
    assert all(r[k]["input_order"].get("arrays") == 1 for r in records.values()
               for k in ("numpy", "numpy_batch"))
    first = sorted(i for r in records.values() for i in r["numpy_batch"]["epochs"][0][:1])
    assert all(i < batch for i in first)  # every worker's first row is from rows 0..batch-1


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", sorted(WARNED))
def test_an_order_tfdist_cannot_agree_is_named_once_in_one_line(coverage, kind):
    workers, _, records = coverage
    for record in records.values():
        (said,) = record[kind]["warnings"]
        assert WARNED[kind] in said and "\n" not in said and "Received: " in said
        assert f"on {workers} workers" in said or "PyDataset" in said
    twice = [i for i, n in counts(records, kind, 0).items() if n > 1]
    assert twice, f"{kind}: the workers agreed after all; the warning would be wrong"


@pytest.mark.multiprocess
def test_a_global_batch_the_replicas_do_not_divide_still_partitions_the_epoch(coverage):
    """30 over 4 replicas: TF gives 8/8/8/6 of each full batch and 3 each of the last 12
    rows; the ids still partition the epoch (how each share is weighed is another
    matter: tfdist/strategies/batch_rows.py)."""
    workers, batch, records = coverage
    full, rest = divmod(EXAMPLES, batch)
    expected = [full * a + b for a, b in zip(split(batch, workers), split(rest, workers))]
    for kind in AGREED:
        got = [len(records[f"worker-{w}"][kind]["epochs"][0]) for w in range(workers)]
        assert got == expected, (kind, got, expected)


def split(rows, replicas):
    """TF's split of `rows` between replicas: ceil-sized shares in order, what is left
    to the last (16 over 3: 6/6/4)."""
    size = math.ceil(rows / replicas)
    return [max(0, min(size, rows - i * size)) for i in range(replicas)]


# --- in one process -------------------------------------------------------------------


class FakeExtended:
    def __init__(self, workers):
        self._num_workers = workers


class FakeStrategy:
    """What `check_tf_data_order` asks of a strategy: its worker count."""

    def __init__(self, workers):
        self.extended = FakeExtended(workers)


@pytest.fixture(autouse=True)
def no_global_seed():
    """An unseeded shuffle is one made without TensorFlow's global seed (another test of
    this process may have set it: the shuffle then takes a seed from it, the same on every
    worker)."""
    from tensorflow.python.eager import context

    before = context.global_seed()
    tf.random.set_seed(None)
    yield
    tf.random.set_seed(before)


def said(strategy, dataset):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        input_order.check_tf_data_order(strategy, dataset)
    return [str(w.message) for w in caught]


def test_an_unseeded_shuffle_on_several_workers_is_named_once():
    unseeded = tf.data.Dataset.range(8).shuffle(8).batch(4)
    strategy = FakeStrategy(3)
    (message,) = said(strategy, unseeded)
    assert message.startswith("tfdist: on 3 workers") and message.count("\n") == 0
    assert "Received: dataset=" in message
    assert said(strategy, unseeded) == []  # once per dataset
    assert len(said(strategy, tf.data.Dataset.zip((unseeded, unseeded)))) == 1


@pytest.mark.parametrize("case", ["seeded", "one_worker", "sharding_off", "by_file", "files",
                                  "not_a_dataset", "no_worker_count"])
def test_what_is_not_named(case, tmp_path):
    dataset, strategy = tf.data.Dataset.range(8).shuffle(8), FakeStrategy(2)
    if case == "seeded":
        dataset = tf.data.Dataset.range(8).shuffle(8, seed=3)
    elif case == "one_worker":
        strategy = FakeStrategy(1)
    elif case in ("sharding_off", "by_file"):
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = getattr(
            tf.data.experimental.AutoShardPolicy, {"sharding_off": "OFF"}.get(case, "FILE"))
        dataset = dataset.with_options(options)
    elif case == "files":  # AUTO shards a reader by file: each worker reads its own
        path = tmp_path / "rows.txt"
        path.write_text("a\nb\n")
        dataset = tf.data.TextLineDataset([str(path)]).shuffle(4)
    elif case == "not_a_dataset":
        dataset = np.arange(8)
    elif case == "no_worker_count":
        strategy = object()
    assert said(strategy, dataset) == []


def test_a_hostile_worker_count_is_one_worker():
    for value in (None, "two", float("nan"), object()):
        strategy = FakeStrategy(value)
        assert input_order.worker_count(strategy) == 1
        assert said(strategy, tf.data.Dataset.range(8).shuffle(8)) == []


def array_adapter(shuffle, count=10, batch=4, **arrays):
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    x = arrays.get("x", np.arange(count, dtype="float32")[:, None])
    return ArrayDataAdapter(x, np.arange(count, dtype="float32"), batch_size=batch,
                            shuffle=shuffle)


def passes(dataset, count=3):
    """The row ids (from y) of `count` passes over `dataset`."""
    return [[int(v) for b in dataset for v in b[1].numpy()] for _ in range(count)]


def test_numpy_passes_are_permutations_alike_for_one_seed_and_new_each_pass():
    adapter = array_adapter(True)
    first, again = passes(keras_inputs.arrays_in_order(adapter, 11)), \
        passes(keras_inputs.arrays_in_order(adapter, 11))
    assert first == again  # another worker with the same seed reads the same passes
    assert all(sorted(p) == list(range(10)) for p in first)
    assert len({tuple(p) for p in first}) == 3
    assert passes(keras_inputs.arrays_in_order(adapter, 12)) != first


def test_batch_shuffle_keeps_keras_batches_and_shuffles_inside_them():
    dataset = keras_inputs.arrays_in_order(array_adapter("batch"), 5)
    for ids in passes(dataset):
        assert [sorted(ids[i:i + 4]) for i in (0, 4, 8)] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                             [8, 9]]


@pytest.mark.parametrize("x", ["sparse", "ragged"])
def test_arrays_tfdist_cannot_gather_are_left_to_keras(x):
    count = 6
    leaf = (tf.sparse.from_dense(np.eye(count, dtype="float32")) if x == "sparse" else
            tf.ragged.constant([[1.0]] * count))
    assert keras_inputs.arrays_in_order(array_adapter(True, count, 2, x=leaf), 1) is None


class Rows(keras.utils.PyDataset):
    def __init__(self, batches=5):
        super().__init__()
        self.batches = batches

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        return np.full((2, 1), index, "float32"), np.full((2,), index, "float32")


def py_adapter(shuffle):
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    adapter = PyDatasetAdapter(Rows(), shuffle=shuffle)
    adapter.get_tf_dataset()  # Keras' signature, as fit makes it before distributing
    return adapter


def test_py_dataset_passes_follow_the_seed_and_report_their_first_batch_and_whole_pass():
    heard = []
    adapter = py_adapter(True)
    dataset = keras_inputs.py_dataset_in_order(adapter, 9, lambda *a: heard.append(a))
    orders = [[int(b[1].numpy()[0]) for b in dataset] for _ in range(3)]
    expected = [list(np.random.default_rng([9, n]).permutation(5)) for n in range(3)]
    assert orders == expected
    assert [(n, count) for n, count, _ in heard] == [(n, c) for n in range(3) for c in (1, 5)]
    prints = [keras_inputs.fingerprint(adapter._standardize_batch(Rows()[i]))
              for i in orders[0]]
    digest = hashlib.sha256()
    digest.update(prints[0].encode())
    assert heard[0][2] == digest.hexdigest()[:16]
    for fingerprint in prints[1:]:
        digest.update(fingerprint.encode())
    assert heard[1][2] == digest.hexdigest()[:16]  # every batch of the pass, in its order
    assert len({d for _, count, d in heard if count == 5}) == 3  # the order counts


def test_py_dataset_without_shuffle_reads_in_index_order():
    dataset = keras_inputs.py_dataset_in_order(py_adapter(False), 9, lambda *a: None)
    assert [int(b[1].numpy()[0]) for b in dataset] == [0, 1, 2, 3, 4]


def test_a_fingerprint_tells_apart_values_shapes_and_dtypes():
    base = (np.zeros((2, 2), "float32"),)
    others = [(np.ones((2, 2), "float32"),), (np.zeros((4,), "float32"),),
              (np.zeros((2, 2), "float64"),)]
    assert len({keras_inputs.fingerprint(b) for b in [base, *others]}) == 4
    assert keras_inputs.fingerprint(base) == keras_inputs.fingerprint(
        [np.zeros((2, 2), "float32")])
