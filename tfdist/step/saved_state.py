"""What a backup keeps of the hooks — the `Stateful` protocol, apart from the hook
contract (`tfdist.step.hooks`): a hook that holds state defines any of its methods — or
gives an object that does as its `stateful` attribute, looked up the way `abilities` are —
and `SavedState` reads each one it has (the others mean "nothing to keep").

    saveables()               Keras objects whose state a checkpoint of the optimizer
                              must hold (DiLoCo's outer optimizer), after `build`
    replica_state()           variables each replica holds its own value of (error
                              feedback's residuals, PowerSGD's Q, local SGD's weights),
                              gathered from every replica of every worker
    replica_state_rules()     how each goes onto another number of replicas
                              (`tfdist.step.resize`), in the same order ("afresh")
    checkpoint_state()        JSON values, the same on every worker (`compression: auto`'s
                              decision, local SGD's schedule), or None
    restore_checkpoint_state(state)   takes one back, on every worker, before training
    restore_resized_checkpoint_state(state, old, new)   one of a run on `old` replicas
    measures_the_cluster      (attribute) its checkpoint state is a measurement of the
                              cluster: restored onto another number of replicas, it
                              measures again instead
"""

from typing import Protocol


class Stateful(Protocol):
    """The methods a hook with state may define (see the module)."""

    def saveables(self): ...

    def replica_state(self): ...

    def replica_state_rules(self): ...

    def checkpoint_state(self): ...

    def restore_checkpoint_state(self, state): ...

    def restore_resized_checkpoint_state(self, state, old, new): ...


def stateful(hook):
    """What holds `hook`'s saved state: its `stateful` attribute, else the hook itself."""
    return getattr(hook, "stateful", None) or hook


def _call(hook, name, default, *args):
    method = getattr(stateful(hook), name, None)
    return default if method is None else method(*args)


class SavedState:
    """The saved state of `hooks` (a pipeline's), each hook's in order."""

    def __init__(self, hooks):
        self.hooks = hooks

    def saveables(self):
        return [s for hook in self.hooks for s in _call(hook, "saveables", [])]

    def replica_state(self):
        return [v for hook in self.hooks for v in _call(hook, "replica_state", [])]

    def replica_state_rules(self):
        return [r for hook in self.hooks for r in _call(
            hook, "replica_state_rules", ["afresh"] * len(_call(hook, "replica_state", [])))]

    def checkpoint_states(self):
        """One per hook (None: nothing kept), in order."""
        return [_call(hook, "checkpoint_state", None) for hook in self.hooks]

    def restore_checkpoint_states(self, states, resized=None):
        """Gives each hook its state of `checkpoint_states()` back; False (nothing given)
        when the hooks are not those the states came from. `resized`: (the backup's
        replicas, this run's) when they differ (`restore_resized`)."""
        if not isinstance(states, list) or len(states) != len(self.hooks):
            return False
        for hook, state in zip(self.hooks, states):
            if state is None:
                continue
            if resized is not None:
                restore_resized(hook, state, *resized)
            else:
                _call(hook, "restore_checkpoint_state", None, state)
        return True


def restore_resized(hook, state, old, new):
    """A `checkpoint_state()` of a run on `old` replicas into this one on `new`: the
    hook's own `restore_resized_checkpoint_state` if it has one, else as it was saved —
    unless it `measures_the_cluster`: then it measures again, which it says in one line."""
    if hasattr(stateful(hook), "restore_resized_checkpoint_state"):
        return stateful(hook).restore_resized_checkpoint_state(state, old, new)
    if not getattr(stateful(hook), "measures_the_cluster", False):
        return _call(hook, "restore_checkpoint_state", None, state)
    print(f"tfdist: {type(hook).__name__}'s kept choice was measured on {old} replicas "
          f"and this run has {new}: it measures again", flush=True)
    return None
