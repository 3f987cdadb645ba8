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


#: (no apostrophe: TensorFlow's assertion escapes one)
OUT_OF_STEP = (
    "Horovod collectives out of step: a refused call inside a tf.function drew unlike "
    "collectives on the workers, and the collectives of this traced function were drawn "
    "while they were apart; trace it again (a new tf.function) after one eager "
    "collective, which brings the workers back in step")


class MismatchError(ValueError):
    """The workers called unlike collectives (every worker raises the same one line)."""


class WorkerGroup:
    """Every worker of a multi-worker job, one CPU device each, as one collective group."""

    def __init__(self, strategy, rank, size):
        self.strategy, self.rank, self.size = strategy, rank, size
        self.key = strategy._collective_key_base + GROUP_KEY_OFFSET
        self.agreement_key = self.key + 1  # the agreements' own group: one key per call
        resolver = strategy.cluster_resolver
        self.device = (f"/job:{resolver.task_type}/replica:0/task:{resolver.task_id}"
                       "/device:CPU:0")
        self._drawn, self._agreements, self._lock = 0, 0, threading.Lock()
        self._covered = threading.local()

    def _instance(self, agreement=False):
        """The next instance key: of the agreements' group (one per agreed call, alike on
        every worker as long as they make as many calls), else of the data's."""
        with self._lock:
            if agreement:
                self._agreements += 1
                return self._agreements
            self._drawn += 1
            return self._drawn

    def _resume_after(self, drawn):
        """Data keys from `drawn` + 1 on (the most any worker has drawn)."""
        with self._lock:
            self._drawn = max(self._drawn, drawn)

    def agree(self, row):
        """Gathers every worker's signature `row` (`agreement.signature`), with the data
        keys it has drawn, in the agreements' own group, and refuses unlike ones: eagerly a
        `MismatchError`, in a `tf.function` an assertion with the same line. Unlike traced
        calls draw unlike keys: an eager agreement brings every worker's next data key to
        the furthest one's, and a function traced while they were apart is refused
        (`OUT_OF_STEP`).

        Returns:
            The ops the collective must wait for (none, eagerly).
        """
        with tf.device(self.device):
            mine = tf.concat([row, tf.constant([self._drawn], tf.int64)], 0)
            table = tf.reshape(self._gather(mine, agreement=True),
                               [self.size, agreement.WIDTH + 1])
            rows, drawn = table[:, :-1], table[:, -1]
            if tf.executing_eagerly():
                self._resume_after(int(drawn.numpy().max()))
                values = rows.numpy()
                if (values != values[:1]).any():
                    other = int((values != values[:1]).any(axis=1).argmax())
                    raise MismatchError(agreement.message(rows, other).numpy().decode())
                return []
            differ, other = agreement.mismatch(rows)
            text = tf.cond(differ, lambda: agreement.message(rows, other),
                           lambda: tf.constant(""))
            apart = tf.reduce_any(tf.not_equal(drawn, drawn[0]))
            return [tf.debugging.Assert(tf.logical_not(differ), [text]),
                    tf.debugging.Assert(tf.logical_not(apart), [OUT_OF_STEP])]

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

    def _gather(self, tensor, agreement=False):
        with tf.device(self.device):
            return tf.raw_ops.CollectiveGatherV2(
                input=tensor, group_size=self.size,
                group_key=self.agreement_key if agreement else self.key,
                instance_key=self._instance(agreement), ordering_token=[],
                communication_hint="auto", timeout_seconds=0)

    def broadcast(self, tensor, root_rank, name=None):
        """`root_rank`'s `tensor` on every worker (a sum with zeros elsewhere: exact)."""
        with self._agreed("broadcast", tensor, root_rank, name):
            mine = tensor if self.rank == root_rank else tf.zeros_like(tensor)
            wire = WIRE.get(tensor.dtype, tensor.dtype)
            return tf.cast(self._reduce(tf.cast(mine, wire), "Sum"), tensor.dtype)
