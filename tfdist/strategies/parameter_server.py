"""ParameterServerStrategy with a clear message where Keras 3 cannot follow."""

import tensorflow as tf

from tfdist.strategies.errors import UnsupportedByKerasError
from tfdist.strategies.keras_build_batch import called_from_keras_trainer, keras_entry_point
from tfdist.strategies.raw_errors import RawErrors

KERAS_MESSAGE = (
    "Keras 3 `model.fit`, `evaluate` and `predict` do not support ParameterServerStrategy "
    "(keras #18624). Train with tfdist.Trainer(model, optimizer, loss, strategy=strategy)"
    ".fit(dataset_fn, epochs=..., steps_per_epoch=...), which drives the workers through "
    "ClusterCoordinator.")
#: What each of Keras' entry points is told (fit's: KERAS_MESSAGE).
KERAS_MESSAGES = {
    "evaluate": "Keras 3 `model.evaluate` does not support ParameterServerStrategy (keras "
                "#18624). Evaluate with tfdist.Trainer(model, optimizer, loss, strategy="
                "strategy).evaluate(dataset_fn, steps=...), which drives the workers through "
                "ClusterCoordinator. Received: strategy=ParameterServerStrategy",
    "predict": "Keras 3 `model.predict` does not support ParameterServerStrategy (keras "
               "#18624), and tfdist.Trainer has no predict: call the model on the "
               "coordinator, batch by batch, `model(x, training=False)` (it reads the "
               "variables from the ps tasks), or predict with a copy made outside the scope "
               "(`keras.models.clone_model(model)` and `set_weights(model.get_weights())`). "
               "Received: strategy=ParameterServerStrategy",
}


class ParameterServerStrategy(RawErrors, tf.distribute.ParameterServerStrategy):
    """`tf.distribute.ParameterServerStrategy` that says "use tfdist.Trainer" to Keras 3.

    Keras 3's trainer distributes its dataset with `experimental_distribute_dataset` and
    then iterates it on the coordinator, which TF refuses with "To use this dataset, you
    need to pass this dataset to ClusterCoordinator.create_per_worker_dataset". When the
    caller is Keras' trainer, this strategy raises `UnsupportedByKerasError` pointing
    to `tfdist.Trainer` instead (`fit`, `evaluate`), or, for `predict`, which the Trainer
    has not, to calling the model on the coordinator. Calls from anywhere else are TF's own.

    Unlike TF's class, `cluster_resolver` returns the resolver it was built with, so
    code can ask which task it runs on (`tfdist.is_chief`).
    """

    def __init__(self, cluster_resolver, *args, **kwargs):
        super().__init__(cluster_resolver, *args, **kwargs)
        self._tfdist_cluster_resolver = cluster_resolver

    @property
    def cluster_resolver(self):
        return self._tfdist_cluster_resolver

    def experimental_distribute_dataset(self, dataset, options=None):
        if called_from_keras_trainer():
            entry = keras_entry_point()
            raise UnsupportedByKerasError(KERAS_MESSAGES.get(entry, KERAS_MESSAGE))
        return super().experimental_distribute_dataset(dataset, options)

