"""A model of the zoo (zoo.py) trained on every task of a `tfdist launch`ed job.

    tfdist launch cluster.yaml -- python zoo_job.py --out DIR --family transformer \\
        --loop fit [--exchange '{"compression": {...}}' | '{"local_sgd": {...}}'] [--policy P]

Each task writes `<out>/<type>-<index>.npz` (its final weights, in `model.weights`' order)
and `<out>/<type>-<index>.json` (the losses of each epoch; CommStats' last logs under fit).
Without --exchange the optimizer is SGD through tfdist's exact exchange ("none").

    python zoo_job.py --out DIR --family conv --loop fit --reference 4

runs no tfdist strategy: TensorFlow's own MirroredStrategy on 4 logical CPUs with a plain
Keras optimizer (the Trainer's reference is fit), writing `<out>/reference.npz` — what a
family whose layers compute per replica (BatchNormalization) is compared with.

    --backup DIR --kill E:I+J   fit backs up to DIR after each epoch (BackupAndRestore), and
                                workers I and J SIGKILL themselves after step 0 of epoch E,
                                once (<out>/killed-I marks it): an elastic job's lost machines
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
import zoo  # noqa: E402
from tfdist.config.load import config_from_dict  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--family", choices=zoo.FAMILIES, required=True)
    p.add_argument("--loop", choices=["fit", "fit_dataset", "trainer", "own"], default="fit")
    p.add_argument("--exchange", type=json.loads, default={},
                   help="a config's compression: or local_sgd: section, as JSON")
    p.add_argument("--epochs", type=int, default=zoo.EPOCHS)
    p.add_argument("--policy")
    p.add_argument("--reference", type=int, help="TF's MirroredStrategy on this many CPUs")
    p.add_argument("--backup")
    p.add_argument("--kill", type=lambda text: (int(text.split(":")[0]), tuple(
        int(i) for i in text.split(":")[1].split("+"))))
    return p.parse_args()


class KillOnce(keras.callbacks.Callback):
    """Workers `indices` SIGKILL themselves after step 0 of `epoch`, once (lost machines)."""

    def __init__(self, epoch, indices, out):
        self.epoch, self.indices, self.out, self.at = epoch, indices, out, None

    def on_epoch_begin(self, epoch, logs=None):
        self.at = epoch

    def on_train_batch_end(self, batch, logs=None):
        import signal

        kind, index = tfdist.strategies.task_of()
        os.makedirs(self.out, exist_ok=True)
        marker = os.path.join(self.out, f"killed-{index}")
        if (self.at, batch) == (self.epoch, 0) and kind == "worker" \
                and index in self.indices and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


_MIRRORED = {}  # one TF MirroredStrategy per process: a second one reuses collective keys


def reference(args):
    import tensorflow as tf

    tfdist.strategies.ensure_logical_cpus(args.reference)
    if args.policy:
        keras.mixed_precision.set_global_policy(args.policy)
    if args.reference not in _MIRRORED:
        _MIRRORED[args.reference] = tf.distribute.MirroredStrategy(
            [f"/cpu:{i}" for i in range(args.reference)])
    strategy = _MIRRORED[args.reference]
    loop = {"fit_dataset": "fit", "trainer": "fit"}.get(args.loop, args.loop)
    weights, _, _ = zoo.train(args.family, loop, strategy, epochs=args.epochs,
                              numpy=args.loop != "fit_dataset")
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, "reference.npz"), *weights)


def main():
    args = parse()
    if args.reference:
        return reference(args)
    if args.policy:
        keras.mixed_precision.set_global_policy(args.policy)
    strategy = tfdist.get_strategy("multi_worker_mirrored")
    config = config_from_dict({"cluster": {"worker": 1}, "strategy": "mirrored",
                               **args.exchange}, "--exchange")
    stats = tfdist.callbacks.CommStats()
    callbacks = [stats] if args.loop.startswith("fit") else []
    if args.backup:
        callbacks += [tfdist.callbacks.BackupAndRestore(args.backup)]
    if args.kill is not None:
        callbacks += [KillOnce(*args.kill, args.out)]
    weights, losses, model = zoo.train(
        args.family, args.loop.replace("_dataset", ""), strategy,
        wrap=lambda optimizer: tfdist.keras.optimizer_from_config(optimizer, config),
        epochs=args.epochs, numpy=args.loop != "fit_dataset", callbacks=callbacks)
    task = "{}-{}".format(*tfdist.strategies.task_of())
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"{task}.npz"), *weights)
    logs = getattr(model, "history", None)
    logs = {k: v[-1] for k, v in logs.history.items()} if logs is not None else {}
    with open(os.path.join(args.out, f"{task}.json"), "w") as f:
        json.dump({"losses": [float(v) for v in losses],
                   "logs": {k: float(v) for k, v in logs.items()}}, f)


if __name__ == "__main__":
    main()
