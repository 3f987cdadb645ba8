"""A hook's phase is a pure query (tfdist/step/hooks.py, `TrainingHook.phase`): for every
hook tfdist ships, reading the phase of any step runs no TensorFlow op (so no collective),
prints nothing and changes none of the hook's state; what decides a phase (auto timing
the link, `warmup_steps: auto` judging step 0) happens in `prepare`, which the driver
calls first."""

import keras
import pytest
from tensorflow.python.framework import op_callbacks

import tfdist
from tfdist.compression import cost_model
from tfdist.compression.link_timer import LinkTimer
from tfdist.config.hyperparameters import NAMES
from tfdist.seam.optimizer import pipeline_of

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")
STEPS = 40
#: Local SGD as users configure it: each part a phase may depend on.
AVERAGERS = {
    "local-sgd-warm-up": dict(period=4, warmup_steps=6),
    "diloco": dict(period=4, outer="nesterov"),
    "streaming-overlapped": dict(period=4, outer="nesterov", fragments=2, overlap_steps=1),
    "auto-warm-up": dict(period=4, warmup_steps="auto", warmup_compression="auto"),
    "fixed-warm-up-auto-exchange": dict(period=4, warmup_steps=8, warmup_compression="auto"),
}


def ops_while(function):
    """(result, the TensorFlow ops run or traced while `function` ran)."""
    seen = []

    def note(op_type, *args, **kwargs):
        seen.append(op_type)

    op_callbacks.add_op_callback(note)
    try:
        result = function()
    finally:
        op_callbacks.remove_op_callback(note)
    return result, seen


def plain(value):
    """`value` with everything but Python's plain values replaced by its type's name."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {repr(plain(k)): plain(v) for k, v in value.items()}
    return type(value).__name__


def state(hook):
    """The hook's plain Python state, nested hooks' too (variables are not phase's to
    change either, and reading them would run ops)."""
    found = {k: plain(v) for k, v in vars(hook).items()}
    for name, inner in vars(hook).items():
        if isinstance(inner, tfdist.TrainingHook):
            found[name] = state(inner)
    for method, inner in (getattr(hook, "hooks", None) or {}).items():
        found[f"hooks[{method}]"] = state(inner)
    return found


def trained_hooks(strategy, callbacks=(), compression=None, **options):
    """The hooks of a model trained 2 steps under fit (the driver prepared steps 0, 1)."""
    from test_local_sgd import fit

    with strategy.scope():
        optimizer = keras.optimizers.Adam(0.01)
        if compression:
            optimizer = tfdist.keras.DistributedOptimizer(optimizer, compression, **options)
    model, _ = fit(strategy, [tfdist.callbacks.TrainingHooks(), *callbacks], steps=2,
                   optimizer=optimizer)
    return pipeline_of(model.optimizer).hooks


def assert_phases_pure(hooks, capfd):
    capfd.readouterr()
    for step in range(STEPS):
        for hook in hooks:
            hook.prepare(step)  # what the driver does first: it may time, say, collect
        capfd.readouterr()
        for hook in hooks:
            before = state(hook)
            (first, second), ops = ops_while(lambda: (hook.phase(step), hook.phase(step)))
            assert ops == [], (type(hook).__name__, step, ops)
            assert first == second and state(hook) == before, (type(hook).__name__, step)
        assert capfd.readouterr() == ("", ""), step


@pytest.fixture
def timed_link(monkeypatch):
    """auto's link as a slow one (its first choice compresses): timing it is no phase's."""
    monkeypatch.setattr(LinkTimer, "time",
                        lambda self: (cost_model.Link(20e6, 1e-4), 0.0))


def test_the_op_record_sees_a_collective(strategies):
    """The check below cannot pass by seeing nothing: an all-reduce is recorded."""
    import tensorflow as tf

    strategy = strategies("mirrored")
    _, ops = ops_while(lambda: strategy.reduce(
        "SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))
    assert ops


@pytest.mark.parametrize("compression", [*NAMES, "auto"])
def test_reading_a_compressors_phase_runs_nothing_and_says_nothing(strategies, capfd,
                                                                   compression, timed_link):
    strategy = strategies("mirrored")
    delayed = {} if compression in ("none", "auto") else dict(min_size=0, start_step=3)
    hooks = trained_hooks(strategy, compression=compression, **delayed)
    if compression == "auto":
        assert hooks[0].link is not None  # prepare timed it, before step 0
    assert_phases_pure(hooks, capfd)


@pytest.mark.parametrize("averager", AVERAGERS.values(), ids=AVERAGERS.keys())
def test_reading_local_sgds_phase_runs_nothing_and_says_nothing(strategies, capfd, averager,
                                                                timed_link):
    strategy = strategies("mirrored")
    hooks = trained_hooks(strategy, [tfdist.callbacks.LocalSGD(**averager)])
    assert_phases_pure(hooks, capfd)


@pytest.mark.parametrize("exchange", ["auto", "auto-warm-up"])
def test_before_the_first_step_reading_the_phase_times_nothing(strategies, capfd, timed_link,
                                                               exchange):
    """The moment a phase used to decide: before any step. Read first, the phase of step
    0 runs nothing, says nothing and changes nothing; `prepare(0)` then times the link."""
    from models import conv_model

    from tfdist.local_sgd import ModelAverager

    strategy = strategies("mirrored")
    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
        averagers = [] if exchange == "auto" else [ModelAverager(
            period=4, warmup_steps="auto", warmup_compression="auto")]
        optimizer = tfdist.keras.DistributedOptimizer(
            keras.optimizers.Adam(0.01), "auto" if exchange == "auto" else "none",
            hooks=averagers)
        optimizer.build(model.trainable_variables)
    hooks = pipeline_of(optimizer).hooks
    capfd.readouterr()
    for hook in hooks:
        before = state(hook)
        _, ops = ops_while(lambda: hook.phase(0))
        assert ops == [] and state(hook) == before, type(hook).__name__
    assert capfd.readouterr() == ("", "")
    for hook in hooks:
        hook.prepare(0)
    assert "link" in capfd.readouterr().out
