"""An exchange that runs one of its candidate exchanges at a time: the one its phase
names (`compression: auto` switches among the compressions it measures). Each candidate
is built, keeps its own per-replica state and is traced in its own phase."""

from tfdist.step.hooks import TrainingHook


class Switching(TrainingHook):
    """The exchange of `hooks[phase]` ({name: an exchange hook}); a subclass says which
    phase each step is (`phase`)."""

    replaces_exchange = True
    phased = True

    def __init__(self, hooks):
        self.hooks, self.active = hooks, None

    def build(self, strategy, variables):
        for hook in self.hooks.values():
            hook.build(strategy, variables)

    def replica_state(self):
        return [v for hook in self.hooks.values() for v in hook.replica_state()]

    def replica_state_rules(self):
        return [r for hook in self.hooks.values() for r in hook.replica_state_rules()]

    def enter_phase(self, phase):
        super().enter_phase(phase)
        self.active = self.hooks[phase]
        self.active.enter_phase(self.active.phase(0))

    def exchange(self, grads, variables, step):
        return self.active.exchange(grads, variables, step)

    def on_step_end(self, step):
        return self.active.on_step_end(step)

    def bytes_per_step(self, step=None):
        """The active candidate's bytes (the first candidate's before any step)."""
        return (self.active or next(iter(self.hooks.values()))).bytes_per_step()
