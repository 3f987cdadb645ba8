"""Which task this process is: chief or not, from the strategy or TF_CONFIG."""

import collections
import functools

import tensorflow as tf
from tensorflow.python.eager import context  # the coordination-service barrier

from tfdist.cluster.tf_config import read_tf_config
from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.strategies.errors import BarrierTimeoutError


def _resolver(strategy):
    strategy = strategy or tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None and read_tf_config() is not None:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver is None or not resolver.cluster_spec().as_dict():
        return None
    return resolver


def task_of(strategy=None):
    """(task_type, task_id) of this process; (None, None) outside a cluster.

    Args:
        strategy: the strategy whose cluster to ask; by default the one in scope, or,
            outside any scope (e.g. in a callback), the cluster in TF_CONFIG.
    """
    resolver = _resolver(strategy)
    return (resolver.task_type, resolver.task_id) if resolver else (None, None)


def is_chief(strategy=None):
    """True for the task that owns checkpoints and outputs.

    That is the ``chief`` task; without one, ``worker:0``; outside a cluster, this
    process. Under ParameterServerStrategy the coordinator (``chief``) is the chief.
    """
    resolver = _resolver(strategy)
    if resolver is None or resolver.task_type in (None, "chief"):
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief


#: How long `barrier` waits for every worker by default: the chief's last writes of a
#: large model to slow storage included. A lost worker is the launcher's business (it
#: stops the job); this bound only keeps a worker from waiting for ever.
BARRIER_SECONDS = 1800
_BARRIERS = collections.Counter()  # barriers passed per strategy (their ids, alike everywhere)


_WRITES = collections.Counter()  # chief's writes announced per tag (their keys)


def chief_wrote(strategy, tag, timeout_seconds=BARRIER_SECONDS):
    """The end of a write on the chief that the other workers may read next (tfdist's
    ModelCheckpoint, TensorBoard and CSVLogger at the end of `fit`): the chief announces
    it, each other worker waits for that, at most `timeout_seconds`. Unlike `barrier`,
    the chief never waits: a callback given to the chief alone (Horovod's habit, `if
    rank == 0`) costs nothing. Through the coordination service's key-value store (one
    key per `tag` and call, counted alike on every worker with the callback); a no-op
    where `barrier` is one, or without a coordination service.

    Args:
        strategy: the strategy of the job.
        tag: what was written (its path on the chief), the same on every worker.
        timeout_seconds: how long a worker waits for the chief's write.

    Raises:
        BarrierTimeoutError: the chief did not announce the write in time (lost, hung, or
            not given the callback a worker has).
    """
    resolver = _resolver(strategy)
    if not _several_workers(strategy, resolver) or context.context().coordination_service \
            is None:
        return
    _WRITES[tag] += 1
    key = f"tfdist/written/{tag}/{_WRITES[tag]}"
    if is_chief(strategy):
        context.context().set_config_key_value(key, "done")
        return
    try:
        context.context().get_config_key_value(key, int(timeout_seconds * 1000))
    except tf.errors.DeadlineExceededError:
        raise BarrierTimeoutError(
            f"{resolver.task_type}:{resolver.task_id} waited {timeout_seconds:g} s for the "
            f"chief to finish writing {tag} (lost, hung, or the callback was given to this "
            "worker but not to the chief: give tfdist's callbacks to every worker, they "
            f"write on the chief only). Received: timeout_seconds={timeout_seconds:g}"
        ) from None


def _several_workers(strategy, resolver):
    """Whether this process is a chief or worker task of a MultiWorkerMirroredStrategy job
    of at least 2 of them."""
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and resolver is not None and resolver.task_type in ("chief", "worker")
            and sum(len(resolver.cluster_spec().as_dict().get(job, ()))
                    for job in ("chief", "worker")) >= 2)


def barrier(strategy, timeout_seconds=BARRIER_SECONDS):
    """Waits until every worker of a MultiWorkerMirroredStrategy job reaches this call, at
    most `timeout_seconds`.

    Used where the chief writes what every worker may read next (the end of `fit` with
    tfdist's ModelCheckpoint and BackupAndRestore) and at the end of a script: workers
    that exit while the chief still writes make its collective runtime report them as
    crashed. It is TensorFlow's coordination-service barrier (one id per call, counted
    alike on every worker, which runs the same script), else an all-reduce. A no-op for
    other strategies and for one worker (under ParameterServerStrategy only the
    coordinator runs scripts).

    Args:
        strategy: the strategy of the job.
        timeout_seconds: how long to wait for the slowest worker (> 0).

    Raises:
        tfdist.ConfigError: `timeout_seconds` is not a positive finite number.
        BarrierTimeoutError: a worker did not arrive within `timeout_seconds`.
    """
    timeout_seconds = check_arguments("tfdist.strategies.barrier", {
        "timeout_seconds": functools.partial(checks.number, minimum=0, open_minimum=True)},
        timeout_seconds=timeout_seconds)["timeout_seconds"]
    resolver = _resolver(strategy)
    if not _several_workers(strategy, resolver):
        return
    if context.context().coordination_service is None:
        tf.function(lambda: strategy.reduce(
            "SUM", strategy.run(lambda: tf.constant(1.0)), axis=None), autograph=False)()
        return
    _wait_at_barrier(strategy, resolver, timeout_seconds)


def _wait_at_barrier(strategy, resolver, timeout_seconds):
    """The coordination service's barrier of this call (its id counted per strategy)."""
    key = getattr(strategy, "_collective_key_base", id(strategy))
    _BARRIERS[key] += 1
    barrier_id = f"tfdist/barrier/{key}/{_BARRIERS[key]}"
    try:
        context.context().wait_at_barrier(barrier_id, int(timeout_seconds * 1000))
    except tf.errors.DeadlineExceededError:
        raise BarrierTimeoutError(
            f"{resolver.task_type}:{resolver.task_id} waited {timeout_seconds:g} s at a "
            "barrier for a worker that did not arrive (lost, or hung): check the other "
            "tasks' output; `tfdist launch` stops a job whose task died. Received: "
            f"timeout_seconds={timeout_seconds:g}") from None
