"""The update stage of a step (`tfdist.step.update`): a hook of yours changes which
variables a step updates through the public `Updater` protocol alone — nothing in
`tfdist.seam` touched — and it holds under `model.fit`, `tfdist.Trainer` and your own
loop (`tfdist.function`), compared with plain Keras on one device where the variables it
leaves alone are not trainable."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.step.hooks import TrainingHook
from tfdist.step.update import Wrapping
from tfdist.step.variables import underlying

pytestmark = pytest.mark.usefixtures("two_cpus")

ROWS, BATCH = 64, 16


class EveryOther(Wrapping):
    """Updates the variables of even index only (the kernels of a Dense stack)."""

    def __init__(self, inner, kept):
        super().__init__(inner)
        self.kept = kept

    def updates(self, variable):
        return id(variable) in self.kept and self.inner.updates(variable)


class UpdateEveryOther(TrainingHook):
    """A hook with the `Updates` ability: its updater is built on the one before it."""

    def build(self, strategy, variables):
        self.kept = {id(underlying(v)) for v in variables[::2]}

    def updater(self, inner):
        return EveryOther(inner, self.kept)


def data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, 5)).astype("float32")
    return x, (x @ rng.normal(size=(5, 2))).astype("float32")


def model():
    keras.utils.set_random_seed(11)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"),
                             keras.layers.Dense(2)])


def one_device():
    """Plain Keras, one device, the biases not trainable."""
    net = model()
    for layer in net.layers:
        layer.bias.trainable = False
    net.compile(keras.optimizers.SGD(0.05, momentum=0.5), "mse")
    net.fit(*data(), batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return [w.numpy() for w in net.weights]


def trained(strategy, loop):
    x, y = data()
    with strategy.scope():
        net = model()
        optimizer = tfdist.keras.DistributedOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.5), hooks=[UpdateEveryOther()])
    if loop == "fit":
        with strategy.scope():
            net.compile(optimizer, "mse")
        net.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                callbacks=[tfdist.callbacks.TrainingHooks()])
    elif loop == "trainer":
        trainer = tfdist.Trainer(net, optimizer, "mse", strategy=strategy)
        trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), epochs=2,
                    verbose=0)
    else:
        own_loop(strategy, net, optimizer, x, y)
    return [[t.numpy() for t in strategy.experimental_local_results(w.value)]
            for w in net.weights]


def own_loop(strategy, net, optimizer, x, y):
    """TensorFlow's custom-training tutorial loop, compiled by `tfdist.function`."""
    with strategy.scope():
        optimizer.build(net.trainable_variables)

    def replica_step(batch):
        inputs, targets = batch
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(net(inputs, training=True) - targets), -1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
        grads = tape.gradient(loss, net.trainable_variables)
        optimizer.apply_gradients(zip(grads, net.trainable_variables))

    step = tfdist.function(lambda batch: strategy.run(replica_step, args=(batch,)),
                           model=net, optimizer=optimizer)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    for _ in range(2):
        for batch in strategy.experimental_distribute_dataset(batches):
            step(batch)


@pytest.mark.parametrize("loop", ["fit", "trainer", "own loop"])
def test_a_hook_of_yours_updates_every_other_variable_in_every_loop(strategies, loop):
    """The biases (odd indices) stay as built on every replica; the kernels end where
    one device ends with the biases frozen."""
    initial = [w.numpy() for w in model().weights]
    expected = one_device()
    for index, (replicas, want, first) in enumerate(zip(trained(strategies("mirrored"), loop),
                                                        expected, initial)):
        for value in replicas:
            if index % 2:
                np.testing.assert_array_equal(value, first)
            else:
                assert not np.array_equal(value, first)
                np.testing.assert_allclose(value, want, atol=1e-6)


@pytest.mark.parametrize("made", [None, "sgd", object()])
def test_an_updater_that_is_not_one_is_refused_in_one_line_naming_the_hook(made):
    """A hook whose `updater(inner)` returns anything but an `Updater` is refused when
    the step is traced, naming the hook and what to return."""
    from tfdist.step.hooks import GradientPipeline

    class Broken(TrainingHook):
        def updater(self, inner):
            return made

    with pytest.raises(TypeError) as refused:
        GradientPipeline([Broken()]).updater()
    message = str(refused.value)
    assert message.startswith("Broken.updater(inner) must return a tfdist.step.update.Updater")
    assert "Received: " in message and "\n" not in message


def test_updaters_chain_in_hook_order():
    """Each hook's updater is built on the one before it, Keras' own first."""
    from tfdist.step.hooks import GradientPipeline
    from tfdist.step.update import Updater

    class Named(Wrapping):
        def __init__(self, inner, name):
            super().__init__(inner)
            self.name = name

    class Hook(TrainingHook):
        def __init__(self, name):
            self.name = name

        def updater(self, inner):
            return Named(inner, self.name)

    updater = GradientPipeline([Hook("a"), TrainingHook(), Hook("b")]).updater()
    assert updater.name == "b" and updater.inner.name == "a"
    assert type(updater.inner.inner) is Updater
