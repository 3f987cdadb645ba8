"""Gradient compression against independent computations (NumPy, the plain all-reduce)."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.compression import (QSGD, Cast, Compressor, GradientCompression, Int4, Int8,
                                PowerSGD, RandomK, Sign, TopK, build)
from tfdist.compression.buffers import pack, unpack
from tfdist.config import ConfigError
from tfdist.step import transaction

pytestmark = pytest.mark.usefixtures("two_cpus")

SHAPES = [(3, 5, 4, 8), (8,), (40, 30)]


def tensors(seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype("float32") * (i + 1) for i, s in enumerate(shapes)]


def seeds(step=0, replica=0):
    shared = tf.constant([0, step], tf.int64)
    return {"shared": shared, "local": tf.random.experimental.stateless_fold_in(shared, replica)}


def flat(tensors):
    return np.concatenate([np.ravel(t) for t in tensors])


def roundtrip(compressor, xs, step=0):
    """(input, decoded output) as flat arrays without padding, payload bytes, layout."""
    buffer, layout = pack(xs, compressor.align)
    payload = compressor.encode(buffer, layout, seeds(step))
    nbytes = sum(int(np.prod(p.shape)) * p.dtype.size for p in payload)
    decoded = compressor.decode(payload, layout, seeds(step))
    return flat(xs), flat(unpack(decoded, layout)), nbytes, layout


@pytest.mark.parametrize("align", [1, 8, 256])
def test_pack_pads_each_tensor_to_whole_blocks_and_unpack_restores_it(align):
    xs = tensors()
    buffer, layout = pack(xs, align)
    blocks = layout.blocks(buffer).numpy()
    ids = layout.block_ids().numpy()
    for i, x in enumerate(xs):  # each tensor fills its own blocks, then zeros
        np.testing.assert_array_equal(blocks[ids == i].ravel()[:x.size], x.ravel())
        assert not blocks[ids == i].ravel()[x.size:].any()
    assert layout.size % align == 0 and layout.size - sum(x.size for x in xs) < align * len(xs)
    np.testing.assert_array_equal(layout.padding_mask().numpy().ravel() != 0,
                                  np.concatenate([np.arange(p) < n for n, p in
                                                  zip(layout.sizes, layout.padded_sizes)]))
    for x, y in zip(xs, unpack(buffer, layout)):
        np.testing.assert_array_equal(x, y.numpy())


def test_padding_decodes_to_zero_so_error_feedback_keeps_it_zero():
    """Sign cannot send a zero; its padding must still decode to zero, or the residual of
    the padding would grow and enter the per-tensor mean."""
    hook = GradientCompression(Sign(), error_feedback=True, min_size=1)
    variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
    hook.build(tf.distribute.get_strategy(), variables)
    for step in range(3):
        tf.distribute.get_strategy().run(lambda: hook.exchange(
            [tf.constant(t) for t in tensors(seed=step)], variables, tf.constant(step, tf.int64)))
    mask = hook.large_layout.padding_mask().numpy().ravel()
    assert np.abs(hook.residual.numpy()[mask == 0]).max() == 0
    assert np.abs(hook.residual.numpy()[mask == 1]).max() > 0


@pytest.mark.parametrize("compressor", [Compressor(), Cast("float16"), Cast("bfloat16"), Int8(),
                                        Int4(), QSGD(15), Sign(), TopK(0.1), RandomK(0.1)])
def test_payload_bytes_are_what_is_sent(compressor):
    _, _, nbytes, layout = roundtrip(compressor, tensors())
    assert compressor.payload_bytes(layout) == nbytes


def test_casts_and_int8_stay_within_their_precision():
    x, y, _, layout = roundtrip(Cast("float16"), tensors())
    np.testing.assert_allclose(y, x, rtol=1e-3, atol=1e-3)
    x, y, _, _ = roundtrip(Cast("bfloat16"), tensors())
    np.testing.assert_allclose(y, x, rtol=1e-2, atol=1e-2)
    xs = tensors()
    x, y, _, _ = roundtrip(Int8(), xs)
    bound = np.concatenate([np.full(t.size, np.abs(t).max() / 127 / 2) for t in xs])
    assert np.all(np.abs(y - x) <= bound * 1.0001)  # per-tensor scale: half a step


def test_int4_is_numpys_rounding_to_seven_levels_packed_two_per_byte():
    xs = tensors()
    x, y, nbytes, _ = roundtrip(Int4(), xs)
    scales = [np.abs(t).max() / 7 for t in xs]
    expected = np.concatenate([np.round(t.ravel() / s) * s for t, s in zip(xs, scales)])
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-7)
    assert len(np.unique(np.round(y[:xs[0].size] / scales[0]))) <= 15
    assert nbytes <= x.size // 2 + len(xs) * (Int4.align // 2 + 4)  # half a byte per value


def test_sign_is_the_sign_times_the_mean_magnitude_per_tensor():
    xs = tensors()
    x, y, nbytes, _ = roundtrip(Sign(), xs)
    expected = np.concatenate([np.where(t.ravel() >= 0, 1, -1) * np.abs(t).mean() for t in xs])
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    # 1 bit per value, plus at most a block of padding per tensor, plus the scales
    assert math.ceil(x.size / 8) + 4 * len(xs) <= nbytes <= (
        math.ceil(x.size / 8) + len(xs) * (Sign.align // 8 + 4))


def test_topk_keeps_the_largest_magnitudes():
    x, y, _, _ = roundtrip(TopK(0.05), tensors())
    k = math.ceil(0.05 * x.size)
    kept = np.argsort(-np.abs(x))[:k]
    expected = np.zeros_like(x)
    expected[kept] = x[kept]
    np.testing.assert_array_equal(y, expected)
    x, y, _, _ = roundtrip(TopK(1.0), tensors())
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("compressor,draws,tolerance", [(QSGD(4), 400, 0.12),
                                                        (RandomK(0.25), 400, 0.25)])
def test_stochastic_compressors_are_unbiased(compressor, draws, tolerance):
    xs = tensors(shapes=[(16, 8), (64,)])
    buffer, layout = pack(xs)
    mean = np.mean([compressor.decode(compressor.encode(buffer, layout, seeds(s)), layout,
                                      seeds(s)).numpy() for s in range(draws)], axis=0)
    # The mean of many draws converges to the input (single draws are far from it).
    single = compressor.decode(compressor.encode(buffer, layout, seeds(0)), layout, seeds(0))
    scale = np.abs(buffer.numpy()).mean()
    assert np.abs(mean - buffer.numpy()).mean() < tolerance * scale
    assert np.abs(single.numpy() - buffer.numpy()).mean() > 2 * tolerance * scale


# --- the exchange across 2 replicas (MirroredStrategy on 2 logical CPUs) ---------------

def replica_grads(strategy):
    """Different gradients on each replica, and their NumPy sum."""
    per_replica = [tensors(seed=r) for r in range(2)]
    total = [a + b for a, b in zip(*per_replica)]
    values = [strategy.experimental_distribute_values_from_function(
        lambda ctx, i=i: tf.constant(per_replica[ctx.replica_id_in_sync_group][i]))
        for i in range(len(SHAPES))]
    return values, total


def exchanged(strategy, hook, step=0, repeats=1):
    """The summed gradients each replica gets from `hook` (after `repeats` steps)."""
    with strategy.scope():
        variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
        hook.build(strategy, variables)
    values, total = replica_grads(strategy)

    @tf.function
    def run(values, step):
        return strategy.run(lambda *g: hook.exchange(list(g), variables, step), args=values)

    for i in range(repeats):
        result = run(values, tf.constant(step + i, tf.int64))
    per_tensor = [[t.numpy() for t in strategy.experimental_local_results(r)] for r in result]
    return list(zip(*per_tensor)), total  # [replica][tensor]


@pytest.mark.matrix
@pytest.mark.parametrize("hook,tolerance", [
    (GradientCompression(Compressor()), 0.0),
    (GradientCompression(TopK(1.0), min_size=1), 1e-6),
    (GradientCompression(PowerSGD(rank=64), min_size=1), 1e-4),
    (GradientCompression(Cast("float16"), min_size=1), 2e-3),
    (GradientCompression(Int8(), min_size=1), 0.03),
    (GradientCompression(Sign(), min_size=10**6), 0.0),       # all below min_size: plain
    (GradientCompression(Sign(), min_size=1, start_step=5), 0.0),  # before start_step: plain
])
def test_exchange_equals_the_plain_all_reduce(strategies, hook, tolerance):
    replicas, total = exchanged(strategies("mirrored"), hook)
    for got_a, got_b, want in zip(*replicas, total):
        np.testing.assert_array_equal(got_a, got_b)  # every replica gets the same sum
        np.testing.assert_allclose(got_a, want, atol=tolerance * np.abs(want).max() + 1e-6)


@pytest.mark.matrix
def test_gathered_payloads_are_each_decoded_and_summed(strategies):
    """Independent computation: decode each replica's own payload alone, then add."""
    replicas, _ = exchanged(strategies("mirrored"), GradientCompression(Sign(), min_size=1))
    expected = 0
    for r in range(2):
        _, y, _, _ = roundtrip(Sign(), tensors(seed=r))
        expected = expected + y
    np.testing.assert_allclose(flat(replicas[0]), expected, rtol=1e-5)


def test_randomk_sends_only_values_at_shared_indices(strategies):
    hook = GradientCompression(RandomK(0.1, unbiased=False), min_size=1)
    replicas, total = exchanged(strategies("mirrored"), hook)
    got, _ = pack([tf.constant(t) for t in replicas[0]])
    want, _ = pack([tf.constant(t) for t in total])
    kept = got.numpy() != 0
    assert kept.sum() == math.ceil(0.1 * got.shape[0])  # the same indices on both replicas
    np.testing.assert_allclose(got.numpy()[kept], want.numpy()[kept], rtol=1e-6)


def test_error_feedback_keeps_sent_plus_residual_equal_to_the_gradients():
    """One replica: what is sent each step plus the final residual is the gradient sum."""
    strategy = tf.distribute.get_strategy()
    hook = GradientCompression(TopK(0.02), error_feedback=True, min_size=1)
    variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
    hook.build(strategy, variables)
    sent, grads = 0, 0
    for step in range(6):
        g = tensors(seed=step)
        out = strategy.run(lambda: hook.exchange([tf.constant(t) for t in g], variables,
                                                 tf.constant(step, tf.int64)))
        sent = sent + pack(out)[0].numpy()
        grads = grads + pack([tf.constant(t) for t in g])[0].numpy()
    np.testing.assert_allclose(sent + hook.residual.numpy(), grads, rtol=1e-5, atol=1e-5)
    assert np.abs(hook.residual.numpy()).max() > 0


def quadratic_distance(hook, steps=300, lr=0.05):
    """SGD on ||w - target||^2 with gradients through `hook`; returns the final distance."""
    rng = np.random.default_rng(0)
    target = tf.constant(np.concatenate([[5.0], 0.01 * rng.normal(size=63)]), tf.float32)
    w = tf.Variable(tf.zeros([64]))
    hook.build(tf.distribute.get_strategy(), [w])

    @tf.function
    def train():
        for step in tf.range(steps, dtype=tf.int64):
            g = 2 * (w - target)
            w.assign_sub(lr * hook.exchange([g], [w], step)[0])

    tf.distribute.get_strategy().run(train)
    return float(tf.norm(w - target))


def test_sign_without_error_feedback_stalls_and_with_it_converges():
    without = quadratic_distance(GradientCompression(Sign(), min_size=1))
    with_ef = quadratic_distance(GradientCompression(Sign(), min_size=1, error_feedback=True))
    assert without > 1.0 and with_ef < 0.1, (without, with_ef)


def test_a_refused_step_leaves_the_residual_and_a_committed_one_updates_it():
    """The hook's state follows the step's decision (tfdist.step.transaction), not its own
    replica's check; see test_transaction.py for whole steps."""
    strategy = tf.distribute.get_strategy()
    hook = GradientCompression(TopK(0.1), error_feedback=True, min_size=1)
    variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
    hook.build(strategy, variables)
    good = [tf.constant(t) for t in tensors()]
    with transaction.active(transaction.decide(good)):
        hook.exchange(good, variables, tf.constant(0, tf.int64))
    before = hook.residual.numpy()
    assert np.any(before != 0)
    bad = list(good)
    bad[2] = tf.tensor_scatter_nd_update(bad[2], [[0, 0]], [np.nan])
    with transaction.active(transaction.decide(bad)) as decision:
        hook.exchange(bad, variables, tf.constant(1, tf.int64))
    assert not bool(decision.committed)
    np.testing.assert_array_equal(hook.residual.numpy(), before)
    with transaction.active(transaction.decide(good)):
        hook.exchange(good, variables, tf.constant(1, tf.int64))
    assert not np.array_equal(hook.residual.numpy(), before)


def test_build_from_names_and_config(write_config):
    hook = build("topk", ratio=0.05, error_feedback=True, start_step=3, min_size=10)
    assert isinstance(hook.compressor, TopK) and hook.compressor.ratio == 0.05
    assert (hook.error_feedback, hook.start_step, hook.min_size) == (True, 3, 10)
    assert build("randomk", error_feedback=True).compressor.unbiased is False
    assert build("randomk").compressor.unbiased is True
    config = tfdist.load_config(write_config(
        "strategy: mirrored\ncompression: {name: powersgd, rank: 2, min_size: 0}\n"))
    hook = build(config.compression)
    assert isinstance(hook.compressor, PowerSGD) and hook.compressor.rank == 2
    assert hook.min_size == 0
    with pytest.raises(ConfigError, match="did you mean 'topk'"):
        build("top-k")
    with pytest.raises(ConfigError, match="applies only to"):
        build("sign", ratio=0.1)


# --- model.fit and tfdist.Trainer ----------------------------------------------------

def fit(strategy, optimizer, epochs=2):
    import keras
    from models import conv_model, dataset, loss

    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
        model.compile(optimizer, loss())
    history = model.fit(dataset(128, 32), epochs=epochs, verbose=0).history
    return model, history


OPTIMIZERS = {  # what tfdist's seam re-implements around Keras' update_step
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "adamw_decay_excluding_biases": lambda: _excluding_biases(keras.optimizers.AdamW(0.01, 0.1)),
    "adam_clipnorm": lambda: keras.optimizers.Adam(0.01, clipnorm=0.01),
    "sgd_ema": lambda: keras.optimizers.SGD(0.05, use_ema=True),
    "rmsprop_global_clipnorm": lambda: keras.optimizers.RMSprop(0.01, global_clipnorm=0.1),
}


def _excluding_biases(optimizer):
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    return optimizer


@pytest.mark.usefixtures("jobs_path")
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_distributed_optimizer_none_equals_plain_fit(strategies, optimizer):
    """Routed through tfdist (transactional update, weight decay applied per variable),
    a Keras optimizer trains exactly as Keras' own."""
    strategy = strategies("mirrored")
    with strategy.scope():  # Keras creates `iterations` at once, mirrored only in the scope
        plain = OPTIMIZERS[optimizer]()
    plain, _ = fit(strategy, plain)
    wrapped, _ = fit(strategy, tfdist.keras.DistributedOptimizer(OPTIMIZERS[optimizer](),
                                                                 strategy=strategy))
    for a, b in zip(plain.weights + plain.optimizer.variables,
                    wrapped.weights + wrapped.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.usefixtures("jobs_path")
@pytest.mark.parametrize("name,options", [("topk", {"ratio": 0.05, "error_feedback": True}),
                                          ("powersgd", {"rank": 2}), ("int8", {}),
                                          ("sign", {"error_feedback": True})])
def test_compressed_fit_learns(strategies, name, options):
    import keras

    strategy = strategies("mirrored")
    optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(0.01), name,
                                                  strategy=strategy, min_size=64, **options)
    _, history = fit(strategy, optimizer, epochs=4)
    assert history["loss"][-1] < 0.6 * history["loss"][0], history


@pytest.mark.usefixtures("jobs_path")
def test_trainer_with_compression_learns(strategies):
    import keras
    from models import conv_model, dataset, loss

    strategy = strategies("mirrored")
    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
    hook = build("qsgd", levels=7, min_size=64)
    trainer = tfdist.Trainer(model, keras.optimizers.Adam(0.01), loss(), strategy=strategy,
                             hooks=[hook])
    history = trainer.fit(dataset(128, 32), epochs=4, verbose=0).history
    assert history["loss"][-1] < 0.6 * history["loss"][0]
    assert hook.bytes_per_step()["payload"] < hook.bytes_per_step()["dense"] / 3


def test_compression_is_refused_where_nothing_is_exchanged(strategies):
    with pytest.raises(ValueError, match="nothing to compress"):
        tfdist.keras.DistributedOptimizer("sgd", "topk", strategy=strategies("central_storage"))


def trained_weights(strategy, compression, steps, loop="trainer", callbacks=()):
    import keras
    from models import conv_model, dataset, loss

    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
    data = dataset(32 * steps, 32)
    if loop == "trainer":
        hooks = [build(compression, min_size=64, start_step=3)] if compression else []
        tfdist.Trainer(model, keras.optimizers.SGD(0.05), loss(), strategy=strategy,
                       hooks=hooks).fit(data, verbose=0)
    else:
        optimizer = keras.optimizers.SGD(0.05)
        if compression:
            optimizer = tfdist.keras.DistributedOptimizer(optimizer, compression, strategy=strategy,
                                                          min_size=64, start_step=3)
        with strategy.scope():
            model.compile(optimizer, loss())
        model.fit(data, verbose=0, callbacks=list(callbacks))
    return [w.numpy() for w in model.weights]


@pytest.mark.usefixtures("jobs_path")
@pytest.mark.parametrize("loop", ["trainer", "fit"])
def test_delayed_start_exchanges_uncompressed_until_start_step(strategies, loop):
    strategy = strategies("mirrored")
    callbacks = [tfdist.callbacks.TrainingHooks()]
    for steps, same in ((3, True), (5, False)):
        plain = trained_weights(strategy, None, steps, loop)
        compressed = trained_weights(strategy, "sign", steps, loop, callbacks)
        equal = all(np.allclose(a, b, atol=1e-6) for a, b in zip(plain, compressed))
        assert equal == same, (loop, steps)


@pytest.mark.usefixtures("jobs_path")
def test_delayed_start_under_fit_without_hook_phases_is_a_clear_error(strategies):
    with pytest.raises(Exception, match="TrainingHooks"):
        trained_weights(strategies("mirrored"), "sign", 3, "fit")


@pytest.mark.usefixtures("jobs_path")
def test_comm_stats_report_the_payload_and_ratio(strategies):
    import keras
    from models import conv_model, dataset, loss

    strategy = strategies("mirrored")
    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), "topk",
                                                      ratio=0.05, min_size=64, strategy=strategy)
        model.compile(optimizer, loss())
    history = model.fit(dataset(64, 32), epochs=1, verbose=0,
                        callbacks=[tfdist.callbacks.CommStats()]).history
    sizes = [int(np.prod(v.shape)) for v in model.trainable_variables]
    large = sum(s for s in sizes if s >= 64)
    verdict = 4  # the step's finiteness flag rides the small tensors' all-reduce
    payload = 4 * (sum(sizes) - large) + 8 * math.ceil(0.05 * large) + verdict
    assert history["comm_payload_bytes"] == [payload]
    assert history["compression_ratio"][0] == pytest.approx(4 * sum(sizes) / payload)
    assert history["comm_bytes_per_worker"] == [0.0]  # one machine: nothing crosses a network


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,options,tolerance", [
    ("none", {}, 0.0), ("fp16", {}, 2e-3), ("bf16", {}, 1e-2), ("int8", {}, 0.03),
    ("qsgd", {"levels": 127}, 0.2), ("topk", {"ratio": 1.0}, 1e-6),
    ("powersgd", {"rank": 64}, 1e-4), ("topk", {"ratio": 0.3, "error_feedback": True}, None),
    ("sign", {"error_feedback": True}, None), ("int4", {"error_feedback": "ef21"}, None)])
def test_every_exchange_takes_float16_and_bfloat16_gradients(strategies, dtype, name, options,
                                                            tolerance):
    """Gradients of float16 or bfloat16 weights (a "float16"/"bfloat16" policy) are packed
    into float32 buffers, compressed, exchanged and cast back to their own dtype; the
    state (error-feedback residuals, EF21's estimates, PowerSGD's Q) stays float32. The
    result equals the sum of the low-precision gradients, within the compressor's own
    precision (and the low dtype's rounding of the result), on both replicas alike."""
    strategy = strategies("mirrored")
    hook = tfdist.compression.build({"name": name, "min_size": 1, **options})
    with strategy.scope():
        variables = [tf.Variable(tf.zeros(s, dtype)) for s in SHAPES]
        hook.build(strategy, variables)
    per_replica = [[t.astype(dtype) for t in tensors(seed=r)] for r in range(2)]
    values = [strategy.experimental_distribute_values_from_function(
        lambda ctx, i=i: tf.constant(per_replica[ctx.replica_id_in_sync_group][i], dtype))
        for i in range(len(SHAPES))]
    result = tf.function(lambda *g: strategy.run(
        lambda *g: hook.exchange(list(g), variables, tf.constant(0, tf.int64)), args=g))(*values)
    for summed, a, b in zip(result, *per_replica):
        replicas = strategy.experimental_local_results(summed)
        assert all(r.dtype == dtype for r in replicas)
        got = [np.asarray(r.numpy(), np.float32) for r in replicas]
        np.testing.assert_array_equal(got[0], got[1])
        want = np.asarray(a, np.float32) + np.asarray(b, np.float32)
        assert np.isfinite(got[0]).all()
        if tolerance is not None:  # error-fed compressors send part now, the rest later
            rounding = 1e-2 if dtype == "bfloat16" else 1e-3
            np.testing.assert_allclose(got[0], want, atol=(tolerance + rounding) *
                                       np.abs(want).max() + 1e-3)
    assert all(v.dtype == tf.float32 for v in hook.state.values())
