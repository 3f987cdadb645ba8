"""Each replica its own random draws: Dropout masks and augmentations per replica.

Keras 3's random layers (Dropout, GaussianNoise, RandomFlip, RandomRotation, ...) draw from
a `keras.random.SeedGenerator`: a `(2,)` int64 state variable and `next()`, which returns
the state and counts it on. Under a tf.distribute strategy that state is mirrored, so
every replica on every worker draws the same numbers: row i of each replica's batch gets
the same mask and the same transform, and a global batch of N×B rows sees only B.

`per_replica_seeds(model)` makes each SeedGenerator the model holds fold the global replica
id (`replica_id_in_sync_group`, global under MultiWorkerMirroredStrategy too) into the seed
it returns (`tf.random.experimental.stateless_fold_in`). The state itself, its counting
and its saved form are Keras' own; on one replica, and outside a replica context, the seed
is exactly Keras'.
"""

import keras
import tensorflow as tf

_FOLDING = {}  # a SeedGenerator class -> its folding subclass


class ReplicaSeedGenerator(keras.random.SeedGenerator):
    """A `keras.random.SeedGenerator` whose seeds differ per replica (see the module
    docstring). Made from a Keras generator in place by `per_replica_seeds`."""

    def next(self, ordered=True):
        """Keras' next seed with the global replica id folded in.

        Args:
            ordered: as `keras.random.SeedGenerator.next`.

        Returns:
            A `(2,)` tensor of Keras' seed dtype; Keras' own seed on one replica or in
            cross-replica context.
        """
        return fold_replica_id(super().next(ordered=ordered))


def fold_replica_id(seed):
    """`seed` with the global replica id folded in, when there are several replicas.

    Args:
        seed: a `(2,)` integer tensor (Keras' TF backend: int64).

    Returns:
        A tensor of `seed`'s shape and dtype; `seed` itself on one replica, in
        cross-replica context, or when it is not a TensorFlow tensor.
    """
    if not tf.is_tensor(seed) or tf.distribute.in_cross_replica_context():
        return seed
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return seed
    folded = tf.random.experimental.stateless_fold_in(seed, context.replica_id_in_sync_group)
    return tf.cast(folded, seed.dtype)


def per_replica_seeds(model):
    """Gives each replica its own Dropout masks and augmentation draws.

    Every `keras.random.SeedGenerator` that `model` and its layers (recursively) hold when
    this is called becomes a folding one, in place (`ReplicaSeedGenerator`). A layer added
    or built with a new generator afterwards draws as before, the same on every replica:
    call this again (it is idempotent) after the model is complete. A model with no random
    layers, and any model on one replica, trains exactly as without it.

    Args:
        model: a `keras.Model` (or any `keras.layers.Layer`).

    Returns:
        `model`, changed in place.

    Raises:
        TypeError: `model` is not a Keras 3 layer or model.
    """
    if not isinstance(model, keras.layers.Layer):
        kind = type(model)
        raise TypeError(
            "per_replica_seeds takes a Keras 3 model (keras.Model or keras.layers.Layer) "
            f"whose random layers should draw per replica. Received: model of type "
            f"{kind.__module__}.{kind.__qualname__}"[:400])
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for generator in layer._seed_generators:
            generator.__class__ = _folding(type(generator))
    return model


def _folding(cls):
    """The folding subclass of the SeedGenerator class `cls` (`cls` if it folds)."""
    if issubclass(cls, ReplicaSeedGenerator):
        return cls
    if cls is keras.random.SeedGenerator:
        return ReplicaSeedGenerator
    if cls not in _FOLDING:  # a user's own generator class keeps its behaviour beneath
        _FOLDING[cls] = type(cls.__name__, (ReplicaSeedGenerator, cls),
                             {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _FOLDING[cls]
