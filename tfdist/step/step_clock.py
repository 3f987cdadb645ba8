"""Where each worker's step time goes: computing, in the exchange, waiting for the slowest.

Measured, not modelled (the anchors: PyTorch's Holistic Trace Analysis — compute,
communication and idle per rank; Horovod's timeline — which rank was late to each
all-reduce). In each step every worker stamps (`tf.timestamp`) when its gradients are
ready and when the step's collectives have returned. Worker w's collective time is
c_w = returned_w - ready_w. The worker that came last waited for no one, so min_w c_w is
what the link needed (the *exchange*) and c_w - min c is w's *wait* for the slowest; what
lies between one step's return and the next step's gradients is *computing* (the forward
and backward passes, the input, the host's work between steps). The three add up to the
step time between two returns. The first step of each epoch is not accounted (what came
before it, validation or an epoch's end, is not computing: `restart`), nor the last of a
run (no step carries it).

Step k's two figures (computing, collective) ride step k+1's first all-reduce — the one
carrying the step's verdict (`tfdist.step.transaction`): 2 float32 per worker, so every
worker holds every worker's totals without a collective of its own. Active under a
multi-worker mirrored strategy of more than one worker; not under Horovod, islands or
parameter servers (their verdicts are summed elsewhere), nor on one machine.
"""

import tensorflow as tf

from tfdist.strategies.task import task_of

#: The parts of a step, in the order `StepClock.totals` gives them.
PARTS = ("compute", "exchange", "wait")


class StepClock:
    """One optimizer's step-time totals per worker (seconds, float64), since it was built."""

    def __init__(self):
        self.workers = 0
        self._local = 1
        self._last = self._ended = self._totals = self._steps = None

    def build(self, strategy):
        """Creates its state under `strategy`'s scope, if it has several workers."""
        self.workers = num_workers(strategy)
        if self.workers < 2 or self._totals is not None:
            return
        self._local = len(strategy.extended.worker_devices)
        first = tf.VariableAggregation.ONLY_FIRST_REPLICA

        def state(value, name):
            return tf.Variable(value, trainable=False, name=f"tfdist_step_clock_{name}",
                               aggregation=first)

        self._last = state(tf.zeros([2 * self.workers]), "last")
        self._ended = state(tf.constant(0.0, tf.float64), "ended")
        self._totals = state(tf.zeros([len(PARTS), self.workers], tf.float64), "totals")
        self._steps = state(tf.constant(0, tf.int64), "steps")

    @property
    def active(self):
        return self._totals is not None

    def rider(self, context):
        """(replica context) What this replica adds to the step's first all-reduce: its
        worker's previous step (computing, collective) in its worker's slots, from the
        worker's first replica only; None when the clock is not active."""
        if not self.active or context is None or context.num_replicas_in_sync < 2:
            return None
        first = tf.equal(tf.math.floormod(context.replica_id_in_sync_group, self._local), 0)
        return tf.where(first, self._last.read_value(), tf.zeros_like(self._last))

    def stamp(self, tensors):
        """`tf.timestamp()` once `tensors` are computed (float64 seconds)."""
        with tf.control_dependencies([_values(t).op for t in tensors if t is not None]):
            return tf.timestamp()

    def account(self, distribution, ready, returned, summed):
        """(cross-replica, in the step's graph) Adds the previous step's figures of every
        worker (`summed`: the all-reduced riders, None if they were not summed over every
        worker) to the totals, and keeps this step's for the next step to carry. `ready`,
        `returned`: each local replica's stamps."""
        if not self.active or summed is None:
            return
        local = distribution.experimental_local_results
        ready = tf.reduce_max(tf.stack(local(ready)))  # the worker's last replica
        returned = tf.reduce_max(tf.stack(local(returned)))
        summed = tf.cast(local(summed)[0], tf.float64)  # the same on every replica
        compute, collective = summed[:self.workers], summed[self.workers:]
        link = tf.reduce_min(collective)
        carried = tf.reduce_sum(collective) > 0  # the first step carries zeros
        figures = tf.stack([compute, tf.fill([self.workers], link), collective - link])
        self._totals.assign_add(tf.where(carried, figures, tf.zeros_like(figures)))
        self._steps.assign_add(tf.cast(carried, tf.int64))
        worker = worker_index(distribution)
        mine = tf.one_hot(worker, self.workers, dtype=tf.float64)
        now = tf.concat([mine * (ready - self._ended), mine * (returned - ready)], 0)
        self._last.assign(tf.cast(tf.where(self._ended > 0, now, tf.zeros_like(now)),
                                  tf.float32))  # none after a `restart`: not carried
        self._ended.assign(returned)

    def restart(self):
        """(eager) The next step is not accounted: what lies before it (an epoch's end,
        validation, another `fit`) is not computing."""
        if self.active:
            self._ended.assign(tf.zeros_like(self._ended))

    def totals(self):
        """{"steps": steps accounted, part: [seconds per worker] for each of `PARTS`}
        (eager); None when the clock is not active."""
        if not self.active:
            return None
        totals = self._totals.numpy()
        return {"steps": int(self._steps.numpy()),
                **{part: [float(v) for v in totals[i]] for i, part in enumerate(PARTS)}}


def worker_index(strategy):
    """The index of this task among a multi-worker strategy's workers: the chief first (if
    the cluster has one), then the workers by id — the order of their replicas."""
    task_type, task_id = task_of(strategy)
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    return task_id if task_type == "chief" or "chief" not in spec else task_id + 1


def worker_hosts(strategy):
    """Each worker's host (from the cluster spec), in `worker_index` order."""
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    return [address.rsplit(":", 1)[0] for address in spec.get("chief", []) + spec.get("worker", [])]


def num_workers(strategy):
    """How many workers a multi-worker mirrored `strategy` has (1 for any other)."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 1
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, len(spec.get("chief", [])) + len(spec.get("worker", [])))


def _values(tensor):
    return tensor.values if isinstance(tensor, tf.IndexedSlices) else tensor
