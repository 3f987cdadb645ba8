"""Horovod's collectives (`allreduce`, `allgather`, `broadcast`) on TensorFlow's own
collective ops, among the job's workers (one process each, as horovodrun runs them).

`init()` builds tfdist's MultiWorkerMirroredStrategy from TF_CONFIG: that starts the
task's server and configures TensorFlow's collective executor; the collectives here then
run `CollectiveReduceV2` / `CollectiveGatherV2` in a group of their own (one CPU device
per worker), eagerly or inside a `tf.function`, with instance keys drawn in program order
— every worker issues the same collectives in the same order, as Horovod requires. Each
call is agreed first (`tfdist.horovod.agreement`): unlike calls are refused on every
worker, never paired.
"""

import contextlib
import itertools
import threading

import tensorflow as tf

from tfdist.horovod import agreement

#: Horovod's reduction ops (`hvd.Average`, `hvd.Sum`, ...): CollectiveReduceV2's merge op.
MERGE_OPS = {"Average": "Add", "Sum": "Add", "Min": "Min", "Max": "Max", "Product": "Mul"}
#: The group key of the workers' group, above a strategy's own device groups and islands'.
GROUP_KEY_OFFSET = 90_000
#: Dtypes TensorFlow's CPU collectives lack, and the wider one each crosses as (exactly;
#: an integer sum wraps as in its own dtype once cast back).
WIRE = {tf.int8: tf.int32, tf.uint8: tf.int32, tf.int16: tf.int32, tf.uint16: tf.int32,
        tf.bool: tf.int32}
GATHER_WIRE = {**WIRE, tf.bfloat16: tf.float32}


class MismatchError(ValueError):
    """The workers called unlike collectives (every worker raises the same one line)."""


class WorkerGroup:
    """Every worker of a multi-worker job, one CPU device each, as one collective group."""

    def __init__(self, strategy, rank, size):
        self.strategy, self.rank, self.size = strategy, rank, size
        self.key = strategy._collective_key_base + GROUP_KEY_OFFSET
        resolver = strategy.cluster_resolver
        self.device = (f"/job:{resolver.task_type}/replica:0/task:{resolver.task_id}"
                       "/device:CPU:0")
        self._instances, self._lock = itertools.count(1), threading.Lock()
        self._covered = threading.local()

    def _instance(self):
        with self._lock:
            return next(self._instances)

    def agree(self, row):
        """Gathers every worker's signature `row` (`agreement.signature`) and refuses unlike
        ones: eagerly a `MismatchError`, in a `tf.function` an assertion with the same line.

        Returns:
            The ops the collective must wait for (none, eagerly).
        """
        with tf.device(self.device):
            rows = tf.reshape(self._gather(row), [self.size, agreement.WIDTH])
            if tf.executing_eagerly():
                values = rows.numpy()
                if (values != values[:1]).any():
                    other = int((values != values[:1]).any(axis=1).argmax())
                    raise MismatchError(agreement.message(rows, other).numpy().decode())
                return []
            differ, other = agreement.mismatch(rows)
            text = tf.cond(differ, lambda: agreement.message(rows, other),
                           lambda: tf.constant(""))
            return [tf.debugging.Assert(tf.logical_not(differ), [text])]

    @contextlib.contextmanager
    def covered(self, row):
        """One agreement (on `row`, a `group_signature`) for every collective inside."""
        if getattr(self._covered, "on", False):
            yield
            return
        waits = self.agree(row)
        self._covered.on = True
        try:
            with tf.control_dependencies(waits):
                yield
        finally:
            self._covered.on = False

    @contextlib.contextmanager
    def _agreed(self, kind, tensor, param=0, name=None, any_rows=False):
        """This call's agreement, unless a `covered` list's agreement holds it."""
        if getattr(self._covered, "on", False):
            yield
            return
        row = agreement.signature(kind, tensor, param, name, any_rows)
        with tf.control_dependencies(self.agree(row)):
            yield

    def reduce(self, tensor, op, name=None):
        """`tensor` reduced over the workers with Horovod's `op` (Average: the Sum / size)."""
        param = agreement.REDUCTIONS.index(op)
        with self._agreed("allreduce", tensor, param, name):
            wire = WIRE.get(tensor.dtype, tensor.dtype)
            return tf.cast(self._reduce(tf.cast(tensor, wire), op), tensor.dtype)

    def _reduce(self, tensor, op):
        """The reduction; a tensor of no elements (known after the agreement to be so on
        every worker) skips the collective, which would crash TensorFlow."""
        key = self._instance()  # drawn either way: the workers' keys stay in step

        def run():
            with tf.device(self.device):
                return tf.raw_ops.CollectiveReduceV2(
                    input=tensor, group_size=self.size, group_key=self.key,
                    instance_key=key, ordering_token=[], merge_op=MERGE_OPS[op],
                    final_op="Id", communication_hint="auto", timeout_seconds=0)

        if tensor.shape.is_fully_defined() and tensor.shape.num_elements() > 0:
            reduced = run()
        else:
            reduced = tf.cond(tf.size(tensor) > 0, run, lambda: tf.identity(tensor))
        return reduced / tf.cast(self.size, tensor.dtype) if op == "Average" else reduced

    def gather(self, tensor, name=None):
        """Every worker's `tensor` (rank 1 or more) concatenated along axis 0, in rank
        order; their first dimensions may differ, and may be 0."""
        with self._agreed("allgather", tensor, 0, name, any_rows=True):
            wire = GATHER_WIRE.get(tensor.dtype, tensor.dtype)
            return tf.cast(self._gather_rows(tf.cast(tensor, wire)), tensor.dtype)

    def _gather_rows(self, tensor):
        """Each worker's rows padded to the longest, flattened with one element more (a
        collective of no elements crashes TensorFlow), gathered, then cut back."""
        shape = tf.shape(tensor, out_type=tf.int64)
        counts = self._gather(shape[:1])
        longest = tf.reduce_max(counts)
        padding = [[0, longest - shape[0]]] + [[0, 0]] * (tensor.shape.rank - 1)
        flat = tf.reshape(tf.pad(tensor, padding), [-1])
        gathered = self._gather(tf.concat([flat, tf.zeros([1], tensor.dtype)], 0))
        blocks = tf.reshape(gathered, [self.size, -1])[:, :-1]
        blocks = tf.reshape(blocks, tf.concat([[self.size, longest], shape[1:]], 0))
        return tf.boolean_mask(blocks, tf.sequence_mask(counts, longest))

    def _gather(self, tensor):
        with tf.device(self.device):
            return tf.raw_ops.CollectiveGatherV2(
                input=tensor, group_size=self.size, group_key=self.key,
                instance_key=self._instance(), ordering_token=[], communication_hint="auto",
                timeout_seconds=0)

    def broadcast(self, tensor, root_rank, name=None):
        """`root_rank`'s `tensor` on every worker (a sum with zeros elsewhere: exact)."""
        with self._agreed("broadcast", tensor, root_rank, name):
            mine = tensor if self.rank == root_rank else tf.zeros_like(tensor)
            wire = WIRE.get(tensor.dtype, tensor.dtype)
            return tf.cast(self._reduce(tf.cast(mine, wire), "Sum"), tensor.dtype)
