"""Every example once per epoch on several workers: one input order for all of them.

Under MultiWorkerMirroredStrategy each worker takes its share of every global batch from
its own pass over the input (TF's `AutoShardPolicy.DATA`, AUTO's choice for in-memory
data), so the shares partition an epoch only if every worker's pass has the same order.
Measured on 2 workers, 192 examples, before this module: a PyDataset shuffling itself
trained 51 twice and 55 never, NumPy arrays with `fit`'s default ``shuffle=True`` 47/47,
an unseeded `tf.data` ``shuffle()`` 50/50, all without a word.

`AgreedInputOrder` (a mixin of tfdist's MultiWorkerMirroredStrategy) settles it where the
dataset is distributed:

- `fit`'s NumPy arrays and PyDataset are rebuilt in an order drawn from one seed the chief
  gives every worker once (`keras_inputs`); a PyDataset's own shuffling in
  `on_epoch_end` is the user's: each pass's first batch, then its whole pass, is compared
  between workers, and a difference is reported once;
- an unseeded `tf.data` shuffle (`unseeded_shuffles`) and a Python generator, whose order
  tfdist cannot know, are reported once, in one line, with what to change.

The seed and the fingerprints travel through TensorFlow's coordination service (its
key-value store, private API watched by tests/unit/seam/test_keras_seams.py); where a job has none,
the seed is derived from the cluster every worker shares and nothing is compared.
"""

import collections
import hashlib
import json
import secrets
import sys
import warnings

import tensorflow as tf
from tensorflow.python.eager import context

from tfdist.strategies import keras_inputs
from tfdist.strategies.keras_build_batch import KERAS_TRAINER
from tfdist.strategies.shuffles import pipeline_nodes, unseeded_shuffles
from tfdist.strategies.task import is_chief

#: How long a worker waits for the chief's seed or a peer's fingerprint (milliseconds).
WAIT_MS = 120_000
#: Readers that AUTO shards by file (then each worker reads its own files: no agreement).
FILE_READERS = ("TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset")

UNSEEDED = (
    "tfdist: on {workers} workers each one shuffles this tf.data input in its own order "
    "(shuffle() without a seed) and takes its share of every global batch from it, so an "
    "epoch trains some examples twice and others never: give shuffle() a seed, the same on "
    "every worker, or call keras.utils.set_random_seed(seed) on every worker before "
    "building the dataset. Received: dataset={name}")
GENERATOR = (
    "tfdist: on {workers} workers each one reads its own pass of this Python generator and "
    "takes its share of every global batch from it; tfdist cannot know its order, so unless "
    "it yields the same batches in the same order on every worker an epoch trains some "
    "examples twice and others never: make it do so (seed any shuffle alike on every "
    "worker), or pass NumPy arrays, a keras.utils.PyDataset or a tf.data.Dataset with "
    "shuffle(seed=...). Received: x={name}")
PY_DATASET_DIFFERS = (
    "tfdist: this PyDataset's batches differ between workers ({what} from {peer}'s), so "
    "an epoch trains some examples twice and others never: make its on_epoch_end and "
    "__getitem__ give the same batches on every worker, "
    "e.g. call keras.utils.set_random_seed(seed) on every worker before fit or seed its own "
    "generator alike. Received: x={name}")
PY_DATASET_ENQUEUER = (
    "tfdist: on {workers} workers fit(shuffle=True) shuffles this PyDataset's batches on "
    "each worker by itself when Keras reads it with workers > 1 or use_multiprocessing, so "
    "an epoch trains some examples twice and others never: construct it with workers=1 "
    "(tfdist then reads it in one order agreed by all workers) or fit with shuffle=False "
    "and shuffle alike in on_epoch_end. Received: workers={py_workers}, "
    "use_multiprocessing={multiprocessing}")
ARRAYS_NOT_DENSE = (
    "tfdist: on {workers} workers fit(shuffle=True) shuffles sparse or ragged arrays on "
    "each worker by itself, so an epoch trains some examples twice and others never: fit "
    "with shuffle=False on arrays shuffled alike beforehand, or pass a tf.data.Dataset with "
    "shuffle(seed=...). Received: x={name}")


class AgreedInputOrder:
    """Strategy mixin: datasets distributed on several workers read in one order (see the
    module docstring). `input_order` counts what it did per kind of input ("arrays",
    "py_dataset", "warned"), so a test notices if Keras stops calling it."""

    def __init__(self, *args, **kwargs):
        self.input_order = collections.Counter()
        super().__init__(*args, **kwargs)

    def experimental_distribute_dataset(self, dataset, options=None):
        workers = worker_count(self)
        if workers > 1:
            adapter = keras_data_adapter()
            dataset = in_agreed_order(self, adapter, dataset) if adapter else dataset
            check_tf_data_order(self, dataset)
        return super().experimental_distribute_dataset(dataset, options)


def worker_count(strategy):
    """The workers whose passes a global batch is split between (1 outside a cluster)."""
    try:
        return int(strategy.extended._num_workers)
    except (AttributeError, TypeError, ValueError):
        return 1


def keras_data_adapter():
    """The data adapter of the Keras `TFEpochIterator` being built, when Keras' trainer
    is the caller (its `__init__` distributes its adapter's dataset), else None."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if (frame.f_globals.get("__name__", "").startswith(KERAS_TRAINER)
                and frame.f_code.co_name == "__init__" and hasattr(owner, "data_adapter")):
            return owner.data_adapter
        frame = frame.f_back
    return None


def in_agreed_order(strategy, adapter, dataset):
    """`dataset` (Keras' from `adapter`) in the order every worker agrees on, or as it is
    (with a one-line warning where its order cannot be agreed)."""
    kind, workers = type(adapter).__name__, worker_count(strategy)
    if kind == keras_inputs.ARRAYS and adapter._shuffle:
        agreed = keras_inputs.arrays_in_order(adapter, agreed_seed(strategy))
        if agreed is not None:
            _count(strategy, "arrays")
            return agreed
        warn_once(strategy, adapter, ARRAYS_NOT_DENSE.format(
            workers=workers, name=_name(adapter._inputs)))
    elif kind == keras_inputs.PY_DATASET and adapter.py_dataset.num_batches is not None:
        if adapter.enqueuer is None:
            _count(strategy, "py_dataset")
            return keras_inputs.py_dataset_in_order(
                adapter, agreed_seed(strategy), batches_check(strategy, adapter))
        if adapter.shuffle:
            warn_once(strategy, adapter, PY_DATASET_ENQUEUER.format(
                workers=workers, py_workers=adapter.py_dataset.workers,
                multiprocessing=adapter.py_dataset.use_multiprocessing))
    elif kind == keras_inputs.GENERATOR:
        warn_once(strategy, adapter, GENERATOR.format(
            workers=workers, name="a Python generator"))
    return dataset


def check_tf_data_order(strategy, dataset):
    """Warns once (one line) where `dataset`, split between several workers by element,
    shuffles without a seed (`unseeded_shuffles`); a dataset AUTO shards by file, or one
    with sharding off, is not judged.

    Args:
        strategy: the strategy the dataset feeds; nothing is said for one worker.
        dataset: what is distributed (anything but a `tf.data.Dataset` is not judged).
    """
    workers = worker_count(strategy)
    if workers < 2 or not isinstance(dataset, tf.data.Dataset) or not unseeded_shuffles(dataset):
        return
    policy = dataset.options().experimental_distribute.auto_shard_policy
    auto = tf.data.experimental.AutoShardPolicy
    if policy == auto.OFF or policy == auto.FILE or (policy == auto.AUTO and any(
            type(node).__name__.lstrip("_").startswith(FILE_READERS)
            for node in pipeline_nodes(dataset))):
        return
    warn_once(strategy, dataset, UNSEEDED.format(workers=workers, name=_name(dataset)))


def agreed_seed(strategy):
    """One int every worker of `strategy`'s job shares, drawn once: by the chief (from the
    global seed where one is set, else at random) and read by the others through the
    coordination service; derived from the cluster where the job has no such service."""
    if getattr(strategy, "_tfdist_input_seed", None) is None:
        service = context.context().coordination_service
        if service is None:
            strategy._tfdist_input_seed = _from_cluster(strategy)
        else:
            key = f"{_prefix(strategy)}/seed"
            if is_chief(strategy):
                context.context().set_config_key_value(key, str(_draw()))
            strategy._tfdist_input_seed = int(
                context.context().get_config_key_value(key, WAIT_MS))
    return strategy._tfdist_input_seed


def batches_check(strategy, adapter):
    """A function (pass number, batches read, their digest) that publishes this worker's
    digest and warns once where a peer's differs (from tf.data's reading thread)."""
    if context.context().coordination_service is None:
        return lambda number, count, digest: None
    serial = _count(strategy, "py_dataset", 0)
    me, peers = _task_key(strategy), _peer_keys(strategy)

    def check(number, count, digest):
        key = f"{_prefix(strategy)}/py_dataset/{serial}/{number}/{count}"
        context.context().set_config_key_value(f"{key}/{me}", digest)
        for peer in peers:
            try:
                theirs = context.context().get_config_key_value(f"{key}/{peer}", WAIT_MS)
            except Exception:  # a peer that never got there: nothing can be said
                return
            if theirs != digest:
                warn_once(strategy, adapter, PY_DATASET_DIFFERS.format(
                    what=("the first batch of a pass differs" if count == 1 else
                          f"all {count} batches of a pass together differ"),
                    peer=peer, name=_name(adapter.py_dataset)))
                return

    return check


def warn_once(strategy, subject, message):
    """`message` as a warning, once per `subject` (an input) and `strategy`."""
    said = strategy.__dict__.setdefault("_tfdist_order_warned", set())
    if id(subject) not in said:
        said.add(id(subject))
        _count(strategy, "warned")
        warnings.warn(message, UserWarning, stacklevel=2)


def _count(strategy, kind, step=1):
    """Adds `step` to `strategy`'s `input_order[kind]` (a TF strategy gets the counter
    here); returns the count."""
    counter = strategy.__dict__.setdefault("input_order", collections.Counter())
    counter[kind] += step
    return counter[kind]


def _draw():
    """The chief's seed: from TensorFlow's global seed where one is set, else at random."""
    seed = context.global_seed()
    if seed is None:
        return secrets.randbits(62)
    return int.from_bytes(hashlib.sha256(f"tfdist/{seed}".encode()).digest()[:7], "big")


def _from_cluster(strategy):
    """A seed every worker derives alike from the cluster and the strategy's serial."""
    spec = json.dumps(strategy.cluster_resolver.cluster_spec().as_dict(), sort_keys=True)
    text = f"{spec}/{strategy._collective_key_base}/{context.global_seed()}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")


def _prefix(strategy):
    return f"tfdist/input_order/{getattr(strategy, '_collective_key_base', 0)}"


def _task_key(strategy):
    resolver = strategy.cluster_resolver
    return f"{resolver.task_type}:{resolver.task_id}"


def _peer_keys(strategy):
    """The other chief and worker tasks, as "type:index"."""
    cluster = strategy.cluster_resolver.cluster_spec().as_dict()
    tasks = [f"{kind}:{index}" for kind in ("chief", "worker")
             for index in range(len(cluster.get(kind, ())))]
    return [task for task in tasks if task != _task_key(strategy)]


def _name(value, limit=120):
    """A short description of an input for a warning."""
    if isinstance(value, (tuple, list)) and value:
        return f"{type(value).__name__} of {len(value)}, first {_name(value[0], limit)}"
    text = repr(value)
    if text.startswith("<"):  # object's default repr: its class says more than its address
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "..."
