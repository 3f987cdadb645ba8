"""What one training step exchanges under local SGD (the hook's `exchange`): nothing
between replicas on their own, an island's sum for islands, and during the warm-up a
hierarchical all-reduce across islands of equal size."""

import tensorflow as tf

from tfdist.step import gradients, transaction, wire


def local_exchange(grads, islands=None, agreement=None):
    """(replica context) A local step's gradients: this replica's own mean (an embedding's
    rows kept), or its island's mean (`IslandReduce.sum`), the step's verdict riding the
    island's sum when the island decides alone (`agreement.decides_alone`)."""
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    if islands is None:
        return [gradients.scaled(g, replicas) for g in grads]
    grads = [tf.convert_to_tensor(g) for g in grads]  # an island sums dense tensors
    decision = transaction.current()
    riders = []
    if agreement.decides_alone and decision is not None and not decision.settled:
        riders = [decision.local]
    summed = islands.sum(grads + riders)
    if riders:
        decision.settle_within(summed[-1], agreement.defer_refusal)
    scale = replicas / islands.replica_island_size()
    return [g * tf.cast(scale, g.dtype) for g in summed[:len(grads)]]


def warmup_across_islands(grads, step, islands, exchange=None):
    """(replica context) A synchronous step between islands of equal size, hierarchically:
    the gradients (and the step's verdict) summed inside each island, each replica's share
    of its island's sum exchanged between islands (`exchange`, a compression hook, if
    any), the shares put back together inside the island."""
    grads = [tf.convert_to_tensor(g) for g in grads]
    decision = transaction.current()
    riders = decision.riders() if decision is not None and not decision.settled else []
    summed = islands.sum(grads + riders)
    if riders:  # one replica of each island adds its island's count: every replica's
        decision.settle(wire.all_reduce(islands.across, tf.distribute.ReduceOp.SUM,
                                        summed[len(grads):]))
    shard = islands.shard(summed[:len(grads)], times=1)
    if exchange is None:
        total = wire.all_reduce(islands.across, tf.distribute.ReduceOp.SUM, [shard])
    else:
        total = exchange.exchange_dense([shard], step, context=islands.across)
    return islands.assemble(total[0], grads)
