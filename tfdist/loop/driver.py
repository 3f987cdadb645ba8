"""The driver of a training loop's hooks.

One `HookDriver` per loop calls the Python side of the hook contract
(`tfdist.step.hooks`); every loop reaches it through its `tfdist.loop.runner.StepRunner`
(`tfdist.Trainer`, `tfdist.callbacks.TrainingHooks` for `model.fit`, `tfdist.function`
for a `tf.GradientTape` loop). It is the only place that changes phases; the optimizer's
`iterations` is the only step counter.
"""

from tfdist.seam.optimizer import pipeline_of
from tfdist.seam.owned import optimizers_of
from tfdist.seam.routed_step import driving
from tfdist.step.hooks import TrainingHook


class HookDriver:
    """Drives the hooks of every tfdist optimizer a model trains with, from a loop.

    Args:
        model: the Keras model being trained (hooks average or read its variables).
        optimizer: the tfdist optimizer the step applies (`DistributedOptimizer`, also
            inside a `LossScaleOptimizer`), or a list of them (a step with several); by
            default every one the model has (`tfdist.seam.owned.optimizers_of`).

    Raises:
        ValueError: no tfdist optimizer, or a given one that does not exchange through
            tfdist.
    """

    def __init__(self, model, optimizer=None):
        self.model = model
        self.optimizers = optimizers_of(model, optimizer)
        if not self.optimizers:
            found = getattr(model, "optimizer", None) if optimizer is None else optimizer
            raise ValueError(
                "tfdist's hooks run around an optimizer that exchanges through tfdist: wrap "
                "it with tfdist.keras.DistributedOptimizer(optimizer, ...) and build it on "
                "the model's variables (or pass it: optimizer=...). "
                f"Received: optimizer={found!r}")
        self.optimizer = self.optimizers[0]
        self.pipelines = [pipeline_of(o) for o in self.optimizers]
        self.pipeline = self.pipelines[0]
        self._functions = {}  # hooks' phases -> the step traced for them

    def steps(self):
        """Updates done so far by the (first) optimizer (the one step counter)."""
        return _steps(self.optimizer)

    def plan(self, step_calls):
        """Tells every hook the step the loop plans to end at: `step_calls` more calls
        of the step (None: not known), each optimizer's updates over its gradient
        accumulation, from its count now."""
        for optimizer, pipeline in zip(self.optimizers, self.pipelines):
            accumulation = getattr(optimizer, "gradient_accumulation_steps", None) or 1
            end = None if step_calls is None else _steps(optimizer) + step_calls // accumulation
            for hook in pipeline.hooks:
                hook.plan(end)

    def begin_step(self):
        """Prepares each hook for the next step (`prepare`), reads its phase, and enters it
        (every hook's before the first step a pipeline runs, then those that change);
        returns the phases (a cache key)."""
        phases = []
        for optimizer, pipeline in zip(self.optimizers, self.pipelines):
            hooks = pipeline.hooks
            step = _steps(optimizer) if any(h.phased for h in hooks) else 0
            for hook in hooks:
                if hook.phased or not pipeline.driven:
                    hook.prepare(step)
            mine = tuple(hook.phase(step) for hook in hooks)
            for hook, phase in zip(hooks, mine):
                if phase != hook.current_phase or not pipeline.driven:
                    hook.enter_phase(phase)
            pipeline.driven = True
            phases.append(mine)
        return tuple(phases)

    def function(self, make):
        """The compiled step for the next step: `make()` traced once per phase (collectives
        cannot be switched inside one compiled step, `TrainingHook.phase`), called with
        this driver's optimizers the only tfdist ones it may apply."""
        key = self.begin_step()
        if key not in self._functions:
            self._functions[key] = _Driven(make(), self.optimizers)
        return self._functions[key]

    def couples_workers(self):
        """(after `begin_step`) Whether the next step runs a collective across every
        worker; if not (islands between synchronisations), a loop reads the step's logs
        on this worker alone, so that no island waits for another at every step."""
        return all(pipeline.couples_workers() for pipeline in self.pipelines)

    def paced(self):
        """Whether a hook skips some step calls on this worker (heterogeneous islands:
        `island_steps`)."""
        return any(getattr(hook, "pace", None) is not None
                   for pipeline in self.pipelines for hook in pipeline.hooks)

    def skips_next(self):
        """(after `function`) Whether the next step call trains nothing on this worker
        (`TrainingHook.trains_next`): the loop reads no batch (or drops the one it has)
        and calls `skip`."""
        return not all(pipeline.trains_next() for pipeline in self.pipelines)

    def skip(self):
        """Tells the hooks a step call trained nothing; `end_step` follows as after a step."""
        for pipeline in self.pipelines:
            pipeline.skipped()

    def owns(self, function):
        """Whether `function` is one of the steps made here."""
        return any(function is f for f in self._functions.values())

    def end_step(self, steps_done=None):
        """After a step: the `after_step` of every hook that has one (`steps_done` defaults
        to the count of the hook's own optimizer, read only then: a read of the variable
        costs a step about 2 ms)."""
        for optimizer, pipeline in zip(self.optimizers, self.pipelines):
            pipeline.changed = True
            hooks = [hook for hook in pipeline.hooks if _acts_after_step(hook)]
            done = _steps(optimizer) if steps_done is None and hooks else steps_done
            for hook in hooks:
                hook.after_step(self.model, done)

    def before_read(self):
        """Before validation, a checkpoint, an epoch's or the training's end: every hook's
        `before_read`, once after each change (a second call without a step between is free)."""
        _before_read(self.model, self.pipelines)


class _Driven:
    """A compiled step called as the driver's: tracing it refuses a tfdist optimizer the
    driver does not drive (`tfdist.seam.routed_step.driving`)."""

    def __init__(self, function, optimizers):
        self.function, self.optimizers = function, optimizers

    def __call__(self, *args, **kwargs):
        with driving(self.optimizers):
            return self.function(*args, **kwargs)

    def schedule(self, coordinator, args):
        """`coordinator.schedule` of the step (it takes only the `tf.function` itself)."""
        with driving(self.optimizers):
            return coordinator.schedule(self.function, args=args)

    def __getattr__(self, name):  # the tf.function's own (get_concrete_function, ...)
        return getattr(self.function, name)


def _steps(optimizer):
    return int(optimizer.iterations.numpy())


def _acts_after_step(hook):
    return type(hook).after_step is not TrainingHook.after_step


def before_read(model, optimizer=None):
    """Lets the hooks of `model`'s tfdist optimizers (or of `optimizer`, one or a list)
    make one model of the replicas before something reads or saves it, if a step ran
    since they last did; on every worker."""
    _before_read(model, [pipeline_of(o) for o in optimizers_of(model, optimizer)])


def before_backup(model):
    """Lets the hooks of `model`'s tfdist optimizers prepare a backup (`before_backup`) if a
    step ran since they last made one model; on every worker. A later read still makes
    one model."""
    for optimizer in optimizers_of(model):
        pipeline = pipeline_of(optimizer)
        if pipeline.changed:
            pipeline.before_backup(model, _steps(optimizer))


def _before_read(model, pipelines):
    for pipeline in pipelines:
        if not pipeline.changed:
            continue
        pipeline.changed = False
        for hook in pipeline.hooks:
            hook.before_read(model)
