"""`tfdist.keras.DistributedOptimizer` wraps the optimizer object it is given as it is
(issue 73, items 4 and 5): learning rates and optimizer subclasses Keras trains with but
cannot re-make from a config train as plain Keras does; saving says in one line where it
cannot; a model whose class overrides `compile` (KerasHub's `CausalLM`, mimicked here: it
is not a dependency) gets its exchange and optimizer state back with
`tfdist.keras.load_model`, and saving it warns in one line that `keras.models.load_model`
would drop both."""

import json
import warnings
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.compression import GradientCompression
from tfdist.seam.optimizer import SAVED_NAME, is_routed, pipeline_of
from paths import JOBS

pytestmark = pytest.mark.usefixtures("two_cpus")

EPOCHS, BATCH = 2, 16


class InverseTime(keras.optimizers.schedules.LearningRateSchedule):
    """A user's schedule without `get_config`: Keras trains with it, cannot save it."""

    def __call__(self, step):
        return 0.01 / (1.0 + tf.cast(step, "float32"))


class Scaled(keras.optimizers.SGD):
    """A user's optimizer whose constructor takes an argument its config leaves out."""

    def __init__(self, scale, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(gradient * self.scale, variable, learning_rate)


def _data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4 * BATCH, 6)).astype("float32")
    return x, (x @ np.linspace(-1, 1, 6).astype("float32"))[:, None]


def _gpt2_schedule():
    """keras-io's GPT-2 recipe: `decay_steps` is an int64 tensor."""
    ds = tf.data.Dataset.from_tensor_slices(_data()).batch(BATCH)
    assert tf.is_tensor(ds.cardinality() * EPOCHS)
    return keras.optimizers.schedules.PolynomialDecay(
        5e-5, decay_steps=ds.cardinality() * EPOCHS, end_learning_rate=0.0)


OPTIMIZERS = {
    "gpt2 PolynomialDecay": lambda: keras.optimizers.Adam(_gpt2_schedule()),
    "schedule without get_config": lambda: keras.optimizers.Adam(InverseTime()),
    "subclass with its own argument": lambda: Scaled(3.0, learning_rate=0.01, momentum=0.5),
}


def _fit(strategy, make, wrap):
    """(weights, the optimizer compiled) after `EPOCHS` epochs of a small model."""
    with strategy.scope():
        keras.utils.set_random_seed(5)
        inputs = keras.Input((6,))
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))
        initial = [w.numpy() for w in model.weights]
        optimizer = wrap(make())
        model.compile(optimizer, "mse")
    model.fit(*_data(), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return initial, [w.numpy() for w in model.weights], model.optimizer


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_what_keras_cannot_remake_trains_through_tfdist_as_under_tfs_own_strategy(
        strategies, tensorflows_mirrored, name):
    make = OPTIMIZERS[name]
    theirs = tensorflows_mirrored()  # TF's own, plain Keras
    _, expected, plain = _fit(theirs, make, lambda o: o)
    given = {}

    def wrap(optimizer):
        given["optimizer"] = optimizer
        return tfdist.keras.DistributedOptimizer(optimizer)

    initial, actual, routed = _fit(strategies("mirrored"), make, wrap)
    assert routed is given["optimizer"] and is_routed(routed)  # the object as it was given
    assert int(routed.iterations.numpy()) == int(plain.iterations.numpy()) == EPOCHS * 4
    for first, e, a in zip(initial, expected, actual):
        assert not np.array_equal(first, a)  # it trained, at the schedule's rate
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-9)


def test_the_optimizer_keeps_its_strategy_and_variables(strategies):
    strategy = strategies("mirrored")
    with strategy.scope():
        optimizer = keras.optimizers.Adam(_gpt2_schedule())
        variables = optimizer.variables
        routed = tfdist.keras.DistributedOptimizer(optimizer, "fp16")
    assert routed is optimizer and routed.variables == variables
    assert routed._distribution_strategy is strategy
    assert isinstance(routed.iterations.value, tf.distribute.DistributedValues)


def test_an_optimizer_made_outside_the_scope_is_remade_in_it_or_refused_in_one_line(
        strategies):
    strategy = strategies("mirrored")
    outside = keras.optimizers.SGD(0.1)
    routed = tfdist.keras.DistributedOptimizer(outside, strategy=strategy)
    assert routed is not outside and not is_routed(outside)  # Keras' own clone, in scope
    assert isinstance(routed.iterations.value, tf.distribute.DistributedValues)
    for make in (lambda: keras.optimizers.Adam(InverseTime()), OPTIMIZERS["gpt2 PolynomialDecay"],
                 OPTIMIZERS["subclass with its own argument"]):
        with pytest.raises(ValueError) as refused:
            tfdist.keras.DistributedOptimizer(make(), strategy=strategy)
        message = str(refused.value)
        assert "created outside the strategy's scope" in message and "\n" not in message
        assert "with strategy.scope()" in message and "Received: optimizer=" in message


def _fit_apart(strategy, make, wrap):
    """(weights of every replica, the optimizer compiled) after `_fit`'s epochs under
    `tfdist.callbacks.LocalSGD(period=2)`."""
    with strategy.scope():
        keras.utils.set_random_seed(5)
        inputs = keras.Input((6,))
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))
        model.compile(wrap(make()), "mse")
    model.fit(*_data(), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[tfdist.callbacks.LocalSGD(period=2)])
    return [[t.numpy() for t in strategy.experimental_local_results(w.value)]
            for w in model.weights], model.optimizer


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_local_sgd_takes_the_users_optimizer_as_it_is(strategies, name):
    """The LocalSGD callback on a model compiled with plain Keras' optimizer routes that
    object in place (nothing re-made from its config), and trains as it does on the same
    optimizer wrapped by `DistributedOptimizer` with an averager first."""
    strategy = strategies("mirrored")
    given = {}

    def plain(optimizer):
        given["optimizer"] = optimizer
        return optimizer

    actual, optimizer = _fit_apart(strategy, OPTIMIZERS[name], plain)
    expected, _ = _fit_apart(strategy, OPTIMIZERS[name], lambda o: tfdist.keras.DistributedOptimizer(
        o, hooks=[tfdist.local_sgd.ModelAverager(period=2)]))
    assert optimizer is given["optimizer"] and is_routed(optimizer)
    assert int(optimizer.iterations.numpy()) == EPOCHS * 4
    for replicas, wanted in zip(actual, expected):
        for value, want in zip(replicas, wanted):
            np.testing.assert_array_equal(value, want)
        np.testing.assert_array_equal(replicas[0], replicas[1])  # averaged at the end


def _small_model():
    inputs = keras.Input((6,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


@pytest.mark.parametrize("name, what", [("gpt2 PolynomialDecay", "PolynomialDecay"),
                                        ("schedule without get_config", "InverseTime")])
def test_saving_a_rate_that_cannot_load_again_is_refused_in_one_line(strategies, tmp_path,
                                                                     name, what):
    strategy = strategies("mirrored")
    with strategy.scope():
        model = _small_model()
        model.compile(tfdist.keras.DistributedOptimizer(OPTIMIZERS[name]()), "mse")
    with pytest.raises(ValueError) as refused:
        model.save(str(tmp_path / "m.keras"))
    message = str(refused.value)
    assert f"learning rate ({what}) cannot be saved and loaded again" in message
    assert "\n" not in message and "model.save_weights" in message
    assert "Received: learning_rate=" in message


def test_a_schedule_keras_can_serialise_round_trips(strategies, tmp_path):
    strategy = strategies("mirrored")
    steps = int(tf.data.Dataset.range(64).batch(BATCH).cardinality()) * EPOCHS
    with strategy.scope():
        model = _small_model()
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(
            keras.optimizers.schedules.PolynomialDecay(5e-5, steps, 0.0)), "fp16",
            min_size=1), "mse")
        model.optimizer.build(model.trainable_variables)
    model.save(str(tmp_path / "m.keras"))
    with strategy.scope():
        loaded = keras.models.load_model(str(tmp_path / "m.keras")).optimizer
    assert is_routed(loaded) and loaded._learning_rate.decay_steps == steps
    assert _exchange(loaded).get_config() == _exchange(model.optimizer).get_config()


def _exchange(optimizer):
    [hook] = [h for h in pipeline_of(optimizer).hooks if isinstance(h, GradientCompression)]
    return hook


@keras.saving.register_keras_serializable("tfdist_tests")
class CausalLMStandIn(keras.Model):
    """What matters of KerasHub's `CausalLM` (keras_hub/src/models/causal_lm.py, task.py):
    a functional model whose constructor compiles it, and whose `compile` overrides
    Keras' with its own defaults (`Adam(2e-5)`), so `keras.models.load_model` does not
    compile it from the file."""

    def __init__(self, features=6, classes=4, compile=True, **kwargs):  # noqa: A002
        inputs = keras.Input((features,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        super().__init__(inputs, keras.layers.Dense(classes)(hidden), **kwargs)
        self.features, self.classes = features, classes
        if compile:
            self.compile()

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto", **kwargs):
        if optimizer == "auto":
            optimizer = keras.optimizers.Adam(2e-5)
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if weighted_metrics == "auto":
            weighted_metrics = [keras.metrics.SparseCategoricalAccuracy()]
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics,
                        **kwargs)

    def get_config(self):
        return {"features": self.features, "classes": self.classes, "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _lm_fit(model):
    """Two steps (no shuffling); the logs of CommStats and the loss."""
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(4 * BATCH, 6)).astype("float32"), rng.integers(0, 4, 4 * BATCH)
    history = model.fit(x, y, batch_size=2 * BATCH, shuffle=False, verbose=0, callbacks=[
        tfdist.callbacks.TrainingHooks(), tfdist.callbacks.CommStats()])
    return {k: v[-1] for k, v in history.history.items()}


@pytest.fixture(scope="module")
def saved_lm(strategies, tmp_path_factory):
    """(path, the model saved, its logs, the warnings saving it gave)."""
    strategy = strategies("mirrored")
    with strategy.scope():
        model = CausalLMStandIn()
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(0.01), "topk",
                                                        ratio=0.1, min_size=8))
    logs = _lm_fit(model)
    path = str(tmp_path_factory.mktemp("lm") / "lm.keras")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save(path)
    ours = [str(w.message) for w in caught if "tfdist" in str(w.message)]
    return path, model, logs, ours


def test_saving_a_model_with_its_own_compile_warns_in_one_line(saved_lm):
    path, _, _, ours = saved_lm
    [message] = ours
    assert message.startswith("CausalLMStandIn overrides compile(), so keras.models.load_model "
                              "will not compile it from this file")
    assert "'topk'" in message and "tfdist.keras.load_model(path)" in message
    assert "\n" not in message and message.endswith("Received: model=CausalLMStandIn")
    with zipfile.ZipFile(path) as archive:  # the file holds what load_model compiles back
        saved = json.loads(archive.read("config.json"))["compile_config"]["optimizer"]
    assert saved["registered_name"] == SAVED_NAME


def test_keras_load_model_drops_the_exchange_of_a_model_with_its_own_compile(saved_lm,
                                                                             strategies):
    """What the warning says (Keras' behaviour, not tfdist's: tfdist runs no code there)."""
    with strategies("mirrored").scope(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizer = keras.models.load_model(saved_lm[0]).optimizer
    assert not is_routed(optimizer) and int(optimizer.iterations.numpy()) == 0
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(2e-5)


def test_tfdist_load_model_compiles_back_the_exchange_and_the_optimizer_state(saved_lm,
                                                                            strategies):
    path, model, logs, _ = saved_lm
    with strategies("mirrored").scope(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = tfdist.keras.load_model(path)
    assert not [w for w in caught if "compile()" in str(w.message)
                or "Skipping variable loading" in str(w.message)]
    optimizer = loaded.optimizer
    assert is_routed(optimizer) and type(optimizer).__mro__[1] is keras.optimizers.Adam
    assert _exchange(optimizer).get_config() == _exchange(model.optimizer).get_config()
    assert int(optimizer.iterations.numpy()) == 2
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(0.01)
    for saved, back in zip(model.optimizer.variables, optimizer.variables, strict=True):
        np.testing.assert_array_equal(saved.numpy(), back.numpy())  # step and slots

    after, continued = _lm_fit(loaded), _lm_fit(model)  # the same two steps, saved or not
    assert after["comm_payload_bytes"] == continued["comm_payload_bytes"] == \
        logs["comm_payload_bytes"]
    assert after["compression_ratio"] == continued["compression_ratio"] > 1
    for a, b in zip(loaded.weights, model.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_tfdist_load_model_of_a_model_keras_compiles_is_keras_load_model(strategies, tmp_path):
    strategy = strategies("mirrored")
    with strategy.scope():
        model = _small_model()
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1), "fp16",
                                                        min_size=1), "mse")
        model.optimizer.build(model.trainable_variables)
    path = str(tmp_path / "m.keras")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save(path)
    assert not [w for w in caught if "tfdist" in str(w.message)]
    with strategy.scope():
        optimizer = tfdist.keras.load_model(path).optimizer
    assert is_routed(optimizer) and _exchange(optimizer).compressor.name == "fp16"


def test_tfdist_load_model_of_a_missing_file_says_so_in_one_line(tmp_path):
    with pytest.raises(ValueError) as refused:
        tfdist.keras.load_model(str(tmp_path / "none.keras"))
    assert "none.keras" in str(refused.value) and "\n" not in str(refused.value).strip()


@pytest.mark.multiprocess
def test_schedules_keras_cannot_remake_on_two_workers_train_as_plain_keras(write_config,
                                                                          tmp_path):
    """keras-io's GPT-2 schedule and a schedule without get_config, on 2 real worker
    processes (MultiWorkerMirroredStrategy): tfdist's weights equal plain Keras' (its own
    all-reduce) on each worker, and every worker ends with the same weights."""
    from test_multiworker_training import MWMS, launch

    out = tmp_path / "out"
    job = JOBS / "schedule_job.py"
    results, _ = launch(write_config, out, MWMS, job=job, timeout=300)
    assert sorted(results) == ["worker-0", "worker-1"]
    loaded = {}
    for task in results:
        with np.load(out / f"{task}.npz") as arrays:
            loaded[task] = {k: arrays[k] for k in arrays.files}
    for name in ("poly", "custom"):
        for task, report in results.items():
            assert report[f"tfdist-{name}"] == report[f"plain-{name}"]
            assert report[f"tfdist-{name}"]["steps"] == 6
            keys = sorted(k for k in loaded[task] if k.startswith(f"plain-{name}/"))
            for key in keys:
                np.testing.assert_allclose(loaded[task][key.replace("plain", "tfdist")],
                                           loaded[task][key], rtol=1e-6, atol=1e-9)
                np.testing.assert_array_equal(loaded["worker-0"][key], loaded["worker-1"][key])
    assert results["worker-0"]["plain-poly"]["rate"] == pytest.approx(5e-5 / 6)
