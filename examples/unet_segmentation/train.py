"""Train the UNet on any tfdist strategy: `python train.py --config configs/unet_mwms.yaml`.

Under `tfdist launch` every task runs this same command with its TF_CONFIG. The chief
writes metrics.json, predictions.png and curves.png to --output_dir.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags, logging  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
import data  # noqa: E402
import metrics  # noqa: E402
import report  # noqa: E402
from model import unet  # noqa: E402
from train_config import train_config  # noqa: E402

flags.DEFINE_string("config", None, "tfdist config file with a train: section", required=True)
flags.DEFINE_string("output_dir", "output/unet", "where the chief writes its outputs")
flags.DEFINE_integer("epochs", None, "override train.epochs")
flags.DEFINE_integer("steps_per_epoch", None, "override train.steps_per_epoch")
flags.DEFINE_integer("validation_steps", None, "override train.validation_steps")
flags.DEFINE_integer("batch_size", None, "override train.batch_size (global)")
flags.DEFINE_integer("image_size", None, "override train.image_size")
flags.DEFINE_float("learning_rate", None, "override train.learning_rate")
flags.DEFINE_integer("seed", None, "override train.seed")
flags.DEFINE_enum("loop", None, ["fit", "ctl"], "override train.loop")
flags.DEFINE_string("dataset", None, "override train.dataset")
flags.DEFINE_string("data_dir", None, "override train.data_dir")
flags.DEFINE_enum("policy", None, ["float32", "mixed_float16", "mixed_bfloat16"],
                  "override train.policy (Keras dtype policy)")
flags.DEFINE_string("backup_dir", None, "override train.backup_dir: back up every epoch "
                    "there; a SIGTERM saves after the next step, a relaunch resumes there")
flags.DEFINE_integer("start_step", None, "override compression.start_step")
flags.DEFINE_integer("warmup_steps", None, "override local_sgd.warmup_steps")
flags.DEFINE_integer("period", None, "override local_sgd.period")
FLAGS = flags.FLAGS
OVERRIDES = ("epochs", "steps_per_epoch", "validation_steps", "batch_size", "image_size",
             "learning_rate", "seed", "loop", "dataset", "data_dir", "policy", "backup_dir")


def network_bytes():
    """Bytes received on every interface so far, or None off Linux. In a private network
    namespace (the benchmarks) this is exactly the job's traffic: on loopback, all of it;
    on an emulated link between two hosts, what this task received."""
    try:
        with open("/proc/net/dev") as f:
            rows = [l.split(":", 1) for l in f if ":" in l]
    except OSError:
        return None
    return sum(int(counters.split()[0]) for _, counters in rows) if rows else None


class Progress(keras.callbacks.Callback):
    """A line every `every` steps and at each epoch end (readable in any log), and honest
    timings: wall time over spans of steps, with everything that runs between steps
    (local SGD's averages, phase switches) and without validation (timed on its own).

    Attributes:
        step_seconds: each step's duration, callbacks before this one included.
        timeline: after each step, (seconds since start, loss, network bytes).
        epochs_done: after each epoch, its logs with the training seconds so far
            (validation excluded) and the wall seconds so far: time to accuracy's data.
    """

    def __init__(self, epochs, steps, every=25, skip=10):
        self.epochs, self.steps, self.every, self.skip = epochs, steps, every, skip
        self.start = time.time()
        self.spans = []  # per epoch: [its first step's begin, its first step, its last step]
        self.ends, self.step_seconds, self.timeline, self.epochs_done = [], [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.spans.append(None)

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_start = time.perf_counter()
        if self.spans[-1] is None:
            self.spans[-1] = [self.batch_start, len(self.ends), len(self.ends)]

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())
        self.step_seconds.append(self.ends[-1] - self.batch_start)
        self.spans[-1][2] = len(self.ends) - 1
        loss = float(logs["loss"]) if logs and "loss" in logs else None
        self.timeline.append((round(time.time() - self.start, 3), loss, network_bytes()))
        if (batch + 1) % self.every == 0 and logs:
            print(f"epoch {self.epoch + 1}/{self.epochs} step {batch + 1}/{self.steps} "
                  f"loss {float(logs['loss']):.4f} ({time.time() - self.start:.0f}s)", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_done.append({"epoch": epoch + 1, "steps": len(self.step_seconds),
                                 "train_seconds": round(self.train_seconds(), 3),
                                 "wall_seconds": round(time.time() - self.start, 3),
                                 **{k: float(v) for k, v in (logs or {}).items()}})
        shown = " ".join(f"{k} {v:.4f}" for k, v in logs.items())
        print(f"epoch {epoch + 1}/{self.epochs} done: {shown} ({time.time() - self.start:.0f}s)",
              flush=True)

    def train_seconds(self, skip=0):
        """Seconds of training steps after the first `skip`: each epoch's span from its
        first step's start to its last step's end (validation between epochs left out)."""
        total = 0.0
        for begin, first, last in filter(None, self.spans):
            if last >= skip:
                total += self.ends[last] - (begin if first >= skip else self.ends[skip - 1])
        return total

    @property
    def seconds_per_step(self):
        """Wall seconds per step after the first `skip` (tracing): every step and all that
        runs between steps, validation excluded."""
        steps = len(self.ends) - self.skip
        return self.train_seconds(self.skip) / steps if steps > 0 else None


def json_ready(section):
    """A config section as plain JSON values (nested sections and mappings as dicts)."""
    plain = lambda v: (dict(vars(v)) if hasattr(v, "__dataclass_fields__")  # noqa: E731
                       else dict(v) if hasattr(v, "keys") else v)
    return {key: plain(value) for key, value in vars(section).items()}


def _bytes(history):
    """Gradient bytes per step per worker and compression ratio (CommStats), if known."""
    if "comm_bytes_per_worker" not in history:
        return None
    return {"per_step_per_worker": history["comm_bytes_per_worker"][-1],
            "compression_ratio": history["compression_ratio"][-1]}


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    config = tfdist.load_config(FLAGS.config)
    train = train_config(config, {k: getattr(FLAGS, k) for k in OVERRIDES})
    strategy = tfdist.get_strategy(config)
    chief = tfdist.is_chief(strategy)
    classes = data.num_classes(train)
    keras.utils.set_random_seed(train.seed)
    keras.mixed_precision.set_global_policy(train.policy)  # before the model is made
    overrides = {k: getattr(FLAGS, k) for k in ("start_step", "warmup_steps", "period")}
    with strategy.scope():
        model = unet(train.image_size, classes, train.base_filters, train.depth, train.dropout)
        # compression or local SGD, as the config says; the same optimizer in both loops
        optimizer = tfdist.keras.optimizer_from_config(
            keras.optimizers.Adam(train.learning_rate), config, **overrides)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    progress = Progress(train.epochs, train.steps_per_epoch)
    callbacks = [tfdist.callbacks.TrainingHooks(),  # phases, local SGD, one model per read
                 tfdist.callbacks.CommStats(),      # bytes per step, in every run
                 *([progress] if chief else [])]
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
                                     "bytes_exchanged": _bytes(history.history),
                                 })
        final = history.history
        print(f"final validation mean IoU {final['val_mean_iou'][-1]:.3f}, pixel accuracy "
              f"{final['val_pixel_accuracy'][-1]:.3f} after {wall:.0f}s", flush=True)
        for name, path in paths.items():
            print(f"wrote {name}: {os.path.abspath(path)}", flush=True)
    tfdist.strategies.barrier(strategy)  # workers leave together, after the chief's writes


if __name__ == "__main__":
    app.run(main)
