"""Horovod's collectives (`allreduce`, `allgather`, `broadcast`) on TensorFlow's own
collective ops, among the job's workers (one process each, as horovodrun runs them).

`init()` builds tfdist's MultiWorkerMirroredStrategy from TF_CONFIG: that starts the
task's server and configures TensorFlow's collective executor; the collectives here then
run `CollectiveReduceV2` / `CollectiveGatherV2` in a group of their own (one CPU device
per worker), eagerly or inside a `tf.function`, with instance keys drawn in program order
— every worker issues the same collectives in the same order, as Horovod requires.
"""

import itertools
import threading

import tensorflow as tf

#: Horovod's reduction ops (`hvd.Average`, `hvd.Sum`, ...): CollectiveReduceV2's merge op.
MERGE_OPS = {"Average": "Add", "Sum": "Add", "Min": "Min", "Max": "Max", "Product": "Mul"}
#: The group key of the workers' group, above a strategy's own device groups and islands'.
GROUP_KEY_OFFSET = 90_000


class WorkerGroup:
    """Every worker of a multi-worker job, one CPU device each, as one collective group."""

    def __init__(self, strategy, rank, size):
        self.strategy, self.rank, self.size = strategy, rank, size
        self.key = strategy._collective_key_base + GROUP_KEY_OFFSET
        resolver = strategy.cluster_resolver
        self.device = (f"/job:{resolver.task_type}/replica:0/task:{resolver.task_id}"
                       "/device:CPU:0")
        self._instances, self._lock = itertools.count(1), threading.Lock()

    def _instance(self):
        with self._lock:
            return next(self._instances)

    def reduce(self, tensor, op):
        """`tensor` reduced over the workers with Horovod's `op` (Average: the Sum / size)."""
        with tf.device(self.device):
            reduced = tf.raw_ops.CollectiveReduceV2(
                input=tensor, group_size=self.size, group_key=self.key,
                instance_key=self._instance(), ordering_token=[], merge_op=MERGE_OPS[op],
                final_op="Id", communication_hint="auto", timeout_seconds=0)
        return reduced / tf.cast(self.size, tensor.dtype) if op == "Average" else reduced

    def gather(self, tensor):
        """Every worker's `tensor` concatenated along axis 0, in rank order; their first
        dimensions may differ (each is padded to the largest, then cut back)."""
        rows = tf.shape(tensor, out_type=tf.int64)[:1]
        counts = self._gather(rows)
        longest = tf.reduce_max(counts)
        padding = [[0, longest - rows[0]]] + [[0, 0]] * (tensor.shape.rank - 1)
        gathered = self._gather(tf.pad(tensor, padding))
        blocks = tf.reshape(gathered, tf.concat([[self.size, longest], tf.shape(
            tensor, out_type=tf.int64)[1:]], 0))
        keep = tf.sequence_mask(counts, longest)
        return tf.boolean_mask(blocks, keep)

    def _gather(self, tensor):
        with tf.device(self.device):
            return tf.raw_ops.CollectiveGatherV2(
                input=tensor, group_size=self.size, group_key=self.key,
                instance_key=self._instance(), ordering_token=[], communication_hint="auto",
                timeout_seconds=0)

    def broadcast(self, tensor, root_rank):
        """`root_rank`'s `tensor` on every worker (a sum with zeros elsewhere: exact)."""
        mine = tensor if self.rank == root_rank else tf.zeros_like(tensor)
        if tensor.dtype == tf.bool:
            return tf.cast(self.reduce(tf.cast(mine, tf.int32), "Sum"), tf.bool)
        return self.reduce(mine, "Sum")
