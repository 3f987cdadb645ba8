"""Horovod's tensor collectives (`horovod.tensorflow.mpi_ops`): `allreduce`, `allgather`,
`broadcast`, `broadcast_variables`, on the workers' group (`tfdist.horovod.collectives`).
In a job of one they return their input, as Horovod's do."""

import contextlib
import math
import numbers

import tensorflow as tf

from tfdist import limits
from tfdist.errors import UnsupportedError, one_line, shown
from tfdist.horovod import basics, process_sets
from tfdist.horovod.agreement import REDUCTIONS, group_signature
from tfdist.step import transaction

Average, Sum, Min, Max, Product, Adasum = "Average", "Sum", "Min", "Max", "Product", "Adasum"
OPS = (Average, Sum, Min, Max, Product)
#: What each collective moves: TensorFlow's CPU collectives' dtypes, and those that cross
#: as a wider one (`tfdist.horovod.collectives.WIRE`).
REDUCIBLE = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64, tf.int8,
             tf.uint8, tf.int16, tf.uint16)
MOVABLE = REDUCIBLE + (tf.bool,)
MAX_NAME = 1000


def check_process_set(process_set):
    """Refuses, in one line, a process set other than every worker's (tfdist.horovod
    runs each collective over the whole job)."""
    if process_set is not None and process_set is not process_sets.global_process_set:
        raise ValueError(f"{process_sets.INSTEAD}. Received: process_set={shown(process_set)}")


def reduce_op(average=None, op=None):
    """Horovod's op from its two ways of saying it (`average` is the deprecated one)."""
    if average is not None and op is not None:
        raise ValueError("allreduce takes average or op, not both (average is Horovod's "
                         f"deprecated form of op). Received: average={average!r}, op={op!r}")
    op = (Average if average or average is None else Sum) if op is None else op
    if op == Adasum:
        raise ValueError("tfdist.horovod has no Adasum; use op=hvd.Average (or tfdist's "
                         "compression and local SGD for fewer bytes). Received: op=hvd.Adasum")
    if op not in OPS:
        raise ValueError(f"op must be one of hvd.{', hvd.'.join(OPS)}. Received: op={op!r}")
    return op


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None,
              op=None, prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=None, ignore_name_scope=False):
    """`tensor` reduced over every worker (Horovod's `allreduce`); an `IndexedSlices` is
    gathered (its rows and indices), averaged by dividing its values, as Horovod does.

    Raises:
        ValueError: a reduction, dtype, scale factor, name or process set not taken here.
        MismatchError: (every worker) another worker called another collective.
    """
    op = reduce_op(average, op)
    check_process_set(process_set)
    name = _checked_name(name)
    group = basics.group()
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (Average, Sum):
            raise ValueError(f"an IndexedSlices is summed or averaged, not {op}. "
                             f"Received: op={op!r}")
        values = _scaled(tensor.values, prescale_factor, "prescale_factor")
        indices = tensor.indices
        if group is not None:
            values, indices = group.gather(values, name), group.gather(indices, name)
            if op == Average:
                values = values / tf.cast(group.size, values.dtype)
        return tf.IndexedSlices(_scaled(values, postscale_factor, "postscale_factor"),
                                indices, tensor.dense_shape)
    tensor = _checked_tensor(tensor, "allreduce", REDUCIBLE)
    tensor = _scaled(tensor, prescale_factor, "prescale_factor")
    reduced = tensor if group is None else group.reduce(tensor, op, name)
    return _scaled(reduced, postscale_factor, "postscale_factor")


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=None):
    """Each of `tensors` reduced over every worker (Horovod's `grouped_allreduce`), the
    list agreed by the workers once."""
    op = reduce_op(average, op)
    tensors = [t if isinstance(t, tf.IndexedSlices) else tf.convert_to_tensor(t)
               for t in tensors]
    group = basics.group()
    row = None if group is None else group_signature("grouped_allreduce", tensors,
                                                     REDUCTIONS.index(op))
    with group.covered(row) if group is not None else contextlib.nullcontext():
        return [allreduce(t, op=op, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, process_set=process_set)
                for t in tensors]


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Every worker's `tensor` concatenated along axis 0 in rank order (first dimensions
    may differ, and be 0); a scalar is refused, as Horovod refuses it."""
    check_process_set(process_set)
    name = _checked_name(name)
    tensor = _checked_tensor(tensor, "allgather", MOVABLE)
    if tensor.shape.rank == 0:
        raise ValueError("allgather concatenates along the first dimension and a scalar has "
                         "none (Horovod refuses it too): gather tf.reshape(x, [1]). "
                         f"Received: a scalar {tensor.dtype.name} tensor")
    group = basics.group()
    return tensor if group is None else group.gather(tensor, name)


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """`root_rank`'s `tensor` on every worker."""
    root_rank = check_root(root_rank)
    check_process_set(process_set)
    name = _checked_name(name)
    tensor = _checked_tensor(tensor, "broadcast", MOVABLE)
    group = basics.group()
    return tensor if group is None else group.broadcast(tensor, root_rank, name)


def broadcast_variables(variables, root_rank, process_set=None, inplace=False):
    """Assigns `root_rank`'s value of each variable to every worker's."""
    root_rank = check_root(root_rank)
    check_process_set(process_set)
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
    (`tfdist.step.transaction`): each process is a replica of its own, so the step's own
    decision would take this worker's flags alone."""
    decision = transaction.current()
    if decision is not None and basics.group() is not None:
        decision.settle_across(grouped_allreduce(decision.riders(), op="Sum"))


def check_root(root_rank):
    """`root_rank` as an int: any integral number (NumPy's too) that is a rank of the job
    (before `init`, any integral number of 0 or more: the job's size is not known yet).

    Raises:
        ValueError: not an integral number, or not a rank of this job.
    """
    size = basics.size() if basics.is_initialized() else limits.INT64_MAX
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral) \
            or not 0 <= int(root_rank) < size:
        ranks = f"0 to {size - 1}" if size < limits.INT64_MAX else "0 or more"
        raise ValueError(f"root_rank must be a rank of this job, {ranks}. Received: "
                         f"root_rank={shown(root_rank)}")
    return int(root_rank)


def _checked_name(name):
    """The collective's name (agreed by the workers with the rest of the call): None or a
    string of at most `MAX_NAME` characters."""
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME):
        raise ValueError(f"name must be a string of at most {MAX_NAME} characters, or None. "
                         f"Received: name={shown(name)}")
    return name or None


def _checked_tensor(tensor, call, dtypes):
    """`tensor` as a tensor of one of `dtypes`, or a one-line refusal."""
    try:
        tensor = tf.convert_to_tensor(tensor)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{call} takes a tensor ({one_line(error)[:120]}). Received: "
                         f"{shown(tensor)}") from None
    if tensor.dtype not in dtypes:
        raise ValueError(f"{call} takes tensors of {', '.join(d.name for d in dtypes)}. "
                         f"Received: a {tensor.dtype.name} tensor")
    return tensor


def _scaled(tensor, factor, what):
    """`tensor` times `factor`, a finite real number that the tensor's dtype holds (a
    whole number for an integer tensor); 1 leaves it as it is."""
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real) \
            or not math.isfinite(_as_float(factor)):
        raise ValueError(f"{what} must be a finite real number. Received: "
                         f"{what}={shown(factor)}")
    if factor == 1:
        return tensor
    dtype = tensor.dtype
    if (dtype.is_integer and factor != int(factor)) or not dtype.min <= factor <= dtype.max:
        raise ValueError(f"{what} must be a {'whole ' if dtype.is_integer else ''}number "
                         f"within {dtype.name}'s range ({dtype.min:g} to {dtype.max:g}), the "
                         f"tensor's dtype. Received: {what}={shown(factor)}")
    return tensor * tf.constant(int(factor) if dtype.is_integer else float(factor), dtype)


def _as_float(value):
    try:
        return float(value)
    except OverflowError:
        return math.inf


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
        return grouped_allreduce(values, op=op)

    def all_gather(self, value, axis=0):
        """Every worker's `value` concatenated along axis 0, in rank order."""
        if axis != 0:
            raise ValueError(f"the workers gather along axis 0. Received: axis={axis}")
        return allgather(value)
