"""`HookPhases`: lets tfdist hooks change phase under `model.fit`."""

import keras

from tfdist.training.hooks import PhasedFunction


class HookPhases(keras.callbacks.Callback):
    """Gives Keras' train step the version traced for the hooks' current phase.

    A `DistributedOptimizer` with `start_step > 0` exchanges uncompressed gradients first
    and compressed ones after; gradient accumulation exchanges only every k-th step;
    collectives cannot be switched inside the compiled step, so the step is traced once
    per phase and the right one is used at each step. `tfdist.Trainer` does this by
    itself; with `model.fit`, add this callback (the first step says so if it is missing).
    """

    def __init__(self):
        super().__init__()
        self._functions = None

    def on_train_begin(self, logs=None):
        if self._functions is not None and self.model.train_function not in self._functions:
            self._functions = None  # compiled again: Keras made a new step for this fit

    def on_train_batch_begin(self, batch, logs=None):
        pipeline = getattr(self.model.optimizer, "_tfdist_pipeline", None)
        if pipeline is None:
            return
        if self._functions is None:
            self._functions = PhasedFunction(self._make_train_function, pipeline)
        step = int(self.model.optimizer.iterations.numpy())
        self.model.train_function = self._functions.for_step(step)  # read by fit at every step

    def _make_train_function(self):
        self.model.make_train_function(force=True)
        return self.model.train_function
