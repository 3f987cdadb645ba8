"""Train the UNet on any tfdist strategy: `python train.py --config configs/unet_mwms.yaml`.

Under `tfdist launch` every task runs this same command with its TF_CONFIG. The chief
writes metrics.json, predictions.png, curves.png and (on several workers) step_times.png
to --output_dir.
"""

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
import data  # noqa: E402
from common.progress import Progress, bytes_exchanged, json_ready, weights_checksum  # noqa: E402
import metrics  # noqa: E402
import report  # noqa: E402
from model import unet  # noqa: E402
from train_config import train_config  # noqa: E402

settings.define_flags(flags, "tfdist config file with a train: section", "output/unet")
flags.DEFINE_integer("image_size", None, "override train.image_size")
flags.DEFINE_string("dataset", None, "override train.dataset")
flags.DEFINE_string("data_dir", None, "override train.data_dir")
flags.DEFINE_integer("depth", None, "override train.depth (the UNet's levels)")
flags.DEFINE_integer("base_filters", None, "override train.base_filters")
FLAGS = flags.FLAGS
OVERRIDES = (*settings.TRAIN_CHECKS, "image_size", "dataset", "data_dir", "depth",
             "base_filters")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    config = tfdist.load_config(FLAGS.config)
    train = train_config(config, settings.flag_values(FLAGS, OVERRIDES))
    strategy = tfdist.get_strategy(config)
    chief = tfdist.is_chief(strategy)
    if chief and not report.can_plot():
        print(f"{sys.argv[0]}: {report.NO_PLOTS}", file=sys.stderr, flush=True)
    classes = data.num_classes(train)
    keras.utils.set_random_seed(train.seed)
    keras.mixed_precision.set_global_policy(train.policy)  # before the model is made
    overrides = settings.flag_values(FLAGS, settings.TFDIST_OVERRIDES)
    with strategy.scope():
        model = unet(train.image_size, classes, train.base_filters, train.depth, train.dropout)
        # compression or local SGD, as the config says; the same optimizer in both loops
        optimizer = tfdist.keras.optimizer_from_config(
            keras.optimizers.Adam(train.learning_rate), config, **overrides)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    progress = Progress(train.epochs, train.steps_per_epoch)
    callbacks = [tfdist.callbacks.TrainingHooks(),  # phases, local SGD, one model per read
                 tfdist.callbacks.CommStats(),      # bytes per step, in every run
                 *([progress] if chief else []),
                 # each worker's compute / exchange / wait per step, into each epoch's logs
                 # (after Progress: its epoch line stays short); the chief's line every
                 # two epochs and for the whole run
                 tfdist.callbacks.StepTimes(every_steps=2 * train.steps_per_epoch)]
    if train.backup_dir:  # preemption: every worker saves after one agreed step, exits 143
        callbacks.append(tfdist.callbacks.BackupAndRestore(train.backup_dir))
    fit_args = dict(epochs=train.epochs, steps_per_epoch=train.steps_per_epoch,
                    validation_steps=train.validation_steps, callbacks=callbacks, verbose=0)
    start = time.time()
    if train.loop == "fit":
        with strategy.scope():
            model.compile(optimizer, loss, metrics=metrics.segmentation_metrics(classes))
        history = model.fit(
            strategy.distribute_datasets_from_function(data.dataset_fn(train, "train")),
            validation_data=strategy.distribute_datasets_from_function(
                data.dataset_fn(train, "validation")), **fit_args)
    else:
        trainer = tfdist.Trainer(model, optimizer, loss, strategy=strategy,
                                 metrics=metrics.segmentation_metrics(classes))
        history = trainer.fit(data.dataset_fn(train, "train"),
                              validation_data=data.dataset_fn(train, "validation"), **fit_args)
    wall = time.time() - start
    trained = model.optimizer if train.loop == "fit" else trainer.optimizer
    if chief:
        sample = next(iter(data.examples(train, "validation").batch(6)))
        paths = report.write_all(FLAGS.output_dir, model, [np.asarray(t) for t in sample],
                                 history.history, {
                                     "strategy": config.strategy.name if config.strategy else "default",
                                     "loop": train.loop,
                                     "policy": train.policy,
                                     "replicas": strategy.num_replicas_in_sync,
                                     "steps": train.epochs * train.steps_per_epoch,
                                     # the optimizer's step count: `steps` when each step
                                     # trained once, across a preemption too
                                     "optimizer_steps": int(trained.iterations.numpy()),
                                     "wall_time_seconds": round(wall, 2),
                                     # wall time over every step after the first 10 (tracing),
                                     # averages and phase switches included, validation not
                                     "seconds_per_step": progress.seconds_per_step,
                                     "median_step_seconds": float(np.median(progress.step_seconds)),
                                     "train_seconds": progress.train_seconds(),
                                     # per epoch: training seconds so far, wall seconds, logs
                                     "epochs": progress.epochs_done,
                                     # per step: (seconds since start, loss, network bytes received)
                                     "timeline": progress.timeline,
                                     "weight_shapes": [list(v.shape) for v in
                                                       model.trainable_variables],
                                     "compression": (config.compression.name
                                                     if config.compression else None),
                                     "local_sgd": (json_ready(config.local_sgd)
                                                   if config.local_sgd else None),
                                     "bytes_exchanged": bytes_exchanged(history.history),
                                 })
        final = history.history
        print(f"final validation mean IoU {final['val_mean_iou'][-1]:.3f}, pixel accuracy "
              f"{final['val_pixel_accuracy'][-1]:.3f} after {wall:.0f}s", flush=True)
        for name, path in paths.items():
            print(f"wrote {name}: {os.path.abspath(path)}", flush=True)
    print(f"final weights checksum {weights_checksum(model):.6f}", flush=True)  # every worker
    tfdist.strategies.barrier(strategy)  # workers leave together, after the chief's writes


if __name__ == "__main__":
    settings.run(app, main)
