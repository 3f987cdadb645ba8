"""Islands: groups of well-connected workers that train synchronously among themselves
while the DiLoCo family runs between the groups.

DiLoCo (Douillard et al. 2023) exists for islands of accelerators joined by slow links;
DiLoCo's experiments and torchft (issue #171) treat each island as one DiLoCo worker made
of several data-parallel replicas. Inside an island the gradients are summed every step
over its replicas only — a sub-group collective on TensorFlow's own collective runtime
(`tf.raw_ops.CollectiveReduceV2` with a group of its own per island, no second
transport); between islands the model synchronises every `period` steps as before. The
outer average over every replica then weighs each island by its replicas, i.e. by the
samples it trained on.

Islands group *workers* (the tasks of a multi-worker job; a worker's local replicas stay
together); on one machine with several replicas they group the replicas. They are given
as a count (that many equal groups of consecutive workers), ``"host"`` (the workers on
one host) or explicit lists of worker indices (chief first, then the workers, as
MultiWorkerMirroredStrategy numbers them).

In an elastic job (`tfdist launch --min-workers`) they are given for the whole cluster;
at each size the launcher names the places its tasks hold (`tfdist.resize_signal`), and
`present_islands` finds them: an island that lost a worker goes on smaller, one that lost
all is left out until its places come back, and the others train and synchronise among
themselves.
"""

import collections
import itertools
import threading

import tensorflow as tf

from tfdist import resize_signal
from tfdist.errors import UnsupportedError
from tfdist.step import wire

#: Island group keys sit in the upper half of a strategy's collective key range
#: (`tfdist.strategies.collective_keys`), clear of the strategy's own device groups.
GROUP_KEY_OFFSET = 50_000
from tfdist.limits import MAX_ISLANDS  # noqa: E402  (one group key each, per plan)
_builds = itertools.count()  # one block of group keys per island plan in this process
_lock = threading.Lock()


def island_groups(spec, units, hosts=None):
    """The islands as sorted lists of unit indices (workers, or replicas on one machine).

    Args:
        spec: None (every unit its own island), a count, "host", or lists of indices.
        units: how many units there are.
        hosts: each unit's host name (for "host").

    Raises:
        UnsupportedError: a count that does not divide the units, lists that are not a
            partition of them.
    """
    if spec is None:
        return [[u] for u in range(units)]
    if isinstance(spec, int):
        if spec < 1 or units % spec:
            raise UnsupportedError(f"islands: {spec} equal islands need a number of workers "
                                   f"divisible by {spec}; this job has {units}. Received: "
                                   f"islands={spec}")
        size = units // spec
        return [list(range(i * size, (i + 1) * size)) for i in range(spec)]
    if spec == "host":
        by_host = collections.defaultdict(list)
        for unit, host in enumerate(hosts or ["localhost"] * units):
            by_host[host].append(unit)
        return list(by_host.values())
    groups = [sorted(group) for group in spec]
    if sorted(u for group in groups for u in group) != list(range(units)):
        raise UnsupportedError(f"islands must list every worker index 0..{units - 1} exactly "
                               f"once (chief first, then the workers). Received: "
                               f"islands={[list(g) for g in spec]}")
    return groups


def present_islands(spec, units, hosts=None, environ=None):
    """(groups, kept, whole): `island_groups` of this job's `units` workers, for each its
    index among the islands of the whole cluster, and how many the whole cluster has. In a job the elastic launcher resized
    (`resize_signal.places`), the count or lists of `spec` are the whole cluster's: each
    island holds the workers here whose places it lists, and one with none here is left
    out; "host" groups the workers here by host as always.

    Raises:
        UnsupportedError: as `island_groups`, or the launcher's places not of this job.
    """
    try:
        found = (None if spec is None or spec == "host"
                 else resize_signal.places(units, environ))
    except ValueError as error:
        raise UnsupportedError(str(error)) from None
    if found is None:
        groups = island_groups(spec, units, hosts)
        return groups, list(range(len(groups))), len(groups)
    places, members = found
    here = {place: unit for unit, place in enumerate(places)}
    whole = [[here[p] for p in group if p in here] for group in island_groups(spec, members)]
    return ([group for group in whole if group],
            [index for index, group in enumerate(whole) if group], len(whole))


class IslandReduce:
    """Sums tensors over the replicas of each replica's island, in replica context.

    Args:
        strategy: the strategy whose replicas form the islands.
        spec: the `island_groups` spec.
    """

    def __init__(self, strategy, spec):
        workers, hosts = _workers(strategy)
        replicas = strategy.num_replicas_in_sync
        local = max(replicas // workers, 1)
        units = workers if workers > 1 else replicas
        #: The islands (lists of units), each one's index among the whole cluster's, and
        #: how many it has (`present_islands`: all, but in an elastic job resized smaller).
        self.groups, self.kept, self.whole = (
            present_islands(spec, units, hosts) if workers > 1
            else present_islands(spec, units, environ={}))
        if len(self.groups) > MAX_ISLANDS:
            raise UnsupportedError(f"at most {MAX_ISLANDS} islands (one collective group "
                                   f"each). Received: {len(self.groups)} islands")
        unit_of = [r // local if workers > 1 else r for r in range(replicas)]
        island_of_unit = {u: i for i, group in enumerate(self.groups) for u in group}
        island_of = [island_of_unit[unit_of[r]] for r in range(replicas)]
        sizes = [island_of.count(i) for i in range(len(self.groups))]
        with _lock:  # two blocks: the islands' groups, then the groups across them
            blocks = next(_builds), next(_builds)
        base = getattr(strategy, "_collective_key_base", 0) + GROUP_KEY_OFFSET
        self._island_of, self._sizes = island_of, sizes
        self.multi_worker = workers > 1
        #: The island of this worker (of a multi-worker job), else None.
        self.own = island_of_unit[_worker_index(strategy)] if workers > 1 else None
        self._keys = [base + MAX_ISLANDS * blocks[0] + i for i in range(len(self.groups))]
        self._place = [island_of[:r].count(island_of[r]) for r in range(replicas)]
        #: The replicas at the same place in every island, as a replica context
        #: (`CrossIslands`), when the exchange between islands can go hierarchically.
        self.across = (CrossIslands(self, [base + MAX_ISLANDS * blocks[1] + p
                                           for p in range(sizes[0])])
                       if self.multi_worker and len(set(sizes)) == 1
                       and 1 < sizes[0] <= MAX_ISLANDS and len(sizes) > 1 else None)
        self._instances = collections.defaultdict(itertools.count)  # per device: the same
        # sequence of collectives on every replica gives the same instance keys

    def sizes(self):
        """Replicas per island, by island."""
        return list(self._sizes)

    def replica_island_size(self):
        """(replica context) float32: the replicas of this replica's island."""
        island = self._island_tensor()
        return tf.cast(tf.gather(self._sizes, island), tf.float32)

    def sum(self, tensors):
        """(replica context) Each tensor summed over this replica's island (float32
        inside, each returned in its own dtype), as one collective."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if not tensors:
            return []
        context = tf.distribute.get_replica_context()
        wire.note_island(tensors, context)
        flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0)
        island = self._island_tensor()
        summed = (self._sub_group_sum(flat, island) if self.multi_worker
                  else self._local_sum(flat, island, context))
        pieces = tf.split(summed, [int(t.shape.num_elements()) for t in tensors])
        return [tf.cast(tf.reshape(p, t.shape), t.dtype) for p, t in zip(pieces, tensors)]

    def _sub_group_sum(self, flat, island):
        """The island's own collective: nothing crosses to another island."""
        return tf.raw_ops.CollectiveReduceV2(
            input=flat, group_size=tf.gather(self._sizes, island),
            group_key=tf.gather(self._keys, island), instance_key=self._instance(flat.device),
            ordering_token=[], merge_op="Add", final_op="Id", communication_hint="auto",
            timeout_seconds=0)

    def _local_sum(self, flat, island, context):
        """One machine's replicas (TensorFlow runs no sub-group collectives between local
        devices outside a multi-worker job): the strategy's all-reduce of each replica's
        contribution in its island's row — memory copies, no network."""
        rows = tf.one_hot(island, len(self._sizes), dtype=flat.dtype)[:, None] * flat[None]
        return tf.gather(context.all_reduce(tf.distribute.ReduceOp.SUM, rows), island)

    def shard(self, tensors, times=None):
        """(replica context) This replica's share of `tensors` (the same on every replica
        of its island): the slice at its place of their flat float32 concatenation (split
        in the island's size of equal parts, zero-padded), times `times` — by default the
        island's size: the island's contribution to a sum over every replica."""
        flat = self._flat(tensors)
        size = self._sizes[0]
        start = self._place_tensor() * (flat.shape[0] // size)
        shard = tf.slice(flat, [start], [flat.shape[0] // size])
        return shard * float(size if times is None else times)

    def assemble(self, shard, tensors):
        """(replica context) The island's shards put back together in `tensors`' shapes
        and dtypes (one sum inside the island: nothing crosses between islands)."""
        sizes = [int(t.shape.num_elements()) for t in tensors]
        whole = shard.shape[0] * self._sizes[0]
        before = self._place_tensor() * shard.shape[0]
        placed = tf.reshape(tf.pad(shard, [[before, whole - shard.shape[0] - before]]), [whole])
        pieces = tf.split(self.sum([placed])[0][:sum(sizes)], sizes)
        return [tf.cast(tf.reshape(p, t.shape), t.dtype) for p, t in zip(pieces, tensors)]

    def shard_size(self, shapes):
        """The values in one replica's `shard` of tensors of these shapes."""
        return -(-sum(tf.TensorShape(s).num_elements() for s in shapes) // self._sizes[0])

    def _flat(self, tensors):
        """The float32 concatenation of `tensors`, zero-padded to whole shards."""
        flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0)
        return tf.pad(flat, [[0, -flat.shape[0] % self._sizes[0]]])

    def _place_tensor(self):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.gather(self._place, replica)

    def _island_tensor(self):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.gather(self._island_of, replica)

    def _instance(self, device, kind="island"):
        """The next instance key on `device` for `kind` of group (the replica's; each
        replica traces the same sequence of collectives, so the keys agree across replicas
        and workers)."""
        with _lock:
            return 1 + next(self._instances[device, kind])


class CrossIslands:
    """The replicas at the same place in every island (islands of equal size), as the
    replica context a `Communicator` or `tfdist.step.wire` runs collectives in: one replica
    of each island. Every replica of an island holds the same model between two
    synchronisations, so the exchange between islands goes hierarchically (as in
    hierarchical all-reduce, e.g. Horovod's): each replica sends its island's change for
    its share of the model only — the islands' change crosses the slow links once, not
    once per replica — and the island puts the shares back together inside.
    """

    def __init__(self, islands, keys):
        self._islands, self._keys = islands, keys
        self.num_replicas_in_sync = len(islands.groups)

    @property
    def replica_id_in_sync_group(self):
        return self._islands._island_tensor()

    def all_reduce(self, reduce_op, values):
        """Each of `values` summed (or averaged) over one replica of every island."""
        final = "Div" if reduce_op == tf.distribute.ReduceOp.MEAN else "Id"
        return [self._collective(tf.raw_ops.CollectiveReduceV2, v, merge_op="Add",
                                 final_op=final) for v in values]

    def all_gather(self, value, axis=0):
        """`value` of one replica of every island, concatenated along `axis` (0 only)."""
        if axis != 0:
            raise ValueError(f"CrossIslands gathers along axis 0. Received: axis={axis}")
        return self._collective(tf.raw_ops.CollectiveGatherV2, value)

    def _collective(self, op, value, **options):
        place = self._islands._place_tensor()
        return op(input=value, group_size=self.num_replicas_in_sync,
                  group_key=tf.gather(self._keys, place),
                  instance_key=self._islands._instance(value.device, "across"),
                  ordering_token=[], communication_hint="auto", timeout_seconds=0, **options)


def exchanged_shapes(across, sizes):
    """The shapes weights of `sizes` values are exchanged in: one shard per replica between
    islands (`IslandReduce.shard`; `across`), else the weights' own (None)."""
    return None if across is None else [(across.shard_size([(n,) for n in sizes]),)]


def _worker_index(strategy):
    """This task's index among the workers, chief first (as `_workers` orders them)."""
    resolver = strategy.cluster_resolver
    spec = resolver.cluster_spec().as_dict()
    if resolver.task_type == "chief":
        return 0
    return len(spec.get("chief", [])) + int(resolver.task_id)


def _workers(strategy):
    """(workers, host of each) of a multi-worker strategy's job, in its task order
    (chief first); (1, None) otherwise."""
    resolver = getattr(strategy, "cluster_resolver", None)
    spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    addresses = list(spec.get("chief", [])) + list(spec.get("worker", []))
    if len(addresses) < 2:
        return 1, None
    return len(addresses), [a.rsplit(":", 1)[0] for a in addresses]
