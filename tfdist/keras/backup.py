"""A model's whole training state, written so a kill cannot lose it: `ModelBackup` for your
own loop, and the pieces `tfdist.callbacks.BackupAndRestore` is made of.

What a backup holds: the weights and the optimizer's state (slots, step count, loss
scale, DiLoCo's outer optimizer) in `backup.weights.h5`; each replica's own state
gathered from every replica of every worker in `replica_state.npz` — the exchange's
(error-feedback residuals, PowerSGD's P and Q, EF21's estimates) and, where replicas
train apart (local SGD, DiLoCo), their weights, optimizer slots and DiLoCo's anchors, so
a backup between two synchronisations changes nothing (restored by another number of
replicas, by each variable's rule: `tfdist.step.resize`); and, in the metadata, the hooks'
kept state (`compression: auto`'s choice, where local SGD's schedule stands) and the
layers' random state that Keras' `save_weights` leaves out (a Dropout's seed generator),
so a resumed run draws the masks the uninterrupted one would. Each backup is a `tfdist.checkpoint.CheckpointStore`
checkpoint: written apart, made durable, then switched to.
"""

import hashlib
import json
import os
import socket
import sys
import time

import numpy as np

from tfdist.checkpoint import CheckpointError, CheckpointStore
from tfdist.checkpoint.files import check_path
from tfdist.checkpoint.json_values import check_json
from tfdist.keras import replica_state_file as replica_file
from tfdist.keras.written import writing
from tfdist.loop.driver import before_backup
from tfdist.seam.optimizer import pipeline_of
from tfdist.seam.owned import optimizers_of
from tfdist.step.variables import gather_replica_values
from tfdist.strategies.task import barrier, is_chief

WEIGHTS = "backup.weights.h5"
#: The metadata keys tfdist writes itself (BackupAndRestore adds epoch, batch, epochs).
RESERVED = ("steps", "hooks", "policy", "seeds", "checkpoint", "replicas", "replica_state")
#: A step count no run reaches (an int64 optimizer counter, with room).
MAX_STEPS = 2**62


def describe_run(model, run=None):
    """The run a backup belongs to (`CheckpointStore`'s `run`): what makes it one run is
    its model's structure (each layer's class, each weight's shape and dtype, not their
    generated names) and `run` — your name for it (a string or JSON value: the flags that
    matter, a job name) — or, when None, the script's command line, which a relaunched
    task repeats and another run (another seed, other flags) does not."""
    identity = {"layers": [type(layer).__name__ for layer in _layers(model)],
                "weights": [[list(map(int, v.shape)), str(v.dtype)] for v in model.weights],
                "run": _command() if run is None else run}
    try:
        text = json.dumps(identity, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"run must be a string or JSON values: {error}") from None
    return {"id": hashlib.sha256(text.encode()).hexdigest()[:16],
            "command": _command() if run is None else None,
            "run": run, "model": f"{model.name} ({len(model.weights)} weights)",
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "host": socket.gethostname()}


def policy_of(model):
    policy = getattr(model, "dtype_policy", None)
    return getattr(policy, "name", None) or str(policy)


def check_metadata(path, metadata, model):
    """Raises CheckpointError unless tfdist's part of a backup's metadata is what a backup
    of `model` can hold: a step count, the hooks' list, the precision policy it trains in,
    the digests of its exchange state."""
    steps, hooks, policy, seeds = (metadata.get(k) for k in ("steps", "hooks", "policy",
                                                             "seeds"))
    if steps is not None and not (type(steps) is int and 0 <= steps < MAX_STEPS):
        raise CheckpointError(f"the backup {path} holds steps={repr(steps)[:60]}, not a "
                              "step count: it is not a backup tfdist wrote")
    if hooks is not None and not isinstance(hooks, list):
        raise CheckpointError(f"the backup {path} holds hooks of type {type(hooks).__name__}, "
                              "not a list: it is not a backup tfdist wrote")
    if policy is not None and policy != policy_of(model):
        raise CheckpointError(
            f"the backup {path} was made under the {policy!r} precision policy; this run "
            f"trains under {policy_of(model)!r}, whose optimizer state (step, slots, loss "
            f"scale) it does not fit. Run it under {policy!r} again, or give another "
            "backup directory")
    digests = metadata.get("replica_state")
    if digests is not None and not (isinstance(digests, list)
                                    and all(isinstance(d, str) for d in digests)):
        raise CheckpointError(f"the backup {path} holds replica_state={repr(digests)[:60]}, "
                              "not a list of digests: it is not a backup tfdist wrote")
    if seeds is not None and _seed_values(model, seeds) is None:
        raise CheckpointError(
            f"the backup {path} holds seeds={repr(seeds)[:80]}, not the random state of this "
            f"model's {len(seed_states(model))} seed generators: it is not a backup of this "
            "model")


def seed_states(model):
    """The model's integer variables that Keras' `save_weights` leaves out: its layers' seed
    generators' states (Dropout's, a noise layer's), a few integers each."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables
            if id(v) not in weights and np.issubdtype(replica_file.numpy_dtype(v), np.integer)]


def _seed_values(model, seeds):
    """`seeds` (a backup's lists of integers) as arrays for `seed_states(model)`, or None
    when they do not fit them (count, size, the dtype's range)."""
    states = seed_states(model)
    if not isinstance(seeds, list) or len(seeds) != len(states):
        return None
    arrays = []
    for state, values in zip(states, seeds):
        dtype = replica_file.numpy_dtype(state)
        if not isinstance(values, list) or len(values) != int(np.prod(state.shape)) or not all(
                type(v) is int and np.iinfo(dtype).min <= v <= np.iinfo(dtype).max
                for v in values):
            return None
        arrays.append(np.array(values, dtype).reshape(tuple(state.shape)))
    return arrays


def capture(model, strategy):
    """(metadata, write) of a backup of `model` now: `write(path)` writes its files. Call
    it on every worker at the same point (averaging the replicas and gathering their
    each replica's state are collectives)."""
    before_backup(model)
    metadata = {"steps": _steps(model), "policy": policy_of(model),
                "replicas": (replica_file.replica_group(model) or strategy).num_replicas_in_sync,
                "hooks": [pipeline_of(o).saved_state.checkpoint_states() for o in replica_file.built(model)],
                "seeds": [np.asarray(v.numpy()).ravel().tolist() for v in seed_states(model)]}
    values = gather_replica_values(strategy, replica_file.replica_state(model), replica_file.replica_group(model))
    if values:  # ties the file to this backup: another run's (or a changed one) is refused
        metadata["replica_state"] = [replica_file.digest(np.asarray(v)) for v in values]

    def write(path):
        model.save_weights(os.path.join(path, WEIGHTS))
        if values:
            np.savez(os.path.join(path, replica_file.REPLICA_STATE), *values)

    return metadata, write


def restore(model, strategy, path, metadata):
    """Loads the backup at `path` into `model`: weights, optimizer, each replica's exchange
    state (another number of replicas: by rule, `tfdist.step.resize`; another layout:
    one line, afresh) and the hooks' kept state.

    Raises:
        CheckpointError: the backup does not fit the model.
    """
    check_metadata(path, metadata, model)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    weights = os.path.join(path, WEIGHTS)
    check_path(weights, replica_file.bound(list(model.weights) + _optimizer_variables(model), copies=3))
    try:
        model.load_weights(weights)
    except ValueError as error:
        raise CheckpointError(f"the backup {path} does not fit this model: "
                              f"{' '.join(str(error).split())[:300]}") from None
    replica_file.restore(model, strategy, path, metadata.get("replica_state"))
    for state, value in zip(seed_states(model), _seed_values(model, metadata.get("seeds"))
                            or []):
        state.assign(value)
    replicas = (replica_file.replica_group(model) or strategy).num_replicas_in_sync
    resized = metadata.get("replicas") not in (None, replicas)
    for optimizer, states in zip(replica_file.built(model), metadata.get("hooks") or []):
        pipeline_of(optimizer).saved_state.restore_checkpoint_states(
            states, resized=(metadata["replicas"], replicas) if resized else None)


class ModelBackup:
    """Backups of a model trained in your own loop, in `directory` (shared by the workers).

    `save(**metadata)` on every worker at the same point (e.g. after the step
    `step.preempted()` reports, or every N steps): the chief writes, the others wait until
    the backup is complete. `restore()` on every worker before training: the newest
    readable backup's metadata (your own keys and ``steps``, the optimizer's step count),
    or None when there is none. The directory belongs to one run (`describe_run`): another
    run's backups are refused in one line, and the chief holds its lock from the first
    save until `close()` (or its exit). Your files in `directory` are never touched.

    Args:
        directory: the backups' directory (`tfdist.checkpoint.CheckpointStore`).
        model: the model; its optimizer is found as `model.optimizer` or its attributes.
        strategy: the model's strategy (default: the current one).
        run: what makes this run one (`describe_run`; default: the command line).
    """

    def __init__(self, directory, model, strategy=None, run=None):
        import keras
        import tensorflow as tf

        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory) \
                or "\0" in os.fspath(directory):
            raise ValueError("directory must be a non-empty path without NUL characters. "
                             f"Received: directory={str(directory)[:200]!r}")
        if not isinstance(model, keras.Model):
            raise TypeError(f"model must be a keras.Model. Received: {type(model).__name__}")
        check_json("run", run)
        self.directory, self.run = os.fspath(directory), run
        self.model = model
        self.strategy = strategy or getattr(model, "distribute_strategy", None) \
            or tf.distribute.get_strategy()
        self._store = None

    @property
    def store(self):
        """The run's `CheckpointStore` (made once the model is built)."""
        if self._store is None:
            self._store = CheckpointStore(self.directory, run=describe_run(self.model, self.run))
        return self._store

    def save(self, **metadata):
        """Writes a backup of the model now, with `metadata` (JSON values) beside it."""
        taken = sorted(set(metadata) & set(RESERVED))
        if taken:
            raise ValueError(f"{', '.join(taken)} belong to tfdist's own part of the backup's "
                             f"metadata; name yours otherwise. Received: {', '.join(taken)}")
        check_json("a backup's metadata", metadata)
        captured, write = capture(self.model, self.strategy)
        if is_chief(self.strategy):
            with writing("tfdist.ModelBackup", self.directory,
                         "this backup is not written (the last complete one is kept)"):
                self.store.save(write, {**metadata, **captured})
        barrier(self.strategy)  # nobody goes on (or exits) before the backup is complete

    def restore(self):
        """Loads the newest readable backup of this run; returns its metadata, or None."""
        with self.strategy.scope():  # an optimizer not yet built is built here
            loaded = self.store.load(lambda path, metadata: restore(
                self.model, self.strategy, path, metadata))
        return None if loaded is None else loaded[1]

    def close(self):
        """Lets go of the directory's lock (the backups stay)."""
        if self._store is not None:
            self._store.release()


def _optimizer_variables(model):
    found = []
    for optimizer in {id(o): o for o in [getattr(model, "optimizer", None),
                                         *optimizers_of(model)] if o is not None}.values():
        found += list(getattr(optimizer, "variables", []))
    return found


def _layers(model):
    return [layer for layer in model._flatten_layers(include_self=False)] \
        if hasattr(model, "_flatten_layers") else list(getattr(model, "layers", []))


def _command():
    return [os.path.basename(sys.argv[0] if sys.argv else ""), *sys.argv[1:]]


def _steps(model):
    optimizers = optimizers_of(model) or [getattr(model, "optimizer", None)]
    return None if optimizers[0] is None else int(optimizers[0].iterations.numpy())
