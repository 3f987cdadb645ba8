"""The per-step rules written once (`tfdist.loop.runner.StepRunner`): `model.fit`
(`tfdist.callbacks.TrainingHooks`), `tfdist.Trainer` and your own loop (`tfdist.function`)
all call one runner, so a hook sees the same calls, in the same order, at the same steps,
in each — also where the loop reads the data until it ends (the Trainer on a dataset
read to its end began a step past the last batch: an extra `prepare`). The documented
sequence itself is tests/unit/loop/test_hook_contract.py's."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.step.hooks import TrainingHook

pytestmark = pytest.mark.usefixtures("two_cpus")

ROWS, BATCH, EPOCHS = 64, 16, 2


class Recording(TrainingHook):
    """Records each call of the contract's Python side with the step it is given, and
    changes phase at step 3 (so the step is traced again there)."""

    phased = True

    def __init__(self):
        super().__init__()
        self.calls = []

    def plan(self, steps):
        self.calls.append(("plan", steps))

    def prepare(self, step):
        self.calls.append(("prepare", step))

    def phase(self, step):
        return step >= 3

    def enter_phase(self, phase):
        super().enter_phase(phase)
        self.calls.append(("enter_phase", phase))

    def after_step(self, model, steps_done):
        self.calls.append(("after_step", steps_done))

    def before_read(self, model):
        self.calls.append(("before_read", int(model.optimizer.iterations.numpy())))


def data():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(ROWS, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def recorded(strategy, loop):
    x, y = data()
    hook = Recording()
    with strategy.scope():
        keras.utils.set_random_seed(3)
        net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), hooks=[hook])
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    if loop == "fit":
        with strategy.scope():
            net.compile(optimizer, "mse")
        net.fit(batches, epochs=EPOCHS, verbose=0, callbacks=[tfdist.callbacks.TrainingHooks()])
    elif loop == "trainer":
        tfdist.Trainer(net, optimizer, "mse", strategy=strategy).fit(batches, epochs=EPOCHS,
                                                                     verbose=0)
    else:
        net.optimizer = optimizer
        with strategy.scope():
            optimizer.build(net.trainable_variables)

        def replica_step(batch):
            inputs, targets = batch
            with tf.GradientTape() as tape:
                per_example = tf.square(net(inputs, training=True) - targets)[:, 0]
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables))

        step = tfdist.function(lambda batch: strategy.run(replica_step, args=(batch,)),
                               model=net, optimizer=optimizer)
        for _ in range(EPOCHS):
            for batch in strategy.experimental_distribute_dataset(batches):
                step(batch)
            step.before_read()
    return hook.calls, [w.numpy() for w in net.weights]


def test_every_loop_calls_the_hooks_alike(strategies):
    strategy = strategies("mirrored")
    fit, fit_weights = recorded(strategy, "fit")
    trainer, trainer_weights = recorded(strategy, "trainer")
    own, own_weights = recorded(strategy, "own loop")
    steps = EPOCHS * ROWS // BATCH
    assert ("plan", steps) in fit and fit == trainer  # both plan the run's end
    assert own == [call for call in fit if call[0] != "plan"]  # your loop plans nothing
    assert [c for c in fit if c[0] == "after_step"] == [("after_step", s)
                                                        for s in range(1, steps + 1)]
    assert ("enter_phase", True) in fit and ("before_read", ROWS // BATCH) in fit
    for a, b, c in zip(fit_weights, trainer_weights, own_weights):
        np.testing.assert_allclose(a, b, atol=1e-6)
        np.testing.assert_allclose(a, c, atol=1e-6)
