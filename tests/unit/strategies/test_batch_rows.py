"""A global batch the replicas do not divide (tfdist/strategies/batch_rows.py): each
replica's gradient weighs its share of the rows, so that 15 over 2 replicas (8/7) trains as
one device does, under `fit` and the Trainer, with the exact and the fp16 exchange; your own
loop (which scales its loss itself) is left as it is; `replica_batch_size` splits a global
batch over input pipelines that do not divide it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.strategies import batch_rows

pytestmark = pytest.mark.usefixtures("two_cpus")

ROWS, BATCH, EPOCHS = 45, 15, 2  # 3 steps an epoch, each split 8/7 over 2 replicas


def data(family="dense"):
    rng = np.random.default_rng(3)
    if family == "sequence":  # token ids: an Embedding's gradient is an IndexedSlices
        x = rng.integers(0, 20, size=(ROWS, 5)).astype("int32")
        return x, rng.normal(size=(ROWS, 3)).astype("float32")
    x = rng.normal(size=(ROWS, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 3))).astype("float32")
    return x, y


def model(family="dense"):
    keras.utils.set_random_seed(5)
    if family == "sequence":  # an Embedding, then a Dense over the sequence
        return keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4),
                                 keras.layers.Dense(8, activation="tanh"),
                                 keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3)])


def one_device(family="dense"):
    net = model(family)
    net.compile(keras.optimizers.SGD(0.1), "mse")
    x, y = data(family)
    net.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return [w.numpy() for w in net.weights]


@pytest.fixture(scope="module")
def reference():
    return one_device()


@pytest.fixture(scope="module")
def mirrored(two_cpus):
    return tfdist.get_strategy("mirrored", logical_cpus=2)


def trained(strategy, loop, compression, family="dense"):
    x, y = data(family)
    with strategy.scope():
        net = model(family)
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1), compression)
    if loop == "fit":
        with strategy.scope():
            net.compile(optimizer, "mse")
        net.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    else:
        trainer = tfdist.Trainer(net, optimizer, "mse", strategy=strategy)
        trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), epochs=EPOCHS,
                    verbose=0)
    return [[t.numpy() for t in strategy.experimental_local_results(w)] for w in net.weights]


@pytest.mark.parametrize("loop", ["fit", "trainer"])
@pytest.mark.parametrize("compression, tolerance", [("none", 1e-6), ("fp16", 2e-4)])
def test_fifteen_over_two_replicas_trains_as_one_device(mirrored, reference, loop,
                                                        compression, tolerance):
    """8 rows on one replica, 7 on the other: every replica ends with one device's weights
    (fp16 to its rounding of the gradients)."""
    for expected, replicas in zip(reference, trained(mirrored, loop, compression)):
        for value in replicas:
            np.testing.assert_allclose(value, expected, atol=tolerance)


@pytest.mark.parametrize("loop", ["fit", "trainer"])
def test_an_embedding_and_a_dense_over_a_sequence_train_as_one_device(mirrored, loop):
    """The Embedding's IndexedSlices gradient is weighed as rows too (kept sparse), and the
    Dense over the sequence's: 15 over 2 replicas ends where one device does."""
    reference = one_device("sequence")
    for expected, replicas in zip(reference, trained(mirrored, loop, "none", "sequence")):
        for value in replicas:
            np.testing.assert_allclose(value, expected, atol=1e-6)


def test_without_the_weights_the_smaller_share_weighs_more(mirrored, reference, monkeypatch):
    """Without the weights (each replica's mean averaged, as TensorFlow's own strategy
    and Keras do) the same run ends measurably away from one device: the test above could
    fail."""
    monkeypatch.setattr(batch_rows, "weight", lambda: None)
    gap = max(np.max(np.abs(np.array(replicas) - expected)) for expected, replicas in
              zip(reference, trained(mirrored, "fit", "none")))
    assert gap > 1e-4, gap


def test_your_own_loop_is_not_weighed(mirrored):
    """A step that is not Keras' train_step nor the Trainer's gets no weight: its loss is
    scaled by the loop itself (compute_average_loss with the global batch is exact)."""
    def replica():
        return tf.constant(0.0) if batch_rows.weight() is None else tf.constant(1.0)

    values = mirrored.experimental_local_results(mirrored.run(replica))
    assert [float(v) for v in values] == [0.0, 0.0]


def test_each_replica_weighs_its_rows(mirrored):
    """8 and 7 rows: weights 16/15 and 14/15 (rows x replicas / all rows)."""
    batches = mirrored.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(tf.zeros((15, 2))).batch(15))

    def replica(x):
        with batch_rows.weighing(x):
            return batch_rows.weight()

    values = mirrored.experimental_local_results(mirrored.run(replica, args=(next(iter(
        batches)),)))
    np.testing.assert_allclose(sorted(float(v) for v in values), [14 / 15, 16 / 15], rtol=1e-6)


class Context:
    def __init__(self, replicas, pipelines, pipeline):
        self.num_replicas_in_sync, self.num_input_pipelines = replicas, pipelines
        self.input_pipeline_id = pipeline


@pytest.mark.parametrize("batch, pipelines", [(16, 3), (15, 2), (64, 3), (12, 4), (7, 7)])
def test_replica_batch_size_adds_up_to_the_global_batch(batch, pipelines):
    sizes = [batch_rows.replica_batch_size(Context(pipelines, pipelines, i), batch)
             for i in range(pipelines)]
    assert sum(sizes) == batch and max(sizes) - min(sizes) <= 1, sizes
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("context, batch, said", [
    (Context(3, 3, 0), 2, "leaves a replica of 3 without any"),
    (Context(4, 2, 0), 6, "must be a multiple of 4"),
    (Context(3, 3, 0), 16.0, "whole number of rows"),
    (Context(3, 3, 0), True, "whole number of rows"),
    (Context(3, 3, 0), "16", "whole number of rows"),
    (Context(3, 3, 0), -3, "without any"),
])
def test_replica_batch_size_refuses_in_one_line(context, batch, said):
    with pytest.raises(ValueError, match=said) as error:
        batch_rows.replica_batch_size(context, batch)
    assert "\n" not in str(error.value) and "Received: global_batch_size=" in str(error.value)


# --- local SGD: each replica's weights weigh the rows it trained since the last average --

def averaged_apart(period, weighed=True):
    """Local SGD as Stich 2019 defines it, computed apart: one one-device model per replica,
    each trained on its replica's rows of every batch (TensorFlow gives the first 8 of 15
    to replica 0, the other 7 to replica 1), their weights averaged every `period` steps —
    by the rows each trained since the last average, or plainly."""
    x, y = data()
    nets = [model(), model()]
    for net in nets:
        net.compile(keras.optimizers.SGD(0.1), "mse")
    rows = np.zeros(2)
    for step in range(EPOCHS * ROWS // BATCH):
        start = step % (ROWS // BATCH) * BATCH
        for replica, (low, high) in enumerate([(0, 8), (8, BATCH)]):
            nets[replica].train_on_batch(x[start + low:start + high], y[start + low:start + high])
            rows[replica] += high - low
        if (step + 1) % period == 0:
            share = rows / rows.sum() if weighed else np.full(2, 0.5)
            mean = [sum(s * w.numpy() for s, w in zip(share, ws))
                    for ws in zip(*(net.weights for net in nets))]
            for net in nets:
                net.set_weights(mean)
            rows[:] = 0
    return [w.numpy() for w in nets[0].weights]


def trained_apart(strategy, loop, period):
    x, y = data()
    with strategy.scope():
        net = model()
    if loop == "fit":
        with strategy.scope():
            net.compile(keras.optimizers.SGD(0.1), "mse")
        net.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                callbacks=[tfdist.callbacks.LocalSGD(period=period)])
    else:
        trainer = tfdist.Trainer(net, keras.optimizers.SGD(0.1), "mse", strategy=strategy,
                                 hooks=[tfdist.local_sgd.ModelAverager(period=period)])
        trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), epochs=EPOCHS,
                    verbose=0)
    return [[t.numpy() for t in strategy.experimental_local_results(w)] for w in net.weights]


@pytest.mark.parametrize("loop", ["fit", "trainer"])
@pytest.mark.parametrize("period", [1, 3])
def test_local_sgd_averages_weigh_each_replica_by_the_rows_it_trained(mirrored, loop, period):
    """15 over 2 replicas (8/7): every average weighs each replica's weights by its rows
    since the last one, so period 1 is one device's SGD and period 3 the rows-weighted
    local SGD computed apart; the plain average of the same runs lies measurably away."""
    expected = averaged_apart(period)
    plain = averaged_apart(period, weighed=False)
    assert max(np.abs(e - p).max() for e, p in zip(expected, plain)) > 1e-4
    if period == 1:
        for got, want in zip(expected, one_device()):
            np.testing.assert_allclose(got, want, atol=1e-6)
    for want, replicas in zip(expected, trained_apart(mirrored, loop, period)):
        for value in replicas:
            np.testing.assert_allclose(value, want, atol=1e-6)
