"""Every task of a multi-worker job given the same TensorBoard directory and CSV file
(`tfdist.callbacks.TensorBoard`, `tfdist.callbacks.CSVLogger`), under `tfdist launch`:

    python logs_job.py OUT --loop fit|trainer --log_dir DIR --csv FILE [--profile_workers]

trains a small conv model for 2 epochs of 4 steps (validating on 1 batch), the profiler
on steps 2 to 3, and writes <out>/<type>-<index>.json: its history, whether it is the
chief, and the scratch paths its two callbacks wrote to (None on the chief), read while
training.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import tfdist  # noqa: E402
from models import conv_model, dataset, loss  # noqa: E402
from tfdist.strategies.task import is_chief, task_of  # noqa: E402

STEPS, EPOCHS, BATCH = 4, 2, 16


class WhereTheyWrite(keras.callbacks.Callback):
    """Reads, during training, where each logging callback writes on this task."""

    def __init__(self, board, csv):
        super().__init__()
        self.board, self.csv, self.seen = board, csv, {}

    def on_epoch_end(self, epoch, logs=None):
        self.seen = {"board": self.board._scratch.path, "csv": self.csv._scratch.path,
                     "csv_file": self.csv.filename}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--loop", default="fit")
    parser.add_argument("--log_dir", required=True)
    parser.add_argument("--csv", required=True)
    parser.add_argument("--profile_workers", action="store_true")
    args = parser.parse_args()
    strategy = tfdist.strategies.get_strategy("multi_worker_mirrored")
    board = tfdist.callbacks.TensorBoard(args.log_dir, profile_batch=(2, 3),
                                         profile_workers=args.profile_workers)
    csv = tfdist.callbacks.CSVLogger(args.csv)
    where = WhereTheyWrite(board, csv)
    callbacks = [board, csv, where]
    data, validation = dataset(STEPS * BATCH, BATCH), dataset(BATCH, BATCH, seed=1)
    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05))
    if args.loop == "fit":
        with strategy.scope():
            model.compile(optimizer, loss())
        history = model.fit(data, epochs=EPOCHS, validation_data=validation, verbose=0,
                            callbacks=[tfdist.callbacks.TrainingHooks(), *callbacks])
    else:
        trainer = tfdist.Trainer(model, optimizer, loss(), strategy=strategy)
        history = trainer.fit(data, epochs=EPOCHS, validation_data=validation, verbose=0,
                              callbacks=callbacks)
    task_type, task_id = task_of(strategy)
    with open(os.path.join(args.out, f"{task_type}-{task_id}.json"), "w") as f:
        json.dump({"chief": is_chief(strategy), "history": history.history,
                   "wrote": where.seen}, f)


if __name__ == "__main__":
    main()
