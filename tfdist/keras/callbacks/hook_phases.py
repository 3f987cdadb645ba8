"""`HookPhases`: lets tfdist hooks change phase under `model.fit`."""

import keras


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
        self._functions = {}

    def on_train_begin(self, logs=None):
        self._functions = {}  # Keras traced a new step for this fit

    def on_train_batch_begin(self, batch, logs=None):
        pipeline = getattr(self.model.optimizer, "_tfdist_pipeline", None)
        if pipeline is None:
            return
        pipeline.enter_phase(int(self.model.optimizer.iterations.numpy()))
        key = pipeline.phases
        if key not in self._functions:
            self.model.make_train_function(force=True)
            self._functions[key] = self.model.train_function
        self.model.train_function = self._functions[key]  # read by fit at every step
