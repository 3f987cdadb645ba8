"""Train a byte-level language model on Python's own source with any tfdist config:
`python train.py --config configs/lm_diloco.yaml`, or any UNet config in configs/.

Under `tfdist launch` every task runs this same command with its TF_CONFIG. The chief
writes metrics.json (validation loss and perplexity per epoch, timings, bytes) to
--output_dir.
"""

import json
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # common/

from absl import app, flags, logging  # noqa: E402
from common import settings  # noqa: E402

settings.require_tensorflow_backend()  # before Keras is imported: one line, exit 2
import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
import corpus  # noqa: E402
import data  # noqa: E402
from common.progress import Progress, bytes_exchanged, json_ready, weights_checksum  # noqa: E402
from lm_config import lm_config  # noqa: E402
from model import decoder  # noqa: E402

settings.define_flags(flags, "tfdist config file (train: and lm: sections)", "output/char_lm")
flags.DEFINE_integer("sequence_length", None, "override lm.sequence_length")
flags.DEFINE_integer("width", None, "override lm.width")
flags.DEFINE_integer("layers", None, "override lm.layers")
FLAGS = flags.FLAGS
OVERRIDES = (*settings.TRAIN_CHECKS, "sequence_length", "width", "layers")


class Perplexity(keras.callbacks.Callback):
    """Adds perplexity (e^loss) and validation perplexity to each epoch's logs."""

    def on_epoch_end(self, epoch, logs=None):
        for key in ("loss", "val_loss"):
            if logs is not None and key in logs:
                logs[key.replace("loss", "perplexity")] = math.exp(min(float(logs[key]), 50))


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    config = tfdist.load_config(FLAGS.config)
    lm = lm_config(config, settings.flag_values(FLAGS, OVERRIDES))
    strategy = tfdist.get_strategy(config)
    chief = tfdist.is_chief(strategy)
    keras.utils.set_random_seed(lm.seed)
    keras.mixed_precision.set_global_policy(lm.policy)
    overrides = settings.flag_values(FLAGS, settings.TFDIST_OVERRIDES)
    with strategy.scope():
        model = decoder(lm.sequence_length, lm.width, lm.layers, lm.heads, lm.dropout)
        optimizer = tfdist.keras.optimizer_from_config(
            keras.optimizers.Adam(lm.learning_rate), config, **overrides)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    progress = Progress(lm.epochs, lm.steps_per_epoch)
    callbacks = [tfdist.callbacks.TrainingHooks(), tfdist.callbacks.CommStats(), Perplexity(),
                 *([progress] if chief else [])]
    if lm.backup_dir:
        callbacks.append(tfdist.callbacks.BackupAndRestore(lm.backup_dir))
    fit_args = dict(epochs=lm.epochs, steps_per_epoch=lm.steps_per_epoch,
                    validation_steps=lm.validation_steps, callbacks=callbacks, verbose=0)
    train_data, val_data = data.dataset_fn(lm, "train"), data.dataset_fn(lm, "validation")
    start = time.time()
    if lm.loop == "fit":
        with strategy.scope():
            model.compile(optimizer, loss)
        history = model.fit(strategy.distribute_datasets_from_function(train_data),
                            validation_data=strategy.distribute_datasets_from_function(val_data),
                            **fit_args)
    else:
        trainer = tfdist.Trainer(model, optimizer, loss, strategy=strategy)
        history = trainer.fit(train_data, validation_data=val_data, **fit_args)
    wall = time.time() - start
    trained = model.optimizer if lm.loop == "fit" else trainer.optimizer
    if chief:
        write_metrics(config, lm, strategy, history.history, progress, trained, wall)
    print(f"final weights checksum {weights_checksum(model):.6f}", flush=True)  # every worker
    tfdist.strategies.barrier(strategy)  # workers leave together, after the chief's writes


def write_metrics(config, lm, strategy, history, progress, optimizer, wall):
    _, train_hash = corpus.read("train")
    _, val_hash = corpus.read("validation")
    metrics = {
        "strategy": config.strategy.name if config.strategy else "default",
        "loop": lm.loop, "policy": lm.policy, "replicas": strategy.num_replicas_in_sync,
        "steps": lm.epochs * lm.steps_per_epoch,
        "optimizer_steps": int(optimizer.iterations.numpy()),
        "wall_time_seconds": round(wall, 2), "seconds_per_step": progress.seconds_per_step,
        "median_step_seconds": float(np.median(progress.step_seconds)),
        "train_seconds": progress.train_seconds(), "epochs": progress.epochs_done,
        "timeline": progress.timeline, "history": {k: [float(v) for v in vs]
                                                   for k, vs in history.items()},
        "corpus": {"train_sha256": train_hash, "validation_sha256": val_hash,
                   "pinned": corpus.pinned("train", train_hash),
                   "python": ".".join(map(str, sys.version_info[:3]))},
        "compression": config.compression.name if config.compression else None,
        "local_sgd": json_ready(config.local_sgd) if config.local_sgd else None,
        "bytes_exchanged": bytes_exchanged(history),
        "lm": json_ready(lm),
    }
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    path = os.path.join(FLAGS.output_dir, "metrics.json")
    with open(path, "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"final validation loss {history['val_loss'][-1]:.3f}, perplexity "
          f"{history['val_perplexity'][-1]:.2f} after {wall:.0f}s", flush=True)
    print(f"wrote metrics: {os.path.abspath(path)}", flush=True)


if __name__ == "__main__":
    settings.run(app, main)
