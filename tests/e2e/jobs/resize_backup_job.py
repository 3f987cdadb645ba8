"""A backup written by one number of replicas, restored by another (issue 60): `--replicas
N` logical CPUs under `mirrored`, an error-fed exchange (`--compression topk|powersgd`), or
DiLoCo (`--compression diloco`: outer Nesterov, int8 + error feedback, SGD with momentum,
saved between two synchronisations).
`save` trains a few steps and writes a `ModelBackup`; `restore` builds the same model and
restores it. Either prints one line `STATE {"rules": [...], "names": [...], "rows": [[...]
per variable]}`:
each replica-state variable gathered from every replica, flattened."""

import argparse
import json

import keras
import numpy as np

import tfdist
from tfdist.keras.replica_state_file import replica_rules, replica_state
from tfdist.seam.optimizer import with_hook
from tfdist.step.variables import gather_replica_values

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["save", "restore"])
parser.add_argument("--replicas", type=int, required=True)
parser.add_argument("--dir", required=True)
parser.add_argument("--compression", default="topk", choices=["topk", "powersgd", "diloco"])
args = parser.parse_args()

strategy = tfdist.get_strategy("mirrored", logical_cpus=args.replicas)
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    if args.compression == "diloco":
        averager = tfdist.local_sgd.DiLoCo(5, compression=dict(
            name="int8", error_feedback=True, min_size=0))
        optimizer = with_hook(keras.optimizers.SGD(0.05, momentum=0.9), averager, strategy)
    else:
        options = {"topk": dict(ratio=0.1), "powersgd": dict(rank=1)}[args.compression]
        optimizer = tfdist.keras.DistributedOptimizer(
            keras.optimizers.SGD(0.1), args.compression, error_feedback=True, min_size=0,
            **options)
    model.compile(optimizer, "mse")
backup = tfdist.keras.ModelBackup(args.dir, model, run="resize test")
if args.mode == "save":
    x = np.random.default_rng(0).normal(size=(12 * args.replicas, 8)).astype("float32")
    model.fit(x, x.sum(axis=1), batch_size=4 * args.replicas, epochs=1, verbose=0,
              callbacks=[tfdist.callbacks.TrainingHooks()])
    backup.save()
else:
    assert backup.restore() is not None, "no backup restored"
rows = gather_replica_values(strategy, replica_state(model))
print("STATE " + json.dumps({"rules": replica_rules(model),
                             "names": [v.name for v in replica_state(model)],
                             "rows": [r.reshape(r.shape[0], -1).tolist() for r in rows]}),
      flush=True)
