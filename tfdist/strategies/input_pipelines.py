"""Distributed datasets whose iterators end at once: no pause at epoch ends or after fit.

tf.data's autotuner runs one "model" thread per iterator of a pipeline with autotuning on
(the default). It sleeps between optimisations for a period that doubles up to 60 s, and
deleting the iterator wakes it before TF marks the iterator cancelled (TF's
`CancellationManager` runs its callbacks first), so the wake-up can be lost and the
deletion then waits out the rest of the period: pauses of 10-83 s at epoch ends and after
the last step were measured on the UNet example, intermittent because it is a race.
A distributed dataset has such a pipeline per worker (the user's) and, through TF's
`MultiDeviceIterator`, one more per device; Keras deletes them at the end of `fit`, the
Trainer at the end of each validation.

`StallFreeInput` (a mixin of tfdist's strategies) removes both, without touching TF:

- the user's pipeline gets ``autotune.enabled = False`` unless the user set that option
  (`num_parallel_calls=AUTOTUNE` then uses the CPU count and `prefetch(AUTOTUNE)` TF's
  buffer-size autotuner, which needs no thread);
- a worker with one local CPU device reads its pipeline with a plain iterator (input
  options PER_REPLICA without fetching to device: TF's path that skips the per-device
  pipelines), which for one device per worker is the same data in the same order.

Several devices per worker (MirroredStrategy on several GPUs or logical CPUs) keep TF's
per-device pipelines: splitting one pipeline between devices needs them.
"""

import tensorflow as tf


def without_model_thread(dataset):
    """`dataset` with tf.data's autotuning model off, unless its options set autotuning."""
    if not isinstance(dataset, tf.data.Dataset) or dataset.options().autotune.enabled is not None:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def plain_iterators(strategy, distributed, options):
    """`distributed` (TF's distributed dataset, not yet iterated) reading each worker's
    pipeline with a plain iterator, when this worker has one CPU device and the caller
    gave no input options; else as it is.

    TF takes that path for input options PER_REPLICA without fetching to device, which
    its `experimental_distribute_dataset` (and OneDeviceStrategy) refuse only because the
    mode is meant for functions called per replica. With one device per worker the
    worker's sharded, rebatched pipeline is the replica's, so only the iterators, which
    TF makes from these options when iterated, change.
    """
    if options is not None or getattr(distributed, "_options", False) is not None:
        return distributed  # the caller's options, or not a TF distributed dataset
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: no distributed dataset
        return distributed
    if len(devices) != 1 or tf.DeviceSpec.from_string(devices[0]).device_type != "CPU":
        return distributed  # several devices need TF's split; a GPU's input is prefetched
    distributed._options = tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
    return distributed


def checks_partial_batches(iterator):
    """Whether TF's distributed `iterator` checks every batch for a partial last one, with
    a collective over every worker at each step (a finite dataset in a multi-worker job,
    or one without static shapes; never an infinite one)."""
    return bool(getattr(iterator, "_enable_get_next_as_optional", False))


class StallFreeInput:
    """Strategy mixin: datasets distributed without iterators that pause when deleted."""

    def experimental_distribute_dataset(self, dataset, options=None):
        distributed = super().experimental_distribute_dataset(without_model_thread(dataset),
                                                              options)
        return plain_iterators(self, distributed, options)

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        def fn(context):
            return without_model_thread(dataset_fn(context))

        distributed = super().distribute_datasets_from_function(fn, options)
        return plain_iterators(self, distributed, options)
