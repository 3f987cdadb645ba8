"""get_strategy, and Keras 3 model.fit under mirrored and central_storage (2 logical CPUs)."""

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.config import ConfigError, StrategyConfig
from tfdist.strategies import (CentralStorageStrategy, MultiWorkerMirroredStrategy,
                               StrategyError, get_strategy)

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")


@pytest.mark.parametrize("name,cls,replicas", [
    ("mirrored", tf.distribute.MirroredStrategy, 2),
    ("central_storage", CentralStorageStrategy, 2),
    ("one_device", tf.distribute.OneDeviceStrategy, 1),
    ("multi_worker_mirrored", MultiWorkerMirroredStrategy, 1),
])
def test_get_strategy_by_name(name, cls, replicas):
    strategy = get_strategy(name)
    assert isinstance(strategy, cls)
    assert strategy.num_replicas_in_sync == replicas


def test_default_is_the_strategy_in_scope(strategies):
    assert get_strategy() is tf.distribute.get_strategy()
    mirrored = strategies("mirrored")
    with mirrored.scope():
        assert get_strategy("default") is mirrored


def test_options_from_config_and_keywords(write_config):
    config = tfdist.load_config(write_config(
        "strategy: {name: mirrored, devices: ['/cpu:0'], cross_device_ops: reduce_to_one}\n"))
    assert get_strategy(config).num_replicas_in_sync == 1
    assert get_strategy(config.strategy, devices=["/cpu:0", "/cpu:1"]).num_replicas_in_sync == 2
    assert get_strategy(StrategyConfig("one_device")).num_replicas_in_sync == 1
    strategy = get_strategy("multi_worker_mirrored", communication="ring", timeout_seconds=30)
    assert isinstance(strategy, MultiWorkerMirroredStrategy)


@pytest.mark.parametrize("args,options,message", [
    (("mirored",), {}, "did you mean 'mirrored'? valid values are [mirrored,"),
    (("mirrored",), {"comunication": "ring"}, "unknown key 'comunication'"),
    (("multi_worker_mirrored",), {"communication": "grpc"}, "valid values are [auto, ring, nccl]"),
    (("central_storage",), {"logical_cpus": 0}, "between 1 and 1024"),
])
def test_bad_names_and_options(args, options, message):
    with pytest.raises(ConfigError) as raised:
        get_strategy(*args, **options)
    assert message in str(raised.value) and "get_strategy()" in str(raised.value)


def test_parameter_server_without_tf_config_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(StrategyError, match="tfdist launch"):
        get_strategy("parameter_server")


@pytest.mark.parametrize("raw,message", [
    ("{oops", r"TF_CONFIG is not valid JSON .*Received: TF_CONFIG='\{oops'"),
    ('{"cluster": {"worker": ["localhost:1"]}}', "has worker and ps tasks"),
    ('{"cluster": ["localhost:1"]}', "cluster must map job names to lists of"),
])
def test_parameter_server_with_a_bad_tf_config_names_it(monkeypatch, raw, message):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(StrategyError, match=message):
        get_strategy("parameter_server")


def test_logical_cpus_too_late_is_a_clear_error():
    with pytest.raises(StrategyError, match="before TensorFlow initialises"):
        get_strategy("mirrored", logical_cpus=3)
    assert get_strategy("mirrored", logical_cpus=2).num_replicas_in_sync == 2


def fit_weights(strategy, loop, epochs=2, batch=32, weigh_as_replicas=None, **split):
    """Trains the BN-free, dropout-free conv model; returns (weights, history).

    `weigh_as_replicas`: each row weighs what it weighs on that many replicas, split
    as `split` says (`models.replica_share_weights`)."""
    import keras
    from models import conv_model, dataset, loss, weighted_dataset

    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
        optimizer = keras.optimizers.SGD(0.05)
    data = (weighted_dataset(128, batch, weigh_as_replicas, **split) if weigh_as_replicas
            else dataset(128, batch=batch))
    if loop == "fit":
        with strategy.scope():
            model.compile(optimizer, loss(), metrics=["sparse_categorical_accuracy"])
        history = model.fit(data, epochs=epochs, verbose=0).history
    else:
        trainer = tfdist.Trainer(model, optimizer, loss(), strategy=strategy,
                                 metrics=["sparse_categorical_accuracy"])
        history = trainer.fit(data, epochs=epochs, verbose=0).history
    return [w.numpy() for w in model.weights], history


@pytest.mark.parametrize("loop", ["fit", "trainer"])
@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_two_replicas_match_single_device(strategies, name, loop):
    """Same global batch, no dropout: 2 replicas must give single-device weights and logs."""
    reference, reference_history = fit_weights(tf.distribute.get_strategy(), loop)
    weights, history = fit_weights(strategies(name), loop)
    for w, r in zip(weights, reference):
        np.testing.assert_allclose(w, r, atol=2e-6)
    assert history.keys() == reference_history.keys()
    for key in history:  # loss and metrics aggregated across replicas, not per replica
        np.testing.assert_allclose(history[key], reference_history[key], rtol=1e-5)


@pytest.mark.parametrize("name,loop,policy", [
    ("mirrored", "fit", None), ("mirrored", "trainer", None),
    ("central_storage", "fit", None), ("central_storage", "trainer", None),
    ("mirrored", "fit", "mixed_float16")])
def test_a_global_batch_the_replicas_split_unevenly_trains_as_tf_weighs_it(
        strategies, name, loop, policy):
    """Global batches of 31 rows on 2 replicas (16 + 15; the last one 2 + 2). Keras 3's fit
    alone fails before the first step under MirroredStrategy (upstream canary:
    test_keras_seams.py); tfdist answers Keras' look at the first batch locally
    (tfdist/strategies/keras_build_batch.py). With Keras' own optimizer each replica's loss
    is the mean over its own rows: the independent computation is one device with each row
    weighted by what it weighs there (`models.replica_share_weights`). The Trainer's
    exchange weighs each replica by its rows (tfdist/strategies/batch_rows.py): one device
    with every row alike."""
    import keras

    keras.mixed_precision.set_global_policy(policy or "float32")
    try:
        reference, _ = fit_weights(tf.distribute.get_strategy(), loop, batch=31,
                                   weigh_as_replicas=None if loop == "trainer" else 2)
        strategy = strategies(name)
        weights, history = fit_weights(strategy, loop, batch=31)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    tolerance = 2e-3 if policy else 2e-6
    for w, r in zip(weights, reference):
        np.testing.assert_allclose(w, r, atol=tolerance)
    assert history["loss"][-1] < history["loss"][0]


@pytest.mark.parametrize("loop", ["fit", "trainer"])
@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
@pytest.mark.parametrize("dict_inputs", [False, True])
def test_batchnorm_dropout_and_dict_models_learn(strategies, name, dict_inputs, loop):
    import keras
    from models import conv_model, dataset, dict_model, loss

    strategy = strategies(name)
    with strategy.scope():
        model = dict_model() if dict_inputs else conv_model()
        optimizer = keras.optimizers.Adam(0.01)
    data = dataset(256, batch=32, dict_inputs=dict_inputs)
    if loop == "fit":
        with strategy.scope():
            model.compile(optimizer, loss(), metrics=["sparse_categorical_accuracy"])
        history = model.fit(data, epochs=4, verbose=0,
                            callbacks=[tfdist.callbacks.SyncReplicaState()]).history
        evaluated = model.evaluate(data, verbose=0, return_dict=True)
        assert model.predict(data, verbose=0).shape == (256, 3)
    else:
        trainer = tfdist.Trainer(model, optimizer, loss(), strategy=strategy,
                                 metrics=["sparse_categorical_accuracy"])
        history = trainer.fit(data, epochs=4, verbose=0).history
        evaluated = trainer.evaluate(data, verbose=0)
    assert history["loss"][-1] < 0.6 * history["loss"][0]
    assert evaluated["sparse_categorical_accuracy"] > 0.8
    bn = next(la for la in model.layers if isinstance(la, keras.layers.BatchNormalization))
    copies = strategy.experimental_local_results(bn.moving_mean.value)
    assert all(np.array_equal(c.numpy(), copies[0].numpy()) for c in copies)


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_moving_statistics_are_the_mean_over_replicas(strategies, name):
    import keras

    strategy = strategies(name)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(momentum=0.5)])
        model.compile("sgd", "mse")
    x = np.arange(32, dtype="float32").reshape(8, 4) ** 1.5
    model.fit(x, np.zeros_like(x), batch_size=8, epochs=1, verbose=0, shuffle=False,
              callbacks=[tfdist.callbacks.SyncReplicaState()])
    halves = x[:4], x[4:]  # replica 0 and replica 1 of the one global batch
    mean = np.mean([h.mean(axis=0) for h in halves], axis=0)
    variance = np.mean([h.var(axis=0) for h in halves], axis=0)
    bn = model.layers[0]
    for copy in strategy.experimental_local_results(bn.moving_mean.value):  # every replica's
        np.testing.assert_allclose(copy.numpy(), 0.5 * 0 + 0.5 * mean, rtol=1e-5)
    for copy in strategy.experimental_local_results(bn.moving_variance.value):
        np.testing.assert_allclose(copy.numpy(), 0.5 * 1 + 0.5 * variance, rtol=1e-5)
    # ...and not the statistics of the whole global batch, which differ here.
    assert not np.allclose(bn.moving_variance.numpy(), 0.5 + 0.5 * x.var(axis=0), rtol=1e-3)


def test_without_sync_mirrored_replicas_keep_different_statistics(strategies):
    """Why SyncReplicaState exists: Keras 3 lets each replica write its own copy."""
    import keras

    strategy = strategies("mirrored")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
        model.compile("sgd", "mse")
    x = np.arange(32, dtype="float32").reshape(8, 4) ** 1.5
    model.fit(x, np.zeros_like(x), batch_size=8, epochs=1, verbose=0, shuffle=False)
    a, b = strategy.experimental_local_results(model.layers[0].moving_mean.value)
    assert not np.allclose(a.numpy(), b.numpy())
    assert tfdist.strategies.sync_replica_state(strategy, model.non_trainable_variables) == 2
    a, b = strategy.experimental_local_results(model.layers[0].moving_mean.value)
    np.testing.assert_allclose(a.numpy(), b.numpy())
    hook = tfdist.core.SyncReplicaState()  # what every tfdist pipeline runs before a read
    hook.build(strategy, model.trainable_variables)
    for _ in range(3):
        hook.before_read(model)
    assert hook._average.experimental_get_tracing_count() == 1  # once, not once per epoch


def test_central_storage_metrics_equal_numpy(strategies):
    import keras

    strategy = strategies("central_storage")
    with strategy.scope():
        metric = keras.metrics.Mean()

    @tf.function
    def update(values):
        strategy.run(lambda v: metric.update_state(v), args=(values,))

    values = [np.float32([1, 2, 3, 10]), np.float32([4, 5, 6, 7])]
    for v in values:
        update(strategy.experimental_distribute_values_from_function(
            lambda ctx, v=v: v[ctx.replica_id_in_sync_group * 2:][:2]))
    assert metric.result().numpy() == pytest.approx(np.mean(np.concatenate(values)))
    assert metric.count.numpy() == 8
