"""Horovod's Keras callbacks (`horovod.tensorflow.keras.callbacks`)."""

import keras

from tfdist.horovod.ops import allreduce, broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """After the first batch, every worker takes `root_rank`'s model and optimizer
    variables (the optimizer's exist once it has applied a step), as Horovod's."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank, self.done = root_rank, False

    def on_train_batch_end(self, batch, logs=None):
        if self.done:
            return
        broadcast_variables(self.model.variables, self.root_rank)
        if self.model.optimizer is not None:
            broadcast_variables(self.model.optimizer.variables, self.root_rank)
        self.done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end, every number in the logs becomes its mean over the workers
    (each worker's metrics are its own shard's), as Horovod's."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        for key, value in sorted((logs or {}).items()):  # the same order on every worker
            if isinstance(value, (int, float)) or hasattr(value, "dtype"):
                logs[key] = float(allreduce(float(value), op="Average"))
