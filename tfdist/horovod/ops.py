"""Horovod's tensor collectives (`horovod.tensorflow.mpi_ops`): `allreduce`, `allgather`,
`broadcast`, `broadcast_variables`, on the workers' group (`tfdist.horovod.collectives`).
In a job of one they return their input, as Horovod's do."""

import tensorflow as tf

from tfdist.core import transaction
from tfdist.errors import UnsupportedError
from tfdist.horovod import basics

Average, Sum, Min, Max, Product, Adasum = "Average", "Sum", "Min", "Max", "Product", "Adasum"
OPS = (Average, Sum, Min, Max, Product)


def reduce_op(average=None, op=None):
    """Horovod's op from its two ways of saying it (`average` is the deprecated one)."""
    if average is not None and op is not None:
        raise ValueError("allreduce takes average or op, not both (average is Horovod's "
                         f"deprecated form of op). Received: average={average!r}, op={op!r}")
    op = (Average if average or average is None else Sum) if op is None else op
    if op == Adasum:
        raise ValueError("tfdist.horovod has no Adasum; use op=hvd.Average (or tfdist's "
                         "compression and local SGD for fewer bytes)")
    if op not in OPS:
        raise ValueError(f"op must be one of hvd.{', hvd.'.join(OPS)}. Received: op={op!r}")
    return op


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None,
              op=None, prescale_factor=1.0, postscale_factor=1.0, name=None):
    """`tensor` reduced over every worker (Horovod's `allreduce`); an `IndexedSlices` is
    gathered (its rows and indices), averaged by dividing its values, as Horovod does."""
    op = reduce_op(average, op)
    group = basics.group()
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (Average, Sum):
            raise ValueError(f"an IndexedSlices is summed or averaged, not {op}")
        values, indices = tensor.values * prescale_factor, tensor.indices
        if group is not None:
            values, indices = group.gather(values), group.gather(indices)
            if op == Average:
                values = values / tf.cast(group.size, values.dtype)
        return tf.IndexedSlices(values * postscale_factor, indices, tensor.dense_shape)
    tensor = tf.convert_to_tensor(tensor)
    if prescale_factor != 1.0:
        tensor = tensor * tf.cast(prescale_factor, tensor.dtype)
    reduced = tensor if group is None else group.reduce(tensor, op)
    if postscale_factor != 1.0:
        reduced = reduced * tf.cast(postscale_factor, reduced.dtype)
    return reduced


def allgather(tensor, name=None):
    """Every worker's `tensor` concatenated along axis 0 in rank order (first dimensions
    may differ)."""
    tensor = tf.convert_to_tensor(tensor)
    group = basics.group()
    return tensor if group is None else group.gather(tensor)


def broadcast(tensor, root_rank, name=None):
    """`root_rank`'s `tensor` on every worker."""
    _check_root(root_rank)
    tensor = tf.convert_to_tensor(tensor)
    group = basics.group()
    return tensor if group is None else group.broadcast(tensor, root_rank)


def broadcast_variables(variables, root_rank):
    """Assigns `root_rank`'s value of each variable to every worker's."""
    _check_root(root_rank)
    for variable in variables:
        variable.assign(broadcast(tf.convert_to_tensor(variable), root_rank))


def check_one_replica(strategy):
    """Refuses a strategy of several replicas: Horovod's exchange is over processes, each
    one replica (a MirroredStrategy's replicas would never be averaged)."""
    if strategy.num_replicas_in_sync > 1:
        raise UnsupportedError(
            "hvd.DistributedOptimizer averages over Horovod's workers, each process one "
            "replica: build and compile the model outside any strategy scope, as Horovod "
            "scripts do (or, under a strategy, use tfdist.keras.DistributedOptimizer). "
            f"Received: {type(strategy).__name__} of {strategy.num_replicas_in_sync} replicas")


def settle_over_workers():
    """(in a step) The step's verdict and preemption flag summed over every worker
    (`tfdist.core.transaction`): each process is a replica of its own, so the step's own
    decision would take this worker's flags alone."""
    decision = transaction.current()
    if decision is not None and basics.group() is not None:
        decision.settle_across([allreduce(r, op="Sum") for r in decision.riders()])


def _check_root(root_rank):
    size = basics.size()
    if type(root_rank) is not int or not 0 <= root_rank < size:
        raise ValueError(f"root_rank must be a rank of this job, 0 to {size - 1}. Received: "
                         f"root_rank={root_rank!r}")


class WorkersContext:
    """The job's workers as the replica context a tfdist compressor exchanges in
    (`tfdist.compression.Communicator`): one replica per worker, its collectives
    Horovod's, so top-k, PowerSGD, int8, ... cross between Horovod's processes."""

    def __init__(self, group):
        self.group = group
        self.num_replicas_in_sync, self.replica_id_in_sync_group = group.size, group.rank

    def all_reduce(self, reduce_op, values):
        """Each of `values` summed (averaged: MEAN) over the workers; an `IndexedSlices`
        gathered."""
        op = Average if reduce_op == tf.distribute.ReduceOp.MEAN else Sum
        return [allreduce(value, op=op) for value in values]

    def all_gather(self, value, axis=0):
        """Every worker's `value` concatenated along axis 0, in rank order."""
        if axis != 0:
            raise ValueError(f"the workers gather along axis 0. Received: axis={axis}")
        return self.group.gather(value)
