"""Which task this process is: chief or not, from the strategy or TF_CONFIG."""

import tensorflow as tf

from tfdist.cluster.tf_config import read_tf_config


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


def barrier(strategy):
    """Waits until every worker of a MultiWorkerMirroredStrategy job reaches this call.

    Useful at the end of a script: workers that exit while the chief still writes its
    outputs make the chief's collective runtime report them as crashed. A no-op for
    other strategies (under ParameterServerStrategy only the coordinator runs scripts).
    """
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and _resolver(strategy):
        tf.function(lambda: strategy.reduce(
            "SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))()
