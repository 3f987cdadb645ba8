"""`SyncReplicaState`: one model on every replica, for `model.fit` with a plain optimizer."""

import keras

from tfdist.keras.callbacks.worker_scratch import strategy_of
from tfdist.seam import replica_state


class SyncReplicaState(keras.callbacks.Callback):
    """Averages Keras 3 state (BatchNormalization statistics) across replicas and workers
    at the end of every epoch and of training, for `model.fit` under MirroredStrategy or
    MultiWorkerMirroredStrategy. Place it before callbacks that save or evaluate.

    Keras 3 lets each replica keep its own statistics; without this two workers end with
    different models. An optimizer routed through tfdist (`DistributedOptimizer`, with
    `tfdist.callbacks.TrainingHooks`) and `tfdist.Trainer` do it already, also before
    validation: this callback is for plain Keras optimizers.
    """

    def __init__(self):
        super().__init__()
        self.hook = replica_state.SyncReplicaState()

    def on_train_begin(self, logs=None):
        self.hook.build(strategy_of(self.model), self.model.trainable_variables)

    def on_epoch_end(self, epoch, logs=None):
        self.hook.before_read(self.model)

    def on_train_end(self, logs=None):
        self.hook.before_read(self.model)
