"""`HookPhases`: lets tfdist hooks change phase under `model.fit`."""

import keras


class HookPhases(keras.callbacks.Callback):
    """Traces Keras' train step again when a tfdist hook changes phase.

    A `DistributedOptimizer` with `start_step > 0` exchanges uncompressed gradients first
    and compressed ones after; collectives cannot be switched inside the compiled step,
    so the step is traced again at the switch. `tfdist.Trainer` does this by itself; with
    `model.fit`, add this callback (`DistributedOptimizer` warns when it is needed).
    """

    def on_train_batch_begin(self, batch, logs=None):
        pipeline = getattr(self.model.optimizer, "_tfdist_pipeline", None)
        step = int(self.model.optimizer.iterations.numpy())
        if pipeline is not None and pipeline.enter_phase(step):
            self.model.make_train_function(force=True)
