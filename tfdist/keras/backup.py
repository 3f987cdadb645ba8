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
import zipfile

import numpy as np

from tfdist.checkpoint import CheckpointError, CheckpointStore
from tfdist.checkpoint.files import check_path, open_regular
from tfdist.checkpoint.store import check_json
from tfdist.keras.written import writing
from tfdist.limits import MAX_LOGICAL_CPUS, MAX_TASKS
from tfdist.loop.driver import before_backup
from tfdist.seam.optimizer import pipeline_of
from tfdist.seam.owned import optimizers_of
from tfdist.step.resize import describe, resized_rows
from tfdist.step.variables import (gather_replica_values, optimizer_slots,
                                   set_replica_values)
from tfdist.strategies.task import barrier, is_chief

WEIGHTS = "backup.weights.h5"
#: Each replica's own state of the exchange, stacked over all replicas.
REPLICA_STATE = "replica_state.npz"
#: The metadata keys tfdist writes itself (BackupAndRestore adds epoch, batch, epochs).
RESERVED = ("steps", "hooks", "policy", "seeds", "checkpoint", "replicas", "replica_state")
#: A step count no run reaches (an int64 optimizer counter, with room).
MAX_STEPS = 2**62
#: What a file of a backup may hold beyond its variables' bytes (HDF5's or NumPy's own).
_FILE_OVERHEAD, _VARIABLE_OVERHEAD = 1 << 20, 1 << 14


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
            if id(v) not in weights and np.issubdtype(_numpy_dtype(v), np.integer)]


def _seed_values(model, seeds):
    """`seeds` (a backup's lists of integers) as arrays for `seed_states(model)`, or None
    when they do not fit them (count, size, the dtype's range)."""
    states = seed_states(model)
    if not isinstance(seeds, list) or len(seeds) != len(states):
        return None
    arrays = []
    for state, values in zip(states, seeds):
        dtype = _numpy_dtype(state)
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
                "replicas": (_replica_group(model) or strategy).num_replicas_in_sync,
                "hooks": [pipeline_of(o).saved_state.checkpoint_states() for o in _built(model)],
                "seeds": [np.asarray(v.numpy()).ravel().tolist() for v in seed_states(model)]}
    values = gather_replica_values(strategy, _replica_state(model), _replica_group(model))
    if values:  # ties the file to this backup: another run's (or a changed one) is refused
        metadata["replica_state"] = [_digest(np.asarray(v)) for v in values]

    def write(path):
        model.save_weights(os.path.join(path, WEIGHTS))
        if values:
            np.savez(os.path.join(path, REPLICA_STATE), *values)

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
    check_path(weights, _bound(list(model.weights) + _optimizer_variables(model), copies=3))
    try:
        model.load_weights(weights)
    except ValueError as error:
        raise CheckpointError(f"the backup {path} does not fit this model: "
                              f"{' '.join(str(error).split())[:300]}") from None
    _restore_replica_state(model, strategy, path, metadata.get("replica_state"))
    for state, value in zip(seed_states(model), _seed_values(model, metadata.get("seeds"))
                            or []):
        state.assign(value)
    replicas = (_replica_group(model) or strategy).num_replicas_in_sync
    resized = metadata.get("replicas") not in (None, replicas)
    for optimizer, states in zip(_built(model), metadata.get("hooks") or []):
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


def _restore_replica_state(model, strategy, path, digests=None):
    state, file = _replica_state(model), os.path.join(path, REPLICA_STATE)
    if not state or not os.path.lexists(file):
        if state:
            print(f"tfdist: the backup {path} holds no exchange state (residuals, "
                  "PowerSGD's Q): it starts afresh", flush=True)
        return
    group = _replica_group(model)
    replicas = (group or strategy).num_replicas_in_sync
    held = list(range(len(state)))  # the indices of `state` the file holds
    old, fits = _layout_of(file, state)  # from the headers: who wrote it, in which shapes
    if old is None and any(_added_later(v) for v in state):
        held = [i for i, v in enumerate(state) if not _added_later(v)]
        old, fits = _layout_of(file, [state[i] for i in held])
    state_all, state = state, [state[i] for i in held]
    kept = [v for v, fit in zip(state, fits or []) if fit]
    arrays = None if old is None else _read_arrays(
        file, [((old, *map(int, v.shape)), _numpy_dtype(v)) for v in kept], _bound(kept, old),
        names=[f"arr_{i}.npy" for i, fit in enumerate(fits) if fit])
    if arrays is not None and digests is not None:
        _check_digests(file, digests, [i for i, fit in enumerate(fits) if fit], arrays)
    if arrays is None:
        print(f"tfdist: the backup {path} holds the exchange state of another layout "
              f"(this run: {len(state)} variables over {replicas} replicas): it starts "
              "afresh", flush=True)
    elif old == replicas and all(fits):
        set_replica_values(strategy, state, arrays, group)
    else:
        _restore_resized(model, strategy, path, state_all, dict(zip(
            [held[i] for i, fit in enumerate(fits) if fit], arrays)), old, replicas, group)


#: Replica state added after backups were already written (local SGD's rows since the last
#: synchronisation): a backup without it restores the rest, and it starts from zero.
ADDED_LATER = ("tfdist_rows_since_sync",)


def _added_later(variable):
    return any(name in variable.name for name in ADDED_LATER)


def _restore_resized(model, strategy, path, state, arrays, old, replicas, group):
    """The backup's exchange state (`arrays`: by variable index, written by `old`
    replicas) carried onto this run's `replicas` by each variable's rule
    (`tfdist.step.resize`), in one line; a variable whose shape changed with the layout (an
    exchange between islands, sharded by island size) starts afresh."""
    rules = [rule if i in arrays else "afresh" for i, rule in enumerate(_replica_rules(model))]
    resized = [None if rule == "afresh" else resized_rows(arrays[i], replicas, rule)
               for i, rule in enumerate(rules)]
    carried = [(v, rows) for v, rows in zip(state, resized) if rows is not None]
    set_replica_values(strategy, [v for v, _ in carried], [rows for _, rows in carried], group)
    print(f"tfdist: the backup {path} holds {describe(rules, old, replicas)}", flush=True)


def _digest(array):
    """A short digest of an array's dtype, shape and bytes."""
    array = np.ascontiguousarray(array)
    head = f"{array.dtype.str}{array.shape}".encode()
    return hashlib.sha256(head + array.tobytes()).hexdigest()[:32]


def _check_digests(file, digests, indices, arrays):
    """Raises CheckpointError unless `arrays` (the file's `indices`) are the ones the
    backup's metadata recorded (`digests`): a file copied from another run, or changed."""
    changed = [f"arr_{i}" for i, array in zip(indices, arrays)
               if i >= len(digests) or digests[i] != _digest(array)]
    if changed:
        raise CheckpointError(
            f"{file} is not the one this backup wrote ({', '.join(changed[:4])} differ from "
            f"the digests in its {os.path.basename(os.path.dirname(file))}/metadata.json: "
            "another run's exchange state, or a changed file); remove "
            f"{os.path.dirname(file)} to resume from the backup before it")


def _layout_of(file, state):
    """(replicas, fits): the number of replicas the backup's exchange state was written by
    (every array's first dimension), and for each of `state` whether its array holds that
    variable's shape — or (None, None) — from the headers only, before any array is read
    (the arrays are then read within that many replicas' bytes)."""
    limit = _bound(state, MAX_LOGICAL_CPUS * MAX_TASKS)
    with open_regular(file, limit) as f, zipfile.ZipFile(f) as archive:
        names = [f"arr_{i}.npy" for i in range(len(state))]
        if sorted(archive.namelist()) != sorted(names):
            return None, None
        firsts, fits = set(), []
        for name, variable in zip(names, state):
            with archive.open(name) as member:
                version = np.lib.format.read_magic(member)
                shape = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                         else np.lib.format.read_array_header_2_0)(member)[0]
            if len(shape) < 1:
                return None, None
            fits.append(tuple(shape[1:]) == tuple(map(int, variable.shape)))
            firsts.add(shape[0])
        if len(firsts) != 1 or min(firsts) < 1 or not any(fits):
            return None, None
        return firsts.pop(), fits


def _read_arrays(file, expected, limit, names=None):
    """The arrays `names` (default: all, in order) of the `.npz` file, or None if their
    shapes and dtypes are not `expected` — judged from each array's header, before any
    array is read (no pickles)."""
    with open_regular(file, limit) as f, zipfile.ZipFile(f) as archive:
        every = names is None
        names = [f"arr_{i}.npy" for i in range(len(expected))] if every else names
        if not set(names) <= set(archive.namelist()) or (
                every and sorted(archive.namelist()) != sorted(names)):
            return None
        arrays = []
        for name, (shape, dtype) in zip(names, expected):
            info, data = archive.getinfo(name), dtype.itemsize * int(np.prod(shape))
            # stored as np.savez stores (no inflating), holding every byte its header declares
            if not data <= info.file_size <= data + _VARIABLE_OVERHEAD \
                    or info.compress_size != info.file_size:
                return None
            with archive.open(name) as member:
                version = np.lib.format.read_magic(member)
                header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                          else np.lib.format.read_array_header_2_0)(member)
            _check_dtype(file, name, header[2], dtype)
            if header[0] != shape:
                return None
            with archive.open(name) as member:
                arrays.append(np.lib.format.read_array(member, allow_pickle=False).view(dtype))
        return arrays


def _check_dtype(file, name, declared, dtype):
    """Raises CheckpointError unless the array `name` of `file` is declared as `dtype` (the
    variable's; NumPy writes a dtype of its own, e.g. bfloat16, as bytes: 'V2')."""
    if declared.hasobject:
        raise CheckpointError(
            f"{file} declares {name} as Python objects (read only by unpickling, which tfdist "
            f"never does): it is not a backup tfdist wrote; remove {os.path.dirname(file)} "
            f"to resume from the backup before it. Received: dtype={declared}")
    if declared != dtype and not (declared.kind == dtype.kind == "V" and not declared.fields
                                  and declared.itemsize == dtype.itemsize):
        raise CheckpointError(
            f"{file} declares {name} as {declared}, but the variable it restores is {dtype}: "
            f"it is not the exchange state this backup wrote; remove {os.path.dirname(file)} "
            f"to resume from the backup before it. Received: dtype={declared}")


def _bound(variables, copies=1):
    """The most bytes a file holding `variables` (`copies` of each) can take."""
    return _FILE_OVERHEAD + sum(
        copies * int(np.prod(v.shape)) * _numpy_dtype(v).itemsize + _VARIABLE_OVERHEAD
        for v in variables)


def _numpy_dtype(variable):
    import tensorflow as tf

    return np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype)


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


def _built(model):
    """The tfdist optimizers `model` trains with that are built (their hooks too)."""
    return [optimizer for optimizer in optimizers_of(model) if optimizer.built]


def _replica_state(model):
    """The per-replica state of every tfdist optimizer `model` trains with: its hooks',
    and its slots where replicas train apart."""
    state = []
    for optimizer in _built(model):
        pipeline = pipeline_of(optimizer)
        state += pipeline.saved_state.replica_state()
        if any(hook.replicas_apart for hook in pipeline.hooks):
            state += optimizer_slots(optimizer, distributed=pipeline.replica_group is None)
    return state


def _replica_rules(model):
    """How each of `_replica_state(model)` goes onto another number of replicas: the hooks'
    rules; optimizer slots of replicas training apart take their mean (as
    `average_optimizer_state` does at a synchronisation)."""
    rules = []
    for optimizer in _built(model):
        pipeline = pipeline_of(optimizer)
        rules += pipeline.saved_state.replica_state_rules()
        if any(hook.replicas_apart for hook in pipeline.hooks):
            rules += ["mean"] * len(optimizer_slots(
                optimizer, distributed=pipeline.replica_group is None))
    return rules


def _replica_group(model):
    """The replicas `model`'s optimizers exchange between when not the strategy's (each
    process one: `tfdist.horovod`), or None."""
    return next((pipeline_of(o).replica_group for o in _built(model)
                 if pipeline_of(o).replica_group is not None), None)


def _steps(model):
    optimizers = optimizers_of(model) or [getattr(model, "optimizer", None)]
    return None if optimizers[0] is None else int(optimizers[0].iterations.numpy())
