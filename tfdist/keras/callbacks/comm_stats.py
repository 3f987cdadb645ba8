"""`CommStats`: bytes exchanged per step and the compression ratio, in logs and TensorBoard."""

import keras
import tensorflow as tf

from tfdist.config import checks
from tfdist.config.checks import check_arguments
from tfdist.keras.callbacks.loss_scale_log import LossScaleLog
from tfdist.seam.optimizer import pipeline_of
from tfdist.seam.owned import named_optimizers


class CommStats(keras.callbacks.Callback):
    """Adds to each epoch's logs what the model's tfdist optimizers really exchanged in
    that epoch, per training step: each optimizer's `WireMeter` counts the bytes of the
    payload tensors its traced exchange hands to the collectives, each time the step runs
    (`tfdist.step.wire`), whatever compression, phase, local SGD average or mixed precision
    produced them — not what the configuration says.

    - ``comm_payload_bytes``: bytes each replica contributes per step (all-reduced and
      all-gathered; under parameter servers, the gradients pushed);
    - ``comm_bytes_per_worker``: bytes each worker sends per step over the network (ring
      all-reduce: 2 (W - 1) / W x the all-reduced part; all-gather: (W - 1) x its part;
      W = number of workers; 0 on one machine; under parameter servers, the push);
    - ``compression_ratio``: the gradients' own dense bytes (an embedding's whole table) /
      payload bytes;
    - ``compression_ratio_vs_tensorflow``: what TensorFlow's own strategy sends of the same
      gradients (dense ones whole, an embedding's `IndexedSlices` as the rows a step
      touched) / payload bytes.

    With several tfdist optimizers (a custom `train_step`'s, found as the model's
    attributes), each one's are logged too, prefixed by its name
    (``d_optimizer/compression_ratio``); the unprefixed values are their sum.

    Under mixed precision: ``loss_scale`` and ``skipped_steps`` too (`LossScaleLog`).

    Args:
        log_dir: also write them as TensorBoard scalars there (optional).
    """

    def __init__(self, log_dir=None):
        super().__init__()
        self.log_dir = log_dir if log_dir is None else check_arguments(
            "CommStats", {"log_dir": checks.path}, log_dir=log_dir)["log_dir"]
        self._writer = None
        self._named, self._start, self._steps = [], {}, 0
        self._epoch, self._loss_scale = 0, LossScaleLog()

    def on_train_begin(self, logs=None):
        self._named = named_optimizers(self.model)
        if self.log_dir and self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._steps = self._totals(), 0
        self._epoch = epoch
        self._loss_scale.begin(self.model)

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        self._loss_scale.step(self.model, self._epoch, batch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self._loss_scale.figures(self.model))
        if logs is None or not self._named or not self._steps:
            return
        stats = self.stats(self._start, self._totals(), self._steps)
        logs.update(stats)
        if self._writer is not None:
            with self._writer.as_default():
                for name, value in stats.items():
                    tf.summary.scalar(name, value, step=epoch)
            self._writer.flush()

    def _totals(self):
        return {name: pipeline_of(o).meter.totals() for name, o in self._named}

    def stats(self, start, end, steps):
        """The logs from the meters' totals at the epoch's `start` and `end`, over `steps`."""
        workers = _num_workers(self.model)
        per_optimizer = {name: {kind: (end[name][kind] - start[name][kind]) / steps
                                for kind in end[name]} for name in end}
        total = {kind: sum(sent[kind] for sent in per_optimizer.values())
                 for kind in next(iter(per_optimizer.values()))}
        stats = _figures(total, workers)
        if len(per_optimizer) > 1:
            for name, sent in per_optimizer.items():
                stats.update({f"{name}/{k}": v for k, v in _figures(sent, workers).items()})
        return stats


def _figures(sent, workers):
    payload = sent["reduced"] + sent["gathered"] + sent["pushed"] + sent["scattered"]
    per_worker = ((workers - 1) / workers * (2 * sent["reduced"] + sent["scattered"])
                  + (workers - 1) * sent["gathered"] + sent["pushed"])
    return {"comm_payload_bytes": float(payload), "comm_bytes_per_worker": float(per_worker),
            "compression_ratio": sent["dense"] / payload if payload else 1.0,
            "compression_ratio_vs_tensorflow": sent["tensorflow"] / payload if payload else 1.0}


def _num_workers(model):
    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, len(spec.get("chief", [])) + len(spec.get("worker", [])))
