"""A simulated preemption, shared by the resume tests."""

import keras


class Interrupt(keras.callbacks.Callback):
    """Raises KeyboardInterrupt in the middle of epoch `epoch`, like a preempted worker."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch, self.current = epoch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.current == self.epoch and batch == 1:
            raise KeyboardInterrupt("preempted")
