"""Mixed precision on 2 replicas: dynamic loss scaling is part of the transactional step.

One replica's batch is made to overflow at chosen steps (a large but finite input: the
loss stays finite, the scaled float16 gradients do not) while the other's does not. Every
replica must skip the same steps, halve the loss scale identically, and end exactly where
a run that never saw those batches ends (the independent computation: skipping a step
must leave no trace, and scales are powers of two, so nothing else differs) — with each
compressor, a delayed start, local SGD and DiLoCo; in `fit`, the Trainer and your own loop.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.core.loss_scale import LossScaleOptimizer

pytestmark = pytest.mark.usefixtures("two_cpus")

STEPS, BATCH, BAD_STEPS, GROWTH = 8, 32, (2, 5), 3
EXCHANGES = {  # name: DistributedOptimizer options
    "none": {},
    "fp16": {"compression": "fp16", "min_size": 0},
    "int8": {"compression": "int8", "min_size": 0},
    "qsgd": {"compression": "qsgd", "min_size": 0},
    "sign+EF": {"compression": "sign", "error_feedback": True, "min_size": 0},
    "topk+EF": {"compression": "topk", "ratio": 0.3, "error_feedback": True, "min_size": 0},
    "randomk+EF": {"compression": "randomk", "ratio": 0.3, "error_feedback": True,
                   "min_size": 0},
    "powersgd+EF": {"compression": "powersgd", "rank": 2, "error_feedback": True,
                    "min_size": 0},
    "topk+EF from step 3": {"compression": "topk", "ratio": 0.3, "error_feedback": True,
                            "min_size": 0, "start_step": 3},
    "local SGD 2": {"hooks": "local_sgd"},
    "DiLoCo 2": {"hooks": "diloco"},
}


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def model_for(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1, dtype="float32")])


def batches(bad_steps=BAD_STEPS, bad_replica=1):
    """STEPS global batches; at `bad_steps` one sample of `bad_replica`'s half is 300:
    its loss is finite, its gradient times the loss scale overflows float16."""
    rng = np.random.default_rng(0)
    out = []
    for step in range(STEPS):
        x = rng.normal(size=(BATCH, 4)).astype("float32")
        y = x.sum(axis=1, keepdims=True) * 0.5
        if step in bad_steps:
            x[bad_replica * BATCH // 2 + 3] = 300.0
        out.append((x, y))
    return out


def optimizer_for(name, strategy, wrap=None):
    options = dict(EXCHANGES[name])
    hooks = options.pop("hooks", None)
    if hooks:
        period = 2
        hooks = [tfdist.local_sgd.ModelAverager(period) if hooks == "local_sgd"
                 else tfdist.local_sgd.DiLoCo(period, outer={"name": "nesterov",
                                                             "learning_rate": 0.5})]
    compression = options.pop("compression", "none")
    inner = keras.optimizers.SGD(0.01)
    if wrap == "inside":  # DistributedOptimizer(LossScaleOptimizer(...)): the reverse
        inner = keras.optimizers.LossScaleOptimizer(inner, dynamic_growth_steps=GROWTH)
    optimizer = tfdist.keras.DistributedOptimizer(inner, compression, strategy=strategy,
                                                  hooks=hooks or (), **options)
    if wrap == "outside":  # LossScaleOptimizer(DistributedOptimizer(...)), by hand
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, dynamic_growth_steps=GROWTH)
    return optimizer


class Trajectory(keras.callbacks.Callback):
    """After every batch: the loss scale, the step count and the first kernel, on every
    replica."""

    def __init__(self, strategy):
        super().__init__()
        self.strategy, self.scales, self.steps, self.kernels = strategy, [], [], []

    def on_train_batch_end(self, batch, logs=None):
        local = self.strategy.experimental_local_results
        optimizer = self.model.optimizer
        self.scales.append([float(v) for v in local(optimizer.dynamic_scale.value)])
        self.steps.append(int(optimizer.iterations.numpy()))
        self.kernels.append([k.numpy() for k in local(self.model.layers[0].kernel.value)])


def weights(strategy, model):
    """[replica][variable] arrays."""
    local = strategy.experimental_local_results
    return list(zip(*[[v.numpy() for v in local(w.value)] for w in model.weights]))


def fit(strategy, name, data, wrap=None):
    with strategy.scope():
        model = model_for()
        optimizer = optimizer_for(name, strategy, wrap)
        model.compile(optimizer, "mse")  # under mixed_float16: Keras adds the loss scale
        model.optimizer.dynamic_growth_steps = GROWTH
    trajectory = Trajectory(strategy)
    x, y = (np.concatenate(part) for part in zip(*data))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
              callbacks=[tfdist.callbacks.TrainingHooks(), trajectory])
    return model, trajectory


def expected_scales(bad_steps=BAD_STEPS):
    """Keras' schedule: halve on an overflow, double after GROWTH committed steps."""
    scale, run, scales = 2.0 ** 15, 0, []
    for step in range(STEPS):
        if step in bad_steps:
            scale, run = scale / 2, 0
        else:
            run += 1
            if run == GROWTH:
                scale, run = scale * 2, 0
        scales.append(scale)
    return scales


def assert_skipped_everywhere(trajectory, bad_steps=BAD_STEPS, synchronous=True):
    """The same loss scale on both replicas, on Keras' schedule; the step count skips the
    bad steps; nothing changed in them, on either replica; weights finite (and identical
    on both replicas, unless local SGD lets them differ between averages)."""
    for replicas in trajectory.scales:
        assert replicas[0] == replicas[1]
    assert [s[0] for s in trajectory.scales] == expected_scales(bad_steps)
    committed = [step not in bad_steps for step in range(STEPS)]
    assert trajectory.steps == list(np.cumsum(committed))
    for step, kernels in enumerate(trajectory.kernels):
        if synchronous:
            np.testing.assert_array_equal(kernels[0], kernels[1])
        for replica in (0, 1):
            assert np.isfinite(kernels[replica]).all()
            if step in bad_steps:  # a skipped step changed nothing
                np.testing.assert_array_equal(kernels[replica],
                                              trajectory.kernels[step - 1][replica])


def assert_same_model(strategy, model, reference):
    mine, theirs = weights(strategy, model), weights(strategy, reference)
    for replica in mine:
        for a, b in zip(replica, theirs[0]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(EXCHANGES))
def test_fit_skips_an_overflow_on_one_replica_everywhere_and_leaves_no_trace(
        strategies, mixed_float16, name):
    strategy = strategies("mirrored")
    model, trajectory = fit(strategy, name, batches())
    assert isinstance(model.optimizer, LossScaleOptimizer)  # Keras' own, taken over
    assert_skipped_everywhere(trajectory, synchronous="hooks" not in EXCHANGES[name])
    clean = [b for step, b in enumerate(batches()) if step not in BAD_STEPS]
    reference, _ = fit(strategy, name, clean)
    assert_same_model(strategy, model, reference)


@pytest.mark.parametrize("wrap", ["outside", "inside"])
def test_every_composition_a_keras_user_writes_runs_the_same_step(strategies,
                                                                  mixed_float16, wrap):
    """LossScaleOptimizer(DistributedOptimizer(...)) and DistributedOptimizer(
    LossScaleOptimizer(...)) train exactly as compile's own wrapping."""
    strategy = strategies("mirrored")
    model, trajectory = fit(strategy, "topk+EF", batches(), wrap=wrap)
    assert isinstance(model.optimizer, LossScaleOptimizer)
    assert_skipped_everywhere(trajectory)
    reference, _ = fit(strategy, "topk+EF", batches())
    assert_same_model(strategy, model, reference)
