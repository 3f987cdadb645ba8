"""`CommStats`: bytes exchanged per step and the compression ratio, in logs and TensorBoard."""

import keras
import tensorflow as tf

from tfdist.core.optimizer import pipeline_of


class CommStats(keras.callbacks.Callback):
    """Adds to each epoch's logs, from the payload sizes of tfdist's gradient exchange
    (plain float32 all-reduce, `GradientCompression` or local SGD's `ModelAverager`,
    whose one model average is spread over its `period` steps):

    - ``comm_payload_bytes``: bytes each replica contributes per step;
    - ``comm_bytes_per_worker``: gradient bytes each worker sends per step over the
      network (ring all-reduce: 2 (W - 1) / W x its part of the payload; all-gather:
      (W - 1) x its part; W = number of workers; 0 on one machine; under parameter
      servers, the pushed payload — weight pulls are not counted);
    - ``compression_ratio``: uncompressed float32 bytes / payload bytes.

    Args:
        log_dir: also write them as TensorBoard scalars there (optional).
        hook: the hook to read (with a `bytes_per_step(step)` method); by default the
            one on the model's optimizer, else the plain all-reduce of the weights' size.
    """

    def __init__(self, log_dir=None, hook=None):
        super().__init__()
        self.log_dir, self.hook = log_dir, hook
        self._writer = None

    def on_train_begin(self, logs=None):
        self.hook = self.hook or _find_hook(self.model)
        if self.log_dir and self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        stats = self.stats(int(self.model.optimizer.iterations.numpy()) - 1)
        logs.update(stats)
        if self._writer is not None:
            with self._writer.as_default():
                for name, value in stats.items():
                    tf.summary.scalar(name, value, step=epoch)
            self._writer.flush()

    def stats(self, step):
        if self.hook is not None:
            sizes = self.hook.bytes_per_step(step)
        else:  # Keras' own exchange: one float32 all-reduce of every gradient
            dense = 4 * sum(int(v.shape.num_elements()) for v in self.model.trainable_variables)
            sizes = {"payload": dense, "dense": dense, "gathered": 0}
        workers = _num_workers(self.model)
        gathered = sizes["gathered"]
        per_worker = (2 * (workers - 1) / workers * (sizes["payload"] - gathered)
                      + (workers - 1) * gathered)
        if self.hook is not None and self.hook.push_codec is not None:  # each worker pushes
            per_worker = sizes["payload"]
        return {"comm_payload_bytes": float(sizes["payload"]),
                "comm_bytes_per_worker": float(per_worker),
                "compression_ratio": sizes["dense"] / max(sizes["payload"], 1)}


def _find_hook(model):
    pipeline = pipeline_of(model.optimizer)
    hooks = pipeline.hooks if pipeline is not None else []
    found = [h for h in hooks if h.replaces_exchange and hasattr(h, "bytes_per_step")]
    return found[0] if found else None


def _num_workers(model):
    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, len(spec.get("chief", [])) + len(spec.get("worker", [])))
