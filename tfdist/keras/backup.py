"""A model's whole training state, written so a kill cannot lose it: `ModelBackup` for your
own loop, and the pieces `tfdist.callbacks.BackupAndRestore` is made of.

What a backup holds: the weights and the optimizer's state (slots, step count, loss
scale, DiLoCo's outer optimizer) in `backup.weights.h5`; each replica's own state
gathered from every replica of every worker in `replica_state.npz` — the exchange's
(error-feedback residuals, PowerSGD's P and Q, EF21's estimates) and, where replicas
train apart (local SGD, DiLoCo), their weights, optimizer slots and DiLoCo's anchors, so
a backup between two synchronisations changes nothing; and, in the metadata, the hooks'
kept state (`compression: auto`'s choice, where local SGD's schedule stands). Each backup is a `tfdist.checkpoint.CheckpointStore`
checkpoint: written apart, made durable, then switched to.
"""

import json
import os

import numpy as np

from tfdist.checkpoint import CheckpointError, CheckpointStore
from tfdist.core.driver import before_backup
from tfdist.core.optimizer import pipeline_of
from tfdist.core.owned import optimizers_of
from tfdist.core.variables import (gather_replica_values, optimizer_slots,
                                   set_replica_values)
from tfdist.strategies.task import barrier, is_chief

WEIGHTS = "backup.weights.h5"
#: Each replica's own state of the exchange, stacked over all replicas.
REPLICA_STATE = "replica_state.npz"
#: The metadata keys tfdist writes itself (BackupAndRestore adds epoch, batch, epochs).
RESERVED = ("steps", "hooks")


def capture(model, strategy):
    """(metadata, write) of a backup of `model` now: `write(path)` writes its files. Call
    it on every worker at the same point (averaging the replicas and gathering their
    each replica's state are collectives)."""
    before_backup(model)
    metadata = {"steps": _steps(model),
                "hooks": [pipeline_of(o).checkpoint_states() for o in _built(model)]}
    values = gather_replica_values(strategy, _replica_state(model))

    def write(path):
        model.save_weights(os.path.join(path, WEIGHTS))
        if values:
            np.savez(os.path.join(path, REPLICA_STATE), *values)

    return metadata, write


def restore(model, strategy, path, metadata):
    """Loads the backup at `path` into `model`: weights, optimizer, each replica's exchange
    state (another layout: one line, afresh) and the hooks' kept state.

    Raises:
        CheckpointError: the backup does not fit the model.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    try:
        model.load_weights(os.path.join(path, WEIGHTS))
    except ValueError as error:
        raise CheckpointError(f"the backup {path} does not fit this model: "
                              f"{' '.join(str(error).split())[:300]}") from None
    _restore_replica_state(model, strategy, path)
    for optimizer, states in zip(_built(model), metadata.get("hooks") or []):
        pipeline_of(optimizer).restore_checkpoint_states(states)


class ModelBackup:
    """Backups of a model trained in your own loop, in `directory` (shared by the workers).

    `save(**metadata)` on every worker at the same point (e.g. after the step
    `step.preempted()` reports, or every N steps): the chief writes, the others wait until
    the backup is complete. `restore()` on every worker before training: the newest
    readable backup's metadata (your own keys and ``steps``, the optimizer's step count),
    or None when there is none.

    Args:
        directory: the backups' directory (`tfdist.checkpoint.CheckpointStore`).
        model: the model; its optimizer is found as `model.optimizer` or its attributes.
        strategy: the model's strategy (default: the current one).
    """

    def __init__(self, directory, model, strategy=None):
        import keras
        import tensorflow as tf

        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory) \
                or "\0" in os.fspath(directory):
            raise ValueError("directory must be a non-empty path without NUL characters. "
                             f"Received: directory={str(directory)[:200]!r}")
        if not isinstance(model, keras.Model):
            raise TypeError(f"model must be a keras.Model. Received: {type(model).__name__}")
        self.store = CheckpointStore(directory)
        self.model = model
        self.strategy = strategy or getattr(model, "distribute_strategy", None) \
            or tf.distribute.get_strategy()

    def save(self, **metadata):
        """Writes a backup of the model now, with `metadata` (JSON values) beside it."""
        taken = sorted(set(metadata) & set(RESERVED))
        if taken:
            raise ValueError(f"{', '.join(taken)} belong to tfdist's own part of the backup's "
                             f"metadata; name yours otherwise. Received: {', '.join(taken)}")
        try:
            json.dumps(metadata, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"a backup's metadata must be JSON values (finite numbers, "
                             f"strings, lists, dicts): {error}") from None
        captured, write = capture(self.model, self.strategy)
        if is_chief(self.strategy):
            self.store.save(write, {**metadata, **captured})
        barrier(self.strategy)  # nobody goes on (or exits) before the backup is complete

    def restore(self):
        """Loads the newest readable backup; returns its metadata, or None."""
        loaded = self.store.load(lambda path, metadata: restore(
            self.model, self.strategy, path, metadata))
        return None if loaded is None else loaded[1]


def _restore_replica_state(model, strategy, path):
    state, file = _replica_state(model), os.path.join(path, REPLICA_STATE)
    if not state or not os.path.exists(file):
        if state:
            print(f"tfdist: the backup {path} holds no exchange state (residuals, "
                  "PowerSGD's Q): it starts afresh", flush=True)
        return
    with np.load(file) as saved:
        arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    replicas = strategy.num_replicas_in_sync
    if [a.shape for a in arrays] != [(replicas, *v.shape) for v in state]:
        print(f"tfdist: the backup {path} holds the exchange state of another layout "
              f"({len(arrays)} variables over {arrays[0].shape[0] if arrays else 0} "
              f"replicas; this run: {len(state)} over {replicas}): it starts afresh",
              flush=True)
        return
    set_replica_values(strategy, state, arrays)


def _built(model):
    """The tfdist optimizers `model` trains with that are built (their hooks too)."""
    return [optimizer for optimizer in optimizers_of(model) if optimizer.built]


def _replica_state(model):
    """The per-replica state of every tfdist optimizer `model` trains with: its hooks',
    and its slots where replicas train apart."""
    state = []
    for optimizer in _built(model):
        pipeline = pipeline_of(optimizer)
        state += pipeline.replica_state()
        if any(hook.replicas_apart for hook in pipeline.hooks):
            state += optimizer_slots(optimizer)
    return state


def _steps(model):
    optimizers = optimizers_of(model) or [getattr(model, "optimizer", None)]
    return None if optimizers[0] is None else int(optimizers[0].iterations.numpy())
