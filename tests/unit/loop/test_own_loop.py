"""Your own `tf.GradientTape` loop on tfdist: TensorFlow's "Custom training with
tf.distribute.Strategy" tutorial loop, with its optimizer wrapped by tfdist.

The loop below is the tutorial's (per-example loss, `tf.nn.compute_average_loss`,
`strategy.run` inside a `tf.function`, `strategy.reduce` of the losses), on Keras 3.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")
GLOBAL_BATCH = 32


def tutorial_loop(strategy, optimizer_fn, steps, phased=False):
    """Trains the conv model `steps` steps the tutorial's way; returns (weights, losses)."""
    from models import conv_model, dataset

    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
        optimizer = optimizer_fn()
        optimizer.build(model.trainable_variables)  # before the first strategy.run
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                 reduction=None)

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH)

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    step = (tfdist.function(distributed_train_step, model=model, optimizer=optimizer)
            if phased else tf.function(distributed_train_step))
    data = strategy.experimental_distribute_dataset(dataset(GLOBAL_BATCH * steps, GLOBAL_BATCH))
    losses = [float(step(batch)) for batch in data]
    return [w.numpy() for w in model.weights], losses


def test_tfdist_exchange_in_the_tutorial_loop_equals_the_plain_loop(strategies):
    strategy = strategies("mirrored")
    plain, plain_losses = tutorial_loop(strategy, lambda: keras.optimizers.Adam(0.01), 4)
    routed, losses = tutorial_loop(strategy, lambda: tfdist.keras.DistributedOptimizer(
        keras.optimizers.Adam(0.01), "none"), 4)
    for a, b in zip(plain, routed):
        np.testing.assert_array_equal(a, b)
    assert losses == plain_losses


def test_delayed_start_in_your_own_loop_with_tfdist_function(strategies):
    """Uncompressed up to start_step (equal to the plain loop), compressed after (not)."""
    strategy = strategies("mirrored")

    def sign_from_step_3():
        return tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), "sign",
                                                 error_feedback=True, start_step=3, min_size=64)

    for steps, same in ((3, True), (5, False)):
        plain, _ = tutorial_loop(strategy, lambda: keras.optimizers.SGD(0.05), steps)
        delayed, _ = tutorial_loop(strategy, sign_from_step_3, steps, phased=True)
        equal = all(np.array_equal(a, b) for a, b in zip(plain, delayed))
        assert equal == same, steps


def test_without_tfdist_function_a_delayed_start_says_what_to_do(strategies):
    strategy = strategies("mirrored")
    with pytest.raises(Exception, match=r"tfdist.function\(fn, model=model\)"):
        tutorial_loop(strategy, lambda: tfdist.keras.DistributedOptimizer(
            keras.optimizers.SGD(0.05), "sign", start_step=3, min_size=64), 2)


def test_an_optimizer_built_inside_the_replica_is_a_clear_error(strategies):
    from models import conv_model, dataset, loss

    strategy = strategies("mirrored")
    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(), "topk")

    def train_step(x, y):
        with tf.GradientTape() as tape:
            value = loss()(y, model(x, training=True))
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    x, y = next(iter(strategy.experimental_distribute_dataset(dataset(32, 32))))
    with pytest.raises(ValueError, match=r"optimizer.build\(model.trainable_variables\)"):
        tf.function(lambda: strategy.run(train_step, args=(x, y)))()


def test_a_nan_in_your_own_loop_is_refused_on_every_replica(strategies):
    """The tutorial loop with a NaN in replica 1's half of the second batch: the step
    raises tfdist's error and every replica's weights and slots are as after the first."""
    from models import conv_model, images
    from tfdist.step.variables import underlying

    strategy = strategies("mirrored")
    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(0.01), "sign",
                                                      error_feedback=True, min_size=64)
        optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                              global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    step = tf.function(lambda x, y: strategy.run(train_step, args=(x, y)))
    x, y = images(2 * GLOBAL_BATCH)
    x[GLOBAL_BATCH + 20, 1, 1, 0] = np.nan  # the second batch, replica 1's half
    batches = iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)))

    def every_replica():
        return [value.numpy() for v in model.weights + optimizer.variables
                for value in strategy.experimental_local_results(underlying(v))]

    step(*next(batches))
    before = every_replica()
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf gradient"):
        step(*next(batches))
    for a, b in zip(before, every_replica()):
        np.testing.assert_array_equal(a, b)


def test_tfdist_function_needs_a_routed_optimizer():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="DistributedOptimizer"):
        tfdist.function(lambda: None, model=model, optimizer=keras.optimizers.SGD())
