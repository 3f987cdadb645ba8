"""Giving Keras 3's non-trainable state an aggregation, inside a strategy's scope."""

import collections
import contextlib

import tensorflow as tf

_NONE = (None, tf.VariableAggregation.NONE)


class AggregatedKerasState:
    """Strategy mixin: Keras 3 state variables are aggregated across replicas.

    Keras 3 creates non-trainable state (BatchNormalization moving statistics, the seed
    of Dropout and other random layers) with aggregation "none". Under
    CentralStorageStrategy, which stores each variable once, writing it fails ("You must
    specify an aggregation method to update a AggregatingVariable in Replica Context").
    (Under the mirrored strategies each replica writes its own copy instead; see
    `sync_replica_state` for keeping those copies equal without a collective per step.)

    Inside `scope()`, a variable creator gives such variables the aggregation
    tf.keras 2 used: MEAN for floating point (moving statistics become the mean over
    replicas, identical on all of them) and ONLY_FIRST_REPLICA for integers (seed
    counters, which every replica advances alike). Trainable variables and explicit
    aggregations are untouched. `keras_fixes` counts what was changed, so a test
    notices when Keras no longer needs it.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keras_fixes = collections.Counter()

    @contextlib.contextmanager
    def scope(self):
        with super().scope(), tf.variable_creator_scope(self._create_keras_variable):
            yield

    def _create_keras_variable(self, next_creator, **kwargs):
        if not kwargs.get("trainable", True) and kwargs.get("aggregation") in _NONE:
            dtype = kwargs.get("dtype") or getattr(kwargs.get("initial_value"), "dtype", None)
            floating = dtype is None or tf.as_dtype(dtype).is_floating
            kwargs["aggregation"] = (tf.VariableAggregation.MEAN if floating
                                     else tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self.keras_fixes[f"state_{kwargs['aggregation'].name.lower()}"] += 1
        return self._after_create(next_creator(**kwargs))

    def _after_create(self, variable):
        """Subclasses may wrap the created variable."""
        return variable
