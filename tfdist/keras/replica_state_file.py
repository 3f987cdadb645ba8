"""Each replica's own state in a backup: `replica_state.npz`, one array per variable
stacked over every replica of every worker — the exchange's (error-feedback residuals,
PowerSGD's P and Q, EF21's estimates) and, where replicas train apart (local SGD,
DiLoCo), their weights, optimizer slots and anchors. Read from the headers first (who
wrote it, in which shapes), within that many replicas' bytes, checked against the
digests in the backup's metadata, and given back to each replica — by each variable's
rule onto another number of replicas (`tfdist.step.resize`), afresh for another layout.
"""

import hashlib
import os
import zipfile

import numpy as np

from tfdist.checkpoint import CheckpointError
from tfdist.checkpoint.files import open_regular
from tfdist.limits import MAX_LOGICAL_CPUS, MAX_TASKS
from tfdist.seam.optimizer import pipeline_of
from tfdist.seam.owned import optimizers_of
from tfdist.step.resize import describe, resized_rows
from tfdist.step.variables import optimizer_slots, set_replica_values

#: Each replica's own state of the exchange, stacked over all replicas.
REPLICA_STATE = "replica_state.npz"
#: What a file of a backup may hold beyond its variables' bytes (HDF5's or NumPy's own).
_FILE_OVERHEAD, _VARIABLE_OVERHEAD = 1 << 20, 1 << 14


#: Replica state added after backups were already written (local SGD's rows since the last
#: synchronisation): a backup without it restores the rest, and it starts from zero.
ADDED_LATER = ("tfdist_rows_since_sync",)


def built(model):
    """The tfdist optimizers `model` trains with that are built (their hooks too)."""
    return [optimizer for optimizer in optimizers_of(model) if optimizer.built]


def replica_state(model):
    """The per-replica state of every tfdist optimizer `model` trains with: its hooks',
    and its slots where replicas train apart."""
    state = []
    for optimizer in built(model):
        pipeline = pipeline_of(optimizer)
        state += pipeline.saved_state.replica_state()
        if any(hook.replicas_apart for hook in pipeline.hooks):
            state += optimizer_slots(optimizer, distributed=pipeline.replica_group is None)
    return state


def replica_rules(model):
    """How each of `replica_state(model)` goes onto another number of replicas: the hooks'
    rules; optimizer slots of replicas training apart take their mean (as
    `average_optimizer_state` does at a synchronisation)."""
    rules = []
    for optimizer in built(model):
        pipeline = pipeline_of(optimizer)
        rules += pipeline.saved_state.replica_state_rules()
        if any(hook.replicas_apart for hook in pipeline.hooks):
            rules += ["mean"] * len(optimizer_slots(
                optimizer, distributed=pipeline.replica_group is None))
    return rules


def replica_group(model):
    """The replicas `model`'s optimizers exchange between when not the strategy's (each
    process one: `tfdist.horovod`), or None."""
    return next((pipeline_of(o).replica_group for o in built(model)
                 if pipeline_of(o).replica_group is not None), None)


def restore(model, strategy, path, digests=None):
    state, file = replica_state(model), os.path.join(path, REPLICA_STATE)
    if not state or not os.path.lexists(file):
        if state:
            print(f"tfdist: the backup {path} holds no exchange state (residuals, "
                  "PowerSGD's Q): it starts afresh", flush=True)
        return
    group = replica_group(model)
    replicas = (group or strategy).num_replicas_in_sync
    held = list(range(len(state)))  # the indices of `state` the file holds
    old, fits = layout_of(file, state)  # from the headers: who wrote it, in which shapes
    if old is None and any(_added_later(v) for v in state):
        held = [i for i, v in enumerate(state) if not _added_later(v)]
        old, fits = layout_of(file, [state[i] for i in held])
    state_all, state = state, [state[i] for i in held]
    kept = [v for v, fit in zip(state, fits or []) if fit]
    arrays = None if old is None else read_arrays(
        file, [((old, *map(int, v.shape)), numpy_dtype(v)) for v in kept], bound(kept, old),
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


def _added_later(variable):
    return any(name in variable.name for name in ADDED_LATER)


def _restore_resized(model, strategy, path, state, arrays, old, replicas, group):
    """The backup's exchange state (`arrays`: by variable index, written by `old`
    replicas) carried onto this run's `replicas` by each variable's rule
    (`tfdist.step.resize`), in one line; a variable whose shape changed with the layout (an
    exchange between islands, sharded by island size) starts afresh."""
    rules = [rule if i in arrays else "afresh" for i, rule in enumerate(replica_rules(model))]
    resized = [None if rule == "afresh" else resized_rows(arrays[i], replicas, rule)
               for i, rule in enumerate(rules)]
    carried = [(v, rows) for v, rows in zip(state, resized) if rows is not None]
    set_replica_values(strategy, [v for v, _ in carried], [rows for _, rows in carried], group)
    print(f"tfdist: the backup {path} holds {describe(rules, old, replicas)}", flush=True)


def digest(array):
    """A short digest of an array's dtype, shape and bytes."""
    array = np.ascontiguousarray(array)
    head = f"{array.dtype.str}{array.shape}".encode()
    return hashlib.sha256(head + array.tobytes()).hexdigest()[:32]


def _check_digests(file, digests, indices, arrays):
    """Raises CheckpointError unless `arrays` (the file's `indices`) are the ones the
    backup's metadata recorded (`digests`): a file copied from another run, or changed."""
    changed = [f"arr_{i}" for i, array in zip(indices, arrays)
               if i >= len(digests) or digests[i] != digest(array)]
    if changed:
        raise CheckpointError(
            f"{file} is not the one this backup wrote ({', '.join(changed[:4])} differ from "
            f"the digests in its {os.path.basename(os.path.dirname(file))}/metadata.json: "
            "another run's exchange state, or a changed file); remove "
            f"{os.path.dirname(file)} to resume from the backup before it")


def layout_of(file, state):
    """(replicas, fits): the number of replicas the backup's exchange state was written by
    (every array's first dimension), and for each of `state` whether its array holds that
    variable's shape — or (None, None) — from the headers only, before any array is read
    (the arrays are then read within that many replicas' bytes)."""
    limit = bound(state, MAX_LOGICAL_CPUS * MAX_TASKS)
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


def read_arrays(file, expected, limit, names=None):
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


def bound(variables, copies=1):
    """The most bytes a file holding `variables` (`copies` of each) can take."""
    return _FILE_OVERHEAD + sum(
        copies * int(np.prod(v.shape)) * numpy_dtype(v).itemsize + _VARIABLE_OVERHEAD
        for v in variables)


def numpy_dtype(variable):
    import tensorflow as tf

    return np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype)
