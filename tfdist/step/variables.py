"""Variables as the step sees them: the tf.Variable inside a Keras 3 variable, the shards
a parameter server holds, and the state each replica keeps a copy of."""

import keras
import tensorflow as tf

from tfdist.step import wire
from tfdist.step.tracing import plain_function


def underlying(variable):
    """The tf.Variable (possibly distributed) behind a Keras 3 variable, or `variable`."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def trained_variables(model):
    """The variables gradients are taken for and the optimizer updates: the model's
    trainable variables, with a `ShardedVariable` (ParameterServerStrategy with
    `max_shards` / `min_shard_bytes`) replaced by its shards."""
    variables = []
    for variable in model.trainable_variables:
        value = underlying(variable)
        sharded = isinstance(value, tf.__internal__.distribute.ShardedVariable)
        variables.extend(value.variables if sharded else [variable])
    return variables


def per_replica_state(strategy, variables, distributed=True):
    """The variables whose replicas hold their own copies: non-trainable, floating point,
    aggregation NONE, mirrored on more than one replica (Keras 3 state such as
    BatchNormalization statistics under MirroredStrategy and MultiWorkerMirroredStrategy).
    `distributed=False`: each process is a replica (`tfdist.horovod`'s workers), so its
    plain variables are its own."""
    if distributed and strategy.num_replicas_in_sync < 2:
        return []
    chosen = []
    for variable in variables:
        value = underlying(variable)
        if (not getattr(value, "trainable", True) and value.dtype.is_floating
                and getattr(value, "aggregation", None) == tf.VariableAggregation.NONE
                and (isinstance(value, tf.distribute.DistributedValues) or not distributed)):
            chosen.append(value)
    return chosen


def optimizer_slots(optimizer, distributed=True):
    """The optimizer's floating-point state each replica holds a copy of (momenta, Adam's
    moments), without its step count and learning rate: what replicas training apart
    (local SGD) each update with their own gradients (`distributed=False`: a process's
    own, as `per_replica_state`'s)."""
    skip = {id(underlying(v)) for v in (optimizer.iterations,
                                        getattr(optimizer, "_learning_rate", None))}
    values = [underlying(v) for v in optimizer.variables]
    return [v for v in values if id(v) not in skip and tf.as_dtype(v.dtype).is_floating
            and (isinstance(v, tf.distribute.DistributedValues) or not distributed)]


def average_over_replicas(strategy, variables):
    """A compiled function that sets every replica's copy of `variables` (tf.Variables,
    per replica) to their mean over all replicas and workers. Call it on every worker at
    the same point: it runs a collective."""
    def replica_fn():
        context = tf.distribute.get_replica_context()
        means = wire.all_reduce(context, tf.distribute.ReduceOp.MEAN,
                                [v.read_value() for v in variables])
        for variable, mean in zip(variables, means):
            variable.assign(mean)

    return plain_function(lambda: strategy.run(replica_fn))


def gather_replica_values(strategy, variables, context=None):
    """Each of `variables` (each replica holding its own value) as one NumPy array stacked
    over every replica of every worker, in global replica order: [replicas, *shape].
    Call it on every worker at the same point: it runs a collective (an all-gather, whose
    bytes `CommStats` counts). `context`: the replicas are another group's, each process
    one (`tfdist.horovod`'s workers, `TrainingHook.replica_group`)."""
    if not variables:
        return []
    if context is not None:
        return [context.all_gather(v.read_value()[None]).numpy() for v in variables]

    def replica_fn():
        context = tf.distribute.get_replica_context()
        return [wire.all_gather(context, v.read_value()[None], axis=0) for v in variables]

    gathered = plain_function(lambda: strategy.run(replica_fn))()
    return [strategy.experimental_local_results(g)[0].numpy() for g in gathered]


def set_replica_values(strategy, variables, arrays, context=None):
    """Gives each replica its own row of `arrays` (as `gather_replica_values` returned
    them) for each of `variables`; the number of replicas must be the same. `context`: as
    `gather_replica_values`'."""
    if not variables:
        return
    if context is not None:
        for variable, values in zip(variables, arrays):
            variable.assign(tf.cast(values[context.replica_id_in_sync_group], variable.dtype))
        return
    constants = [tf.constant(a) for a in arrays]

    def replica_fn():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        for variable, values in zip(variables, constants):
            variable.assign(tf.cast(tf.gather(values, replica), variable.dtype))

    plain_function(lambda: strategy.run(replica_fn))()
