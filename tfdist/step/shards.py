"""Sharded training state — ZeRO stages 1 and 2 (Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models"): the collectives and the layout.

A bucket of tensors is laid out as one flat float32 vector, zero-padded to a multiple of
the N replicas (`Layout`), and cut in N contiguous shards. A reduce-scatter leaves each
replica the sum over every replica of its own shard; an all-gather puts the N shards back
together on every replica. The two move what one all-reduce moves — each replica sends
(N−1)/N of the bucket in each — so a replica can keep the optimizer state (and, at stage 2,
the reduced gradient) of its shard only.

Where the collectives run (`shards_for`):

- `LocalShards`: the replicas of one process (`mirrored`, or a multi-worker strategy of
  one worker): the strategy's own all-reduce, sliced, and all-gather — memory copies;
  TensorFlow runs no collective group of tfdist's own between local devices outside a
  multi-worker job. Shard i is replica i's.
- `GroupShards`: every replica of a multi-worker job as one collective group of tfdist's
  own. On a GPU, NCCL's reduce-scatter (``communication_hint="nccl"``); on a CPU, where
  TensorFlow has no reduce-scatter ("CollectiveRegistry::Lookup did not find collective
  implementation"), an all-to-all of the N chunks and a local sum. Shard r is the one of
  the replica at rank r of the group, which the group's own all-gather puts back in order.
"""

import collections
import itertools
import threading

import tensorflow as tf

#: The shard groups' keys: above a strategy's own device groups, below the islands'
#: (50,000, `tfdist.local_sgd.islands`) and Horovod's (90,000) in the strategy's range
#: (`tfdist.strategies.collective_keys`).
GROUP_KEY_OFFSET = 40_000
_instances = collections.defaultdict(itertools.count)  # (group key, device) -> next key
_lock = threading.Lock()


class Layout:
    """Tensors of `shapes` as one flat float32 vector zero-padded to a multiple of
    `replicas`, cut in `replicas` shards of `shard` values each.

    Raises:
        ValueError: a shape that is not fully known, or fewer than one replica.
    """

    def __init__(self, shapes, replicas):
        shapes = [tf.TensorShape(s) for s in shapes]
        unknown = [s for s in shapes if not s.is_fully_defined()]
        if unknown or replicas < 1:
            raise ValueError(f"a shard layout needs known shapes and at least one replica. "
                             f"Received: shapes {unknown or shapes}, replicas={replicas}")
        self.shapes, self.replicas = shapes, int(replicas)
        self.sizes = [s.num_elements() for s in shapes]
        total = sum(self.sizes)
        self.shard = -(-total // self.replicas)
        self.padded = self.shard * self.replicas
        self.padding = self.padded - total

    def flatten(self, tensors):
        """`tensors` (of the layout's shapes) as one float32 vector of `padded` values."""
        flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors]
                         + [tf.zeros([self.padding], tf.float32)], axis=0)
        return tf.ensure_shape(flat, [self.padded])

    def unflatten(self, flat):
        """The float32 tensors of the layout's shapes in `flat` (padding dropped)."""
        pieces = tf.split(flat[:self.padded - self.padding], self.sizes)
        return [tf.reshape(p, s) for p, s in zip(pieces, self.shapes)]

    def shard_of(self, flat, rank):
        """The shard of `flat` at `rank` (a Python or tensor integer)."""
        return tf.slice(flat, [rank * self.shard], [self.shard])


class LocalShards:
    """The shard collectives of the replicas of one process (see the module)."""

    def rank(self, context):
        """(replica context) The shard this replica owns."""
        return context.replica_id_in_sync_group

    def reduce_scatter(self, context, chunks):
        """(replica context) Row `rank` of the sum over replicas of `chunks` [N, shard]."""
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM, chunks)
        return tf.gather(summed, self.rank(context))

    def all_gather(self, context, shard):
        """(replica context) Every replica's `shard`, in rank order, concatenated."""
        return context.all_gather(shard, axis=0)


class GroupShards:
    """The shard collectives of every replica of a multi-worker job, as one collective
    group of tfdist's own (see the module).

    Args:
        key: the group's key, alike on every worker (`shards_for`).
        size: the replicas in the group.
    """

    def __init__(self, key, size):
        self.key, self.size = key, size

    def rank(self, context):
        """(replica context) This replica's rank in the group: the shard it owns."""
        ids = self._collective(tf.raw_ops.CollectiveGatherV2, tf.reshape(
            tf.cast(context.replica_id_in_sync_group, tf.float32), [1]))
        return tf.argmax(tf.cast(tf.equal(ids, tf.cast(
            context.replica_id_in_sync_group, tf.float32)), tf.int32), output_type=tf.int32)

    def reduce_scatter(self, context, chunks):
        """(replica context) The sum over the group of row `rank` of `chunks` [N, shard]."""
        if "GPU" in chunks.device.upper():
            return self._collective(tf.raw_ops.CollectiveReduceScatterV2,
                                    tf.reshape(chunks, [-1]), hint="nccl", merge_op="Add",
                                    final_op="Id")
        return tf.reduce_sum(self._collective(tf.raw_ops.CollectiveAllToAllV2, chunks), axis=0)

    def all_gather(self, context, shard):
        """(replica context) Every replica's `shard`, in rank order, concatenated."""
        return self._collective(tf.raw_ops.CollectiveGatherV2, shard)

    def _collective(self, op, value, hint="auto", **options):
        with _lock:  # every replica traces the same calls: the same keys everywhere
            instance = 1 + next(_instances[self.key, value.device])
        return op(input=value, group_size=self.size, group_key=self.key,
                  instance_key=instance, ordering_token=[], communication_hint=hint,
                  timeout_seconds=0, **options)


def shards_for(strategy):
    """`GroupShards` for the replicas of a multi-worker strategy of more than one worker,
    else `LocalShards`."""
    resolver = getattr(strategy, "cluster_resolver", None)
    spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if len(spec.get("chief", [])) + len(spec.get("worker", [])) < 2:
        return LocalShards()
    return GroupShards(getattr(strategy, "_collective_key_base", 0) + GROUP_KEY_OFFSET,
                       strategy.num_replicas_in_sync)
