"""Feeding each strategy: the right distributed dataset for `Trainer`.

| strategy | dataset given as | what each replica reads |
|---|---|---|
| mirrored, central_storage, one_device | `tf.data.Dataset` batched to the *global* batch | an equal slice of each global batch |
| multi_worker_mirrored | `tf.data.Dataset` (global batch) | auto-sharded per worker (`AutoShardPolicy.AUTO`: by file, else by element), then split per replica; by element, every worker's pass must have the same order: a shuffle without a seed is reported in one line (`check_tf_data_order`) |
| any of the above | `fn(InputContext) -> Dataset` | what `fn` returns: shard with `context.input_pipeline_id` / `num_input_pipelines`, batch with `context.get_per_replica_batch_size(global)` |
| parameter_server | `fn(InputContext)` or a repeated `Dataset` | a per-worker copy created on each worker by `ClusterCoordinator.create_per_worker_dataset` (shuffle with different seeds per worker; no sharding) |
"""

import tensorflow as tf

from tfdist.strategies.input_order import AgreedInputOrder, check_tf_data_order
from tfdist.strategies.input_pipelines import plain_iterators, without_model_thread


def distribute(strategy, dataset_or_fn, coordinator=None):
    """A distributed dataset (or per-worker dataset under a coordinator) for `strategy`.

    Args:
        strategy: the strategy the dataset feeds.
        dataset_or_fn: a `tf.data.Dataset`, or a function of a
            `tf.distribute.InputContext` returning one.
        coordinator: a `ClusterCoordinator` (ParameterServerStrategy only).

    Raises:
        TypeError: neither a dataset nor a callable.
    """
    is_fn = is_dataset_fn(dataset_or_fn)
    if coordinator is None:  # TF's own strategy classes too: iterators that end at once
        return plain_iterators(strategy, distributed_here(strategy, dataset_or_fn, is_fn), None)
    if not is_fn:
        return coordinator.create_per_worker_dataset(dataset_or_fn)
    return per_worker_from_function(strategy, dataset_or_fn, coordinator)


def is_dataset_fn(dataset_or_fn):
    """Whether `dataset_or_fn` is a dataset function (False: a dataset; else TypeError)."""
    is_fn = callable(dataset_or_fn) and not isinstance(dataset_or_fn, tf.data.Dataset)
    if not is_fn and not isinstance(dataset_or_fn, tf.data.Dataset):
        raise TypeError("expected a tf.data.Dataset of global batches or a function of a "
                        "tf.distribute.InputContext returning one; for NumPy arrays (what "
                        "model.fit takes) write tf.data.Dataset.from_tensor_slices((x, y))"
                        ".batch(global_batch_size). Received: dataset_or_fn="
                        f"{type(dataset_or_fn).__name__}")
    return is_fn


def distributed_here(strategy, dataset_or_fn, is_fn):
    """The strategy's distributed dataset, made in this process (no coordinator)."""
    if is_fn:
        return strategy.distribute_datasets_from_function(
            lambda context: without_model_thread(dataset_or_fn(context)))
    if not isinstance(strategy, AgreedInputOrder):  # TF's MWMS: one line here
        check_tf_data_order(strategy, dataset_or_fn)
    return strategy.experimental_distribute_dataset(without_model_thread(dataset_or_fn))


def per_worker_from_function(strategy, dataset_fn, coordinator):
    """A per-worker dataset made on each worker by `dataset_fn` (ValueError if it uses a
    dataset built here on the chief)."""
    captured = captured_datasets(dataset_fn)
    if captured:
        raise ValueError(
            "under ParameterServerStrategy the dataset function runs on each worker, so it "
            "cannot use a dataset built here on the chief (TensorFlow fails with 'Unable to "
            f"parse tensor proto'): build {captured[0]!r} inside the function. "
            f"Received: dataset_or_fn={getattr(dataset_fn, '__name__', dataset_fn)!r}")

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    return coordinator.create_per_worker_dataset(per_worker_dataset_fn)


def captured_datasets(fn):
    """Names of the `tf.data.Dataset`s that function `fn` uses from outside itself (its
    closure and the module-level names it reads)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    cells = zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ()))
    names = ((n, fn.__globals__.get(n)) for n in code.co_names)
    return [name for name, value in [*cells, *names] if isinstance(value, tf.data.Dataset)]


def steps_per_epoch_of(dataset_or_fn, steps_per_epoch):
    """`steps_per_epoch`, or a dataset's batches if it has a known, finite number (as
    Keras' fit counts them); None otherwise."""
    if steps_per_epoch is not None or not isinstance(dataset_or_fn, tf.data.Dataset):
        return steps_per_epoch
    batches = int(dataset_or_fn.cardinality())
    return batches if batches > 0 else None
