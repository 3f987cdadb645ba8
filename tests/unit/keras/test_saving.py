"""Saving a model compiled with `tfdist.keras.DistributedOptimizer` to `.keras` and loading
it back: with tfdist, `keras.models.load_model` under the strategy's scope restores the
same exchange; without tfdist, the plain Keras optimizer loads and trains."""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import keras
import numpy as np
import pytest

import tfdist
from tfdist.compression import GradientCompression, RandomK, TopK
from tfdist.keras import saving
from tfdist.seam.optimizer import SAVED_KEY, SAVED_NAME
from tfdist.training import GradientPipeline

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")

#: Non-default options for each compressor (min_size small enough to compress the model).
OPTIONS = {
    "none": dict(min_size=64, seed=9),
    "fp16": dict(min_size=64, seed=1),
    "bf16": dict(error_feedback=True, start_step=1, min_size=32),
    "int8": dict(error_feedback=True, min_size=64),
    "qsgd": dict(levels=7, seed=5, min_size=64),
    "sign": dict(error_feedback=True, min_size=100, seed=2),
    "topk": dict(ratio=0.1, error_feedback=True, min_size=64, seed=3),
    "randomk": dict(ratio=0.2, seed=11, min_size=64),
    "powersgd": dict(rank=2, error_feedback=True, min_size=16, seed=4),
}
DEFAULTS = dict(error_feedback=False, start_step=0, min_size=1024, seed=0)


@keras.saving.register_keras_serializable("tfdist_tests")
class ScaledAdam(keras.optimizers.Adam):
    """A user's own registered optimizer class."""


def _compiled(strategy, optimizer, compression, **options):
    from models import conv_model, loss

    with strategy.scope():
        model = conv_model(batchnorm=False, dropout=0)
        model.compile(tfdist.keras.DistributedOptimizer(optimizer, compression, **options), loss())
    return model


def _fit(model):
    """Two steps; the last epoch's logs (loss, compression_ratio, ...)."""
    from models import dataset

    callbacks = [tfdist.callbacks.TrainingHooks(), tfdist.callbacks.CommStats()]
    history = model.fit(dataset(64, 32), epochs=1, verbose=0, callbacks=callbacks)
    return {name: values[-1] for name, values in history.history.items()}


def _hook(optimizer):
    hooks = [h for h in tfdist.core.pipeline_of(optimizer).hooks
             if isinstance(h, GradientCompression)]
    assert len(hooks) == 1
    return hooks[0]


def _values(variables):
    return [np.array(v.numpy()) for v in variables]


def _assert_equal(expected, actual):
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        np.testing.assert_array_equal(e, a)


def _saved_optimizer(path):
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("config.json"))["compile_config"]["optimizer"]


@pytest.mark.parametrize("name", OPTIONS)
def test_a_reloaded_model_exchanges_as_it_was_saved_and_trains_on(name, strategies, tmp_path):
    strategy = strategies("mirrored")
    model = _compiled(strategy, keras.optimizers.Adam(0.01), name, **OPTIONS[name])
    before = _fit(model)
    path = str(tmp_path / "model.keras")
    model.save(path)
    saved = _saved_optimizer(path)
    assert (saved["module"], saved["class_name"]) == ("keras.src.optimizers.adam", "Adam")
    assert saved["registered_name"] == SAVED_NAME

    with strategy.scope():
        loaded = keras.models.load_model(path)
    optimizer = loaded.optimizer
    assert type(optimizer).__mro__[1] is keras.optimizers.Adam
    assert tfdist.seam.optimizer.is_routed(optimizer)
    expected = {"name": name, **DEFAULTS, **OPTIONS[name]}
    assert _hook(model.optimizer).get_config() == expected
    assert _hook(optimizer).get_config() == expected
    _assert_equal(_values(model.optimizer.variables), _values(optimizer.variables))
    assert int(optimizer.iterations.numpy()) == 2

    weights = _values(loaded.trainable_weights)
    after = _fit(loaded)
    assert int(optimizer.iterations.numpy()) == 4
    continued = _fit(model)  # the model that was never saved, over the same two steps
    assert after["compression_ratio"] == continued["compression_ratio"]
    assert before["compression_ratio"] <= after["compression_ratio"]  # start_step passed
    assert (after["compression_ratio"] > 1) == (name != "none")
    assert np.isfinite(after["loss"]) and after["loss"] != before["loss"]
    assert all(not np.array_equal(w, v) for w, v in zip(weights, _values(loaded.trainable_weights)))


@pytest.fixture(scope="module")
def saved_topk(strategies, tmp_path_factory):
    """(path, optimizer variable values) of a model trained two steps with top-k + EF."""
    model = _compiled(strategies("mirrored"), keras.optimizers.Adam(0.01), "topk",
                      ratio=0.05, error_feedback=True, min_size=64)
    _fit(model)
    path = str(tmp_path_factory.mktemp("saved") / "topk.keras")
    model.save(path)
    return path, _values(model.optimizer.variables)


PLAIN_PROCESS = textwrap.dedent("""
    import json, sys, warnings
    import keras, numpy as np
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.models.load_model(sys.argv[1])
    optimizer = model.optimizer
    np.savez(sys.argv[2], *[np.array(v.numpy()) for v in optimizer.variables])
    x = np.random.default_rng(0).normal(size=(32, 8, 8, 1)).astype("float32")
    history = model.fit(x, np.zeros(32, "int32"), batch_size=16, verbose=0)
    print(json.dumps({
        "plain_adam": type(optimizer) is keras.optimizers.Adam,
        "warnings": [str(w.message) for w in caught],
        "iterations": int(optimizer.iterations.numpy()),
        "loss": history.history["loss"][-1],
        "tfdist_modules": [m for m in sys.modules if m.split(".")[0] == "tfdist"]}))
""")


def test_a_process_without_tfdist_loads_the_plain_optimizer_and_trains(saved_topk, tmp_path):
    path, values = saved_topk
    slots = str(tmp_path / "slots.npz")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", PLAIN_PROCESS, path, slots], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["plain_adam"] and report["tfdist_modules"] == []
    assert "Argument `decay` is no longer supported and will be ignored." in report["warnings"]
    with np.load(slots) as loaded:
        _assert_equal(values, [loaded[f"arr_{i}"] for i in range(len(loaded.files))])
    assert report["iterations"] == 2 + 2 and np.isfinite(report["loss"])


def test_without_a_strategy_that_exchanges_it_warns_and_loads_the_plain_optimizer(saved_topk):
    path, values = saved_topk
    with pytest.warns(UserWarning, match="compression 'topk'.*under the strategy's scope"):
        model = keras.models.load_model(path)  # default strategy: one replica
    assert type(model.optimizer) is keras.optimizers.Adam
    _assert_equal(values, _values(model.optimizer.variables))


def test_a_registered_optimizer_class_of_your_own_comes_back(strategies, tmp_path):
    strategy = strategies("mirrored")
    model = _compiled(strategy, ScaledAdam(0.02), "fp16", min_size=64)
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    path = str(tmp_path / "model.keras")
    model.save(path)
    with strategy.scope():
        optimizer = keras.models.load_model(path).optimizer
    assert type(optimizer).__mro__[1] is ScaledAdam and tfdist.seam.optimizer.is_routed(optimizer)
    assert _hook(optimizer).get_config() == _hook(model.optimizer).get_config()
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(0.02)


def test_a_pipeline_without_compression_loads_routed_without_it(strategies, tmp_path):
    from models import conv_model, loss

    strategy = strategies("mirrored")
    with strategy.scope():
        model = conv_model()
        model.compile(tfdist.keras.with_gradient_pipeline(keras.optimizers.SGD(0.1),
                                                          GradientPipeline()), loss())
    path = str(tmp_path / "model.keras")
    model.save(path)
    assert _saved_optimizer(path)["config"]["decay"][SAVED_KEY]["compression"] is None
    with strategy.scope():
        optimizer = keras.models.load_model(path).optimizer
    assert type(optimizer).__mro__[1] is keras.optimizers.SGD
    assert tfdist.seam.optimizer.is_routed(optimizer)
    assert tfdist.core.pipeline_of(optimizer).exchange_owner is None  # Keras' all-reduce


def test_only_compression_that_build_can_remake_is_saved():
    assert GradientCompression(TopK(0.2), min_size=8).get_config()["ratio"] == 0.2

    class Halves(TopK):
        pass

    for hook in (GradientCompression(Halves(0.5)),
                 GradientCompression(RandomK(0.1, unbiased=True), error_feedback=True)):
        with pytest.raises(ValueError, match="cannot be described by build"):
            hook.get_config()
