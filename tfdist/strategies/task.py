"""Which task this process is: chief or not, from the strategy's cluster resolver."""

import tensorflow as tf


def task_of(strategy=None):
    """(task_type, task_id) of this process; (None, None) outside a cluster."""
    strategy = strategy or tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return None, None
    return resolver.task_type, resolver.task_id


def is_chief(strategy=None):
    """True for the task that owns checkpoints and outputs.

    That is the ``chief`` task; without one, ``worker:0``; outside a cluster, this
    process. Under ParameterServerStrategy the coordinator (``chief``) is the chief.
    """
    strategy = strategy or tf.distribute.get_strategy()
    task_type, task_id = task_of(strategy)
    if task_type is None:
        return True
    if task_type == "chief":
        return True
    has_chief = "chief" in strategy.cluster_resolver.cluster_spec().as_dict()
    return task_type == "worker" and task_id == 0 and not has_chief
