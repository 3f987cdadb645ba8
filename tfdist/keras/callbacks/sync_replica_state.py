"""`SyncReplicaState`: one model on every replica, without a collective per step."""

import keras

from tfdist.keras.callbacks.worker_scratch import strategy_of
from tfdist.strategies.replica_state import sync_replica_state


class SyncReplicaState(keras.callbacks.Callback):
    """Averages Keras 3 state (BatchNormalization statistics) across replicas and workers
    at the end of every epoch and of training, for `model.fit` under MirroredStrategy or
    MultiWorkerMirroredStrategy. Place it before callbacks that save or evaluate.

    Keras 3 lets each replica keep its own statistics; without this callback two workers
    end with different models. (`tfdist.Trainer` does this itself.)
    """

    def on_epoch_end(self, epoch, logs=None):
        sync_replica_state(strategy_of(self.model), self.model.non_trainable_variables)

    def on_train_end(self, logs=None):
        sync_replica_state(strategy_of(self.model), self.model.non_trainable_variables)
