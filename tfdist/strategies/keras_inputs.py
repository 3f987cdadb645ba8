"""Keras `fit`'s inputs rebuilt in one order agreed by every worker.

Keras' data adapters shuffle on each worker by itself: `ArrayDataAdapter` (NumPy arrays,
``shuffle=True`` or ``"batch"``) with `tf.random.shuffle` inside its pipeline, seeded from
the worker's global seed; `PyDatasetAdapter` with Python's `random.shuffle` of the batch
indices at each pass. Under MultiWorkerMirroredStrategy every worker takes its share of
each global batch from its own pass (TF's `AutoShardPolicy.DATA`), so the shares
partition an epoch only if the passes agree. The datasets here are Keras' own, in an
order drawn from a seed every worker shares: the `n`-th pass over them is the same on
every worker (tf.data's `Dataset.random(seed, rerandomize_each_iteration=True)` for the
arrays, a pass counter for a PyDataset), and differs from pass to pass as Keras' does.

They read the adapters' private attributes (`_inputs`, `_batch_size`, `_shuffle`,
`py_dataset`, `shuffle`, `_output_signature`, `_standardize_batch`): a seam of Keras',
watched by tests/unit/seam/test_keras_seams.py.
"""

import hashlib
import itertools

import numpy as np
import tensorflow as tf

#: Keras' adapter class names (keras/src/trainers/data_adapters/) this module knows.
ARRAYS, PY_DATASET, GENERATOR = "ArrayDataAdapter", "PyDatasetAdapter", "GeneratorDataAdapter"


def dense_arrays(adapter):
    """The adapter's packed (x, y, sample_weight) as dense tensors, converted and cast as
    Keras converts them (`array_slicing.convert_to_sliceable`), or None where a leaf is
    not dense (sparse, ragged: Keras' own slicing then stays)."""
    from keras.src.trainers.data_adapters import array_slicing

    arrays = _lists_to_tuples(array_slicing.convert_to_sliceable(
        adapter._inputs, target_backend="tensorflow"))
    try:
        return tf.nest.map_structure(
            lambda leaf: None if leaf is None else _dense(leaf), arrays)
    except (TypeError, ValueError):
        return None


def _dense(leaf):
    """`leaf` as a dense tensor; ValueError for anything else."""
    if isinstance(leaf, (tf.SparseTensor, tf.RaggedTensor)) or not (
            tf.is_tensor(leaf) or isinstance(leaf, np.ndarray)):
        raise ValueError(f"not a dense array: {type(leaf).__name__}")
    return tf.convert_to_tensor(leaf)


def arrays_in_order(adapter, seed):
    """`adapter` (an `ArrayDataAdapter` that shuffles)'s dataset, shuffled from `seed`;
    None where its arrays are not dense (`dense_arrays`).

    Args:
        adapter: Keras' adapter of `fit`'s NumPy arrays or tensors.
        seed: an int every worker shares.
    """
    arrays = dense_arrays(adapter)
    if arrays is None:
        return None
    count, size = adapter._num_samples, adapter._batch_size
    whole = count % size == 0  # then every batch has a static size, as Keras' have
    draws = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    if adapter._shuffle == "batch":  # Keras' batch order, rows shuffled inside each batch
        batches = tf.data.Dataset.range(count).batch(size, drop_remainder=whole)
        indices = tf.data.Dataset.zip((batches, draws)).map(
            lambda rows, draw: _permuted(rows, draw, seed))
    else:
        order = draws.take(1).map(
            lambda draw: _permuted(tf.range(count, dtype=tf.int64), draw, seed))
        indices = order.flat_map(lambda rows: tf.data.Dataset.from_tensor_slices(rows)
                                 .batch(size, drop_remainder=whole))
    dataset = indices.map(lambda rows: tf.nest.map_structure(
        lambda a: None if a is None else tf.gather(a, rows), arrays),
        num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def _permuted(rows, draw, seed):
    """`rows` in the order stateless seed (draw, seed) gives."""
    key = tf.stack([draw, tf.constant(seed, tf.int64)])
    return tf.random.experimental.stateless_shuffle(rows, seed=key)


def py_dataset_in_order(adapter, seed, compare):
    """`adapter` (a `PyDatasetAdapter` read without Keras' enqueuer)'s dataset: pass `n`
    reads the batches in the order seed (`seed`, n) gives where `fit` shuffles, else in
    index order; `compare(n, count, digest)` hears a digest of pass `n`'s first batch and
    of its whole pass, before each is trained (to compare them between workers: the
    PyDataset's own `on_epoch_end` or `__getitem__` may differ from worker to worker)."""
    py_dataset, passes = adapter.py_dataset, itertools.count()

    def batches():
        number, total = next(passes), py_dataset.num_batches
        order = range(total)
        if adapter.shuffle:
            order = np.random.default_rng([seed, number]).permutation(total)
        digest = hashlib.sha256()
        for position, index in enumerate(order):
            batch = adapter._standardize_batch(py_dataset[int(index)])
            digest.update(fingerprint(batch).encode())
            if position in (0, total - 1):
                compare(number, position + 1, digest.hexdigest()[:16])
            yield batch

    dataset = tf.data.Dataset.from_generator(batches,
                                             output_signature=adapter._output_signature)
    return dataset.prefetch(tf.data.AUTOTUNE)


def fingerprint(batch):
    """A short hex digest of a batch's arrays (their bytes, shapes and dtypes)."""
    digest = hashlib.sha256()
    for leaf in tf.nest.flatten(batch):
        array = np.asarray(leaf)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def _lists_to_tuples(structure):
    """Keras' `tree.lists_to_tuples`: lists become tuples (tf.data's structures)."""
    if isinstance(structure, (list, tuple)):
        return tuple(_lists_to_tuples(item) for item in structure)
    if isinstance(structure, dict):
        return {key: _lists_to_tuples(value) for key, value in structure.items()}
    return structure
