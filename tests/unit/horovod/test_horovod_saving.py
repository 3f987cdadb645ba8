"""Saving and loading a model whose optimizer is `hvd.DistributedOptimizer` (issue 57): the
exchange comes back with `keras.models.load_model` and `hvd.load_model`, the optimizer's
state with it, and an edited file is refused in one line. In a job of one, where the
exchange hands the gradients back as they are, a reloaded model trains on as the model
that never stopped (tests/unit/horovod/test_horovod.py trains reloaded models on 2 workers)."""

import json
import zipfile

import numpy as np
import pytest

from tfdist.config import ConfigError


def keras_and_hvd():
    import keras

    import tfdist.horovod.tensorflow.keras as hvd

    return keras, hvd


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    return x, x @ np.array([[1.0], [-2.0], [0.5]], "float32")


def compiled(optimizer):
    keras, _ = keras_and_hvd()
    keras.utils.set_random_seed(3)
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                            keras.layers.Dense(1)])
    net.compile(optimizer, keras.losses.MeanSquaredError())
    return net


def train(net, epochs=1):
    _, hvd = keras_and_hvd()
    x, y = data()
    net.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False,
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return net


def exchange_of(optimizer):
    from tfdist.seam.optimizer import pipeline_of
    from tfdist.horovod.optimizer import HorovodExchange

    pipeline = pipeline_of(optimizer)
    owner = pipeline.exchange_owner if pipeline is not None else None
    assert isinstance(owner, HorovodExchange), owner
    return owner.get_config()


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
@pytest.mark.parametrize("loader", ["keras", "hvd"])
def test_a_saved_model_loads_with_its_exchange_and_trains_on_as_if_never_stopped(
        horovod, tmp_path, suffix, loader):
    """SGD with momentum, fp16 and backward_passes_per_step=2, saved after an epoch:
    `keras.models.load_model` gives back the exchange as saved, `hvd.load_model` too, or
    with the compression it is given (as Horovod's); the reloaded model (`.keras`: with its
    momentum) ends its second epoch where a model trained 2 epochs straight does."""
    keras, hvd = keras_and_hvd()
    horovod.init()

    def optimizer():
        return hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                        compression=hvd.Compression.fp16,
                                        backward_passes_per_step=2)

    net = train(compiled(optimizer()))
    path = str(tmp_path / f"model{suffix}")
    net.save(path)
    if loader == "hvd":
        assert exchange_of(hvd.load_model(path).optimizer)["compression"] == "fp16"
    back = (keras.models.load_model(path) if loader == "keras" else
            hvd.load_model(path, compression=hvd.Compression.none))
    assert exchange_of(back.optimizer) == {
        "name": "horovod", "op": "Average", "sparse_as_dense": False, "scale": 2.0,
        "compression": "fp16" if loader == "keras" else "none"}
    assert back.optimizer.gradient_accumulation_steps == 2
    if suffix == ".h5":  # Keras' .h5 keeps no optimizer state: its momentum starts again
        return
    straight = train(compiled(optimizer()), epochs=2)
    train(back)
    for got, want in zip(back.get_weights(), straight.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert int(back.optimizer.iterations.numpy()) == int(straight.optimizer.iterations.numpy())


def test_hvd_load_model_puts_a_plain_optimizer_behind_the_exchange(horovod, tmp_path):
    """A model saved without Horovod (plain Adam) comes back from `hvd.load_model` with
    its Adam state, behind the exchange with the compression given, and saved again keeps
    it; a custom optimizer class is found through `custom_optimizers`."""
    keras, hvd = keras_and_hvd()
    horovod.init()
    plain = train(compiled(keras.optimizers.Adam(0.01)))
    plain.save(tmp_path / "plain.keras")
    back = hvd.load_model(str(tmp_path / "plain.keras"), compression=hvd.Compression.fp16)
    assert exchange_of(back.optimizer)["compression"] == "fp16"
    for mine, theirs in zip(back.optimizer.variables, plain.optimizer.variables):
        np.testing.assert_array_equal(mine, theirs)
    train(back)
    train(plain)
    for got, want in zip(back.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    back.save(tmp_path / "again.keras")
    assert exchange_of(keras.models.load_model(tmp_path / "again.keras").optimizer)[
        "compression"] == "fp16"

    @keras.saving.register_keras_serializable("test_horovod_saving")
    class Slow(keras.optimizers.SGD):
        pass

    train(compiled(Slow(0.01))).save(tmp_path / "custom.keras")
    loaded = hvd.load_model(str(tmp_path / "custom.keras"), custom_optimizers=[Slow])
    assert type(loaded.optimizer).__mro__[1] is Slow
    exchange_of(loaded.optimizer)


def edited(path, change):
    """`path` (a .keras file) with its optimizer's saved exchange changed by `change`."""
    with zipfile.ZipFile(path) as saved:
        files = {name: saved.read(name) for name in saved.namelist()}
    config = json.loads(files["config.json"])
    optimizer = config["compile_config"]["optimizer"]["config"]
    change(optimizer["decay"]["tfdist"]["compression"])
    files["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(path, "w") as out:
        for name, content in files.items():
            out.writestr(name, content)
    return path


@pytest.mark.parametrize("change, says", [
    (lambda c: c.update(compression="int8"), "valid values are \\[none, fp16\\]"),
    (lambda c: c.update(op="Adasum"), "valid values are \\[Average, Sum"),
    (lambda c: c.update(scale=0), "scale"),
    (lambda c: c.update(scale=float("nan")), "scale"),
    (lambda c: c.update(sparse_as_dense="yes"), "sparse_as_dense"),
    (lambda c: c.update(groups=2), "groups"),
])
def test_an_edited_saved_exchange_is_refused_in_one_line(horovod, tmp_path, change, says):
    keras, hvd = keras_and_hvd()
    horovod.init()
    net = train(compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05))))
    net.save(tmp_path / "model.keras")
    with pytest.raises(ConfigError, match=says) as e:
        keras.models.load_model(edited(tmp_path / "model.keras", change))
    assert "hvd.load_model()" in str(e.value) and "\n" not in str(e.value)


def test_the_exchange_refuses_a_strategy_of_several_replicas(horovod, strategies):
    """Compiled under a MirroredStrategy of 2 replicas, Horovod's exchange would average
    over the workers but not the replicas: refused when it builds, saying what to use."""
    keras, hvd = keras_and_hvd()
    from tfdist.errors import UnsupportedError

    horovod.init()
    with strategies("mirrored").scope():
        net = compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)))
        with pytest.raises(UnsupportedError, match="outside any strategy scope"):
            train(net)


def test_hvd_load_model_takes_a_model_saved_with_tfdist_compression(horovod, tmp_path,
                                                                    strategies):
    """Saved with tfdist's fp16 under a MirroredStrategy, loaded outside it: Keras' loading
    warns that the compression cannot come back there, and `hvd.load_model` puts the plain
    optimizer behind Horovod's exchange instead."""
    keras, hvd = keras_and_hvd()
    import tfdist

    horovod.init()
    with strategies("mirrored").scope():
        net = compiled(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                         compression="fp16"))
        x, y = data()
        net.fit(x, y, batch_size=8, verbose=0)
    net.save(tmp_path / "native.keras")
    with pytest.warns(UserWarning, match="saved with compression 'fp16'"):
        back = hvd.load_model(str(tmp_path / "native.keras"))
    assert exchange_of(back.optimizer)["compression"] == "none"


def test_under_mixed_float16_the_loss_scale_and_the_exchange_come_back(horovod, tmp_path):
    """Under mixed_float16 compile puts the optimizer in a LossScaleOptimizer; saved and
    loaded with either loader, the scale it reached and the exchange inside it are back,
    and the reloaded model trains on as the one that never stopped."""
    keras, hvd = keras_and_hvd()
    from tfdist.seam.loss_scale import inner_of

    horovod.init()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        net = train(compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05,
                                                                           momentum=0.9))))
        net.save(tmp_path / "mixed.keras")
        straight = train(compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(
            0.05, momentum=0.9))), epochs=2)
        for back in (keras.models.load_model(tmp_path / "mixed.keras"),
                     hvd.load_model(str(tmp_path / "mixed.keras"))):
            assert float(back.optimizer.dynamic_scale.numpy()) == float(
                net.optimizer.dynamic_scale.numpy())
            exchange_of(inner_of(back.optimizer))
            train(back)
            for got, want in zip(back.get_weights(), straight.get_weights()):
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_a_tfdist_compressor_through_horovod_is_saved_with_its_options(horovod, tmp_path):
    """hvd.DistributedOptimizer(compression={top-k with error feedback}) saved and loaded:
    the same compressor, with its options, exchanges again; hvd.load_model keeps it, and
    refuses a Horovod compression given beside it in one line; an edited compressor in
    the file is refused as a config file's is."""
    keras, hvd = keras_and_hvd()
    horovod.init()
    topk = {"name": "topk", "ratio": 0.25, "error_feedback": True, "min_size": 0}
    net = train(compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                  compression=topk)))
    net.save(tmp_path / "topk.keras")
    for back in (keras.models.load_model(tmp_path / "topk.keras"),
                 hvd.load_model(str(tmp_path / "topk.keras"))):
        saved = exchange_of(back.optimizer)["compression"]
        assert {k: saved[k] for k in topk} == topk
    with pytest.raises(ValueError, match="load it with compression=None") as e:
        hvd.load_model(str(tmp_path / "topk.keras"), compression=hvd.Compression.fp16)
    assert "\n" not in str(e.value)
    edited(tmp_path / "topk.keras", lambda c: c["compression"].update(ratio=3))
    with pytest.raises(ValueError, match="ratio: expected a value > 0 and <= 1") as e:
        keras.models.load_model(tmp_path / "topk.keras")
    assert "\n" not in str(e.value)



def test_without_tfdist_horovod_imported_the_model_loads_plain_and_says_so(horovod, tmp_path,
                                                                         monkeypatch):
    """Where nothing registered Horovod's saved exchange (tfdist.horovod not imported: here
    its entry taken out), Keras' loading warns and gives the plain optimizer."""
    keras, hvd = keras_and_hvd()
    from tfdist.keras import saving

    horovod.init()
    train(compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)))).save(
        tmp_path / "model.keras")
    monkeypatch.delitem(saving.SAVED_EXCHANGES, "horovod")
    with pytest.warns(UserWarning, match="saved with hvd.DistributedOptimizer.*Import "
                                         "tfdist.horovod"):
        back = keras.models.load_model(tmp_path / "model.keras")
    assert type(back.optimizer) is keras.optimizers.SGD


@pytest.mark.parametrize("compression", ["fp16", None, 16])
def test_hvd_load_model_refuses_a_compression_it_cannot_use_in_one_line(horovod, tmp_path,
                                                                        compression):
    """`compression=` takes Horovod's two (or None: as saved); a string or a number is
    refused before the file is read."""
    keras, hvd = keras_and_hvd()
    horovod.init()
    if compression is None:
        compression = object()
    with pytest.raises(ValueError, match="compression must be hvd.Compression.none or "
                                         "hvd.Compression.fp16") as e:
        hvd.load_model(str(tmp_path / "missing.keras"), compression=compression)
    assert "\n" not in str(e.value)


def averager_of(optimizer):
    from tfdist.seam.optimizer import pipeline_of
    from tfdist.horovod.averaging import WorkersAverager

    owner = pipeline_of(optimizer).exchange_owner
    assert isinstance(owner, WorkersAverager), owner
    return owner


def test_local_sgd_through_horovod_is_saved_with_its_options(horovod, tmp_path):
    """hvd.DistributedOptimizer(compression={DiLoCo's section}) saved and loaded: both
    loaders give back local SGD over the workers with the same options (a reloaded model
    that lost it would train every worker apart for good); hvd.load_model refuses a
    Horovod compression beside it, and an edited option is refused as a config file's."""
    keras, hvd = keras_and_hvd()
    horovod.init()
    section = {"name": "diloco", "period": 2, "fragments": 2, "warmup_steps": 1,
               "compression": {"name": "int8"}}
    net = train(compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                  compression=section)))
    net.save(tmp_path / "diloco.keras")
    given = averager_of(net.optimizer).arguments
    for back in (keras.models.load_model(tmp_path / "diloco.keras"),
                 hvd.load_model(str(tmp_path / "diloco.keras"))):
        averager = averager_of(back.optimizer)
        assert averager.arguments["outer"] == "nesterov" == given["outer"]
        assert (averager.period, averager.fragments, averager.warmup_steps) == (2, 2, 1)
        assert averager.compression.compressor.name == "int8"
        assert averager.synchronous_exchange is not None
        assert averager.get_config() == averager_of(net.optimizer).get_config()
        train(back)  # and it trains on
    with pytest.raises(ValueError, match="saved with local SGD.*compression=None") as e:
        hvd.load_model(str(tmp_path / "diloco.keras"), compression=hvd.Compression.fp16)
    assert "\n" not in str(e.value)
    edited(tmp_path / "diloco.keras", lambda c: c.update(period=-1))
    with pytest.raises(ConfigError, match="period: expected a value >= 1") as e:
        keras.models.load_model(tmp_path / "diloco.keras")
    assert "hvd.load_model()" in str(e.value) and "\n" not in str(e.value)


def test_local_sgd_whose_options_have_no_config_saves_the_synchronous_exchange_and_says_so(
        horovod, tmp_path):
    """DiLoCo's outer optimizer given as a Keras optimizer has no config a file can hold:
    the save warns and keeps Horovod's synchronous exchange (the loaded model averages at
    every step, never silently apart)."""
    import tfdist

    keras, hvd = keras_and_hvd()
    horovod.init()
    averager = tfdist.local_sgd.DiLoCo(2, outer=keras.optimizers.SGD(0.7, momentum=0.9))
    net = train(compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                  compression=averager)))
    with pytest.warns(UserWarning, match="synchronous exchange.*give outer by name"):
        net.save(tmp_path / "diloco.keras")
    assert exchange_of(keras.models.load_model(tmp_path / "diloco.keras").optimizer) == {
        "name": "horovod", "op": "Average", "compression": "none", "sparse_as_dense": False,
        "scale": 1.0}
