"""DGC's corrections, EF21 and block-scaled sign (tfdist.compression.corrections, Sign's
block_size) against NumPy references of the papers' algorithms, over several steps on
2 replicas (2 logical CPUs), through the hook alone and through whole training steps in
model.fit, tfdist.Trainer and a user's own loop."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.compression import GradientCompression, RandomK, Sign, TopK, build
from tfdist.compression.buffers import pack, unpack
from tfdist.compression.corrections import ratio_schedule, stage_of
from tfdist.config import ConfigError, config_from_dict
from tfdist.step import transaction

pytestmark = pytest.mark.usefixtures("two_cpus")

SHAPES = [(6, 5, 4), (30, 10)]
SIZE = sum(math.prod(s) for s in SHAPES)
STEPS = 5


def grads(step, replica):
    rng = np.random.default_rng(100 * step + replica)
    return [rng.normal(size=s).astype("float32") * (1 + replica) for s in SHAPES]


def flat(tensors):
    return np.concatenate([np.ravel(t) for t in tensors])


def run_hook(strategy, hook, steps=STEPS, shapes=SHAPES, make=grads):
    """Each step's exchanged sum as a flat array, per replica: [step][replica]."""
    with strategy.scope():
        variables = [tf.Variable(tf.zeros(s)) for s in shapes]
        hook.build(strategy, variables)
    out = []
    for step in range(steps):
        hook.enter_phase(hook.phase(step))  # what the loop's driver does

        @tf.function
        def run(values, step):
            return strategy.run(lambda *g: hook.exchange(list(g), variables, step), args=values)

        values = [strategy.experimental_distribute_values_from_function(
            lambda ctx, i=i, step=step: tf.constant(make(step, ctx.replica_id_in_sync_group)[i]))
            for i in range(len(shapes))]
        result = run(values, tf.constant(step, tf.int64))
        per_tensor = [[t.numpy() for t in strategy.experimental_local_results(r)] for r in result]
        out.append([flat(tensors) for tensors in zip(*per_tensor)])
    return out


def replicas_of(strategy, variable):
    return [t.numpy() for t in strategy.experimental_local_results(variable)]


# --- NumPy references ---------------------------------------------------------------

def topk(x, ratio):
    """NumPy top-k: `x` where |x| is among the k largest, else 0."""
    k = max(1, math.ceil(ratio * x.size))
    kept = np.zeros_like(x)
    idx = np.argsort(-np.abs(x))[:k]
    kept[idx] = x[idx]
    return kept


def randomk_at(step, ratio, seed=0):
    """Random-k (unscaled, as with error feedback) at the indices the replicas share at
    `step`: the random choice is the compressor's, the arithmetic is NumPy's."""
    layout = pack([tf.zeros(s) for s in SHAPES])[1]
    seeds = {"shared": tf.constant([seed, step], tf.int64)}
    idx = RandomK(ratio, unbiased=False).indices(layout, seeds).numpy()

    def compress(x):
        kept = np.zeros_like(x)
        kept[idx] = x[idx]
        return kept

    return compress


def scaled_sign(x, sizes, block=0):
    """Karimireddy et al. 2019's ||x||_1 / d · sign(x), per tensor or per block of each."""
    out, start = [], 0
    for n in sizes:
        t = x[start:start + n]
        width = block or n
        for b in range(0, n, width):
            part = t[b:b + width]
            out.append(np.where(part >= 0, 1.0, -1.0) * np.abs(part).mean())
        start += n
    return np.concatenate(out).astype(np.float32)


def dgc_reference(compress, momentum=0.0, clip=0.0, replicas=2, steps=STEPS, make=grads):
    """Lin et al. 2018, Algorithm 1 with momentum correction, momentum factor masking and
    local gradient clipping; `compress(step)` is the step's sparsifier."""
    u = [np.zeros(SIZE, np.float32) for _ in range(replicas)]
    v = [np.zeros(SIZE, np.float32) for _ in range(replicas)]
    sums = []
    for step in range(steps):
        total = np.zeros(SIZE, np.float32)
        for i in range(replicas):
            g = flat(make(step, i))
            if clip:
                g = g * min(1.0, clip / math.sqrt(replicas) / np.linalg.norm(g))
            u[i] = momentum * u[i] + g
            v[i] = v[i] + u[i]
            sent = compress(step)(v[i])
            v[i] = v[i] - sent  # what was sent leaves the accumulation ...
            u[i] = u[i] * (sent == 0)  # ... and the velocity (momentum factor masking)
            total += sent
        sums.append(total)
    return sums


def ef21_reference(compress, replicas=2, steps=STEPS, start_step=0):
    """Richtarik et al. 2021, Algorithm 1: g_i += C(grad_i - g_i); the step uses sum_i g_i.
    Before `start_step` C is the identity (the uncompressed exchange)."""
    estimate = [np.zeros(SIZE, np.float32) for _ in range(replicas)]
    sums = []
    for step in range(steps):
        for i in range(replicas):
            change = flat(grads(step, i)) - estimate[i]
            estimate[i] = estimate[i] + (compress(step)(change) if step >= start_step
                                         else change)
        sums.append(sum(estimate))
    return sums, estimate


def assert_matches(got, expected, tolerance=1e-5):
    for step, (replicas, want) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(replicas[0], replicas[1])  # one sum on every replica
        np.testing.assert_allclose(replicas[0], want, rtol=tolerance, atol=tolerance,
                                   err_msg=f"step {step}")


# --- DGC: momentum correction, factor masking, local clipping ------------------------

@pytest.mark.parametrize("momentum, clip", [(0.9, 0.0), (0.0, 3.0), (0.9, 3.0)])
def test_dgc_momentum_correction_masking_and_clipping_equal_the_paper(strategies, momentum,
                                                                      clip):
    hook = GradientCompression(TopK(0.05), error_feedback=True, min_size=1,
                               momentum_correction=momentum, local_clip_norm=clip)
    got = run_hook(strategies("mirrored"), hook)
    assert_matches(got, dgc_reference(lambda step: lambda v: topk(v, 0.05), momentum, clip))


def test_dgc_with_randomk_masks_the_shared_random_indices(strategies):
    hook = build("randomk", ratio=0.1, error_feedback=True, min_size=1, momentum_correction=0.8)
    assert hook.compressor.unbiased is False  # error feedback keeps what was not sent
    got = run_hook(strategies("mirrored"), hook)
    assert_matches(got, dgc_reference(lambda step: randomk_at(step, 0.1), momentum=0.8))


def test_without_corrections_it_is_plain_error_feedback(strategies):
    hook = GradientCompression(TopK(0.05), error_feedback=True, min_size=1)
    got = run_hook(strategies("mirrored"), hook)
    assert_matches(got, dgc_reference(lambda step: lambda v: topk(v, 0.05)))


def test_momentum_correction_state_is_the_papers_velocity_and_accumulation(strategies):
    strategy = strategies("mirrored")
    hook = GradientCompression(TopK(0.05), error_feedback=True, min_size=1,
                               momentum_correction=0.9)
    run_hook(strategy, hook, steps=3)
    u = [np.zeros(SIZE, np.float32) for _ in range(2)]
    v = [np.zeros(SIZE, np.float32) for _ in range(2)]
    for step in range(3):
        for i in range(2):
            u[i] = 0.9 * u[i] + flat(grads(step, i))
            v[i] = v[i] + u[i]
            sent = topk(v[i], 0.05)
            v[i], u[i] = v[i] - sent, u[i] * (sent == 0)
    for name, want in (("velocity", u), ("residual", v)):
        for replica, value in enumerate(replicas_of(strategy, hook.state[name])):
            np.testing.assert_allclose(value, want[replica], rtol=1e-5, atol=1e-5, err_msg=name)


# --- EF21 ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["topk", "randomk", "sign"])
def test_ef21_sends_the_change_of_each_estimate_and_sums_the_estimates(strategies, name):
    strategy = strategies("mirrored")
    hook = build(name, ratio=0.05, error_feedback="ef21", min_size=1) if name != "sign" else \
        build("sign", error_feedback="ef21", min_size=1)
    sizes = [math.prod(s) for s in SHAPES]
    compress = {"topk": lambda step: lambda x: topk(x, 0.05),
                "randomk": lambda step: randomk_at(step, 0.05),
                "sign": lambda step: lambda x: scaled_sign(x, sizes)}[name]
    got = run_hook(strategy, hook)
    want, estimates = ef21_reference(compress)
    assert_matches(got, want, tolerance=1e-4)
    # the state is the paper's: each replica's own estimate, and their sum on every replica
    # (kept in the compressor's layout: sign pads each tensor to 64 values)
    sums = [unpadded_one(s, hook.large_layout) for s in replicas_of(strategy,
                                                                     hook.state["ef21_sum"])]
    np.testing.assert_array_equal(sums[0], sums[1])
    np.testing.assert_array_equal(sums[0], got[-1][0])
    own = [unpadded_one(e, hook.large_layout) for e in replicas_of(strategy,
                                                                   hook.state["ef21_estimate"])]
    for replica in range(2):
        np.testing.assert_allclose(own[replica], estimates[replica], rtol=1e-4, atol=1e-4)
    assert not np.allclose(own[0], own[1])


def unpadded_one(buffer, layout):
    return flat([t.numpy() for t in unpack(tf.constant(buffer), layout)])


def test_ef21_after_a_delayed_start_starts_from_the_last_gradients(strategies):
    """Before start_step the plain sum, bit for bit, with the estimates following the
    gradients (EF21 with the identity compressor); then EF21 from those estimates."""
    strategy = strategies("mirrored")
    hook = GradientCompression(TopK(0.05), error_feedback="ef21", min_size=1, start_step=2)
    got = run_hook(strategy, hook)
    for step in range(2):
        plain = flat(grads(step, 0)) + flat(grads(step, 1))
        np.testing.assert_array_equal(got[step][0], plain)
    want, _ = ef21_reference(lambda step: lambda x: topk(x, 0.05), start_step=2)
    assert_matches(got, want)
    # a first compressed step from zero estimates would have sent top-k of the gradient
    cold = topk(flat(grads(2, 0)), 0.05) + topk(flat(grads(2, 1)), 0.05)
    assert np.linalg.norm(got[2][0] - cold) > 1.0


# --- DGC's exponential warm-up of the ratio -----------------------------------------

def test_ratio_warmup_is_exponential_in_stages():
    schedule = ratio_schedule(0.01, 0.25, 400)
    assert [first for first, _ in schedule] == [0, 100, 200, 300, 400]
    ratios = [r for _, r in schedule]
    assert ratios[0] == 0.25 and ratios[-1] == pytest.approx(0.01)
    factors = [b / a for a, b in zip(ratios, ratios[1:])]
    assert factors == pytest.approx([(0.01 / 0.25) ** 0.25] * 4)  # the same fall each stage
    assert [stage_of(schedule, s) for s in (0, 99, 100, 399, 400, 10**6)] == [0, 0, 1, 3, 4, 4]
    assert ratio_schedule(0.01, 0.25, 0) == [(0, 0.01)]
    # DGC's own: 75% -> 93.75% -> 98.4375% -> 99.6% -> 99.9% sparsity
    dgc = [1 - r for _, r in ratio_schedule(0.001, 0.25, 4)]
    assert dgc == pytest.approx([0.75, 0.9370, 0.9842, 0.9960, 0.999], abs=3e-4)


def test_ratio_warmup_exchanges_each_stages_k_from_the_delayed_start(strategies):
    # compression starts at step 1; the warm-up's 4 stages then last 1 step each
    hook = GradientCompression(TopK(0.01), error_feedback=True, min_size=1, start_step=1,
                               ratio_warmup_steps=4, ratio_warmup_start=0.4)
    assert [hook.phase(s) for s in range(7)] == [
        (False, 0), (True, 0), (True, 1), (True, 2), (True, 3), (True, 4), (True, 4)]
    got = run_hook(strategies("mirrored"), hook, steps=6)
    schedule = ratio_schedule(0.01, 0.4, 4)
    ratios = [r for _, r in schedule]
    # step 0 uncompressed: the plain sum; then error feedback with each stage's ratio
    np.testing.assert_allclose(got[0][0], flat(grads(0, 0)) + flat(grads(0, 1)), rtol=1e-6)
    residual = [np.zeros(SIZE, np.float32) for _ in range(2)]
    for step in range(1, 6):
        ratio = ratios[stage_of(schedule, step - 1)]
        total = np.zeros(SIZE, np.float32)
        for i in range(2):
            corrected = residual[i] + flat(grads(step, i))
            sent = topk(corrected, ratio)
            assert np.count_nonzero(sent) == math.ceil(ratio * SIZE)  # k of the stage
            residual[i] = corrected - sent
            total += sent
        np.testing.assert_allclose(got[step][0], total, rtol=1e-5, atol=1e-5, err_msg=f"{step}")
        assert hook.bytes_per_step(step)["payload"] == 8 * math.ceil(ratio * SIZE)


def test_all_of_dgc_together_equals_the_paper_with_the_staged_ratio(strategies):
    hook = build("topk", ratio=0.02, error_feedback=True, min_size=1, momentum_correction=0.9,
                 local_clip_norm=5.0, ratio_warmup_steps=4, ratio_warmup_start=0.3)
    schedule = ratio_schedule(0.02, 0.3, 4)
    got = run_hook(strategies("mirrored"), hook, steps=6)
    ratio_at = lambda step: schedule[stage_of(schedule, step)][1]
    want = dgc_reference(lambda step: lambda v: topk(v, ratio_at(step)), 0.9, 5.0, steps=6)
    assert_matches(got, want)


# --- scaled sign (Karimireddy et al. 2019), per tensor or per block --------------------

@pytest.mark.parametrize("block", [0, 64, 192])
def test_sign_scales_by_the_mean_magnitude_of_each_block(block):
    shapes = [(5, 40), (130,), (7,)]  # blocks that end inside a tensor and at its padding
    xs = [np.random.default_rng(i).standard_t(2, size=s).astype("float32")
          for i, s in enumerate(shapes)]
    sign = Sign(block)
    buffer, layout = pack([tf.constant(x) for x in xs], sign.align)
    payload = sign.encode(buffer, layout, None)
    got = unpadded_one(sign.decode(payload, layout, None).numpy(), layout)
    sizes = [x.size for x in xs]
    np.testing.assert_allclose(got, scaled_sign(flat(xs), sizes, block), rtol=1e-6)
    scales = sum(math.ceil(n / (block or n)) for n in sizes)
    assert payload[1].shape == [scales]
    assert sign.payload_bytes(layout) == layout.size // 8 + 4 * scales == sum(
        int(np.prod(p.shape)) * p.dtype.size for p in payload)


def test_sign_error_feedback_with_blocks_equals_ef_signsgd(strategies):
    """EF-signSGD (Karimireddy et al. 2019, Algorithm 1, with a constant learning rate:
    the residual in gradient units): p = g + e, send C(p), e = p - C(p)."""
    hook = build("sign", block_size=64, error_feedback=True, min_size=1)
    strategy = strategies("mirrored")
    got = run_hook(strategy, hook)
    sizes = [math.prod(s) for s in SHAPES]
    e = [np.zeros(SIZE, np.float32) for _ in range(2)]
    for step in range(STEPS):
        total = 0
        for i in range(2):
            p = flat(grads(step, i)) + e[i]
            sent = scaled_sign(p, sizes, 64)
            e[i], total = p - sent, total + sent
        np.testing.assert_array_equal(*got[step])
        np.testing.assert_allclose(got[step][0], total, rtol=1e-4, atol=1e-4,
                                   err_msg=f"step {step}")


# --- the state is transactional -------------------------------------------------------

@pytest.mark.parametrize("options", [
    dict(error_feedback=True, momentum_correction=0.9, local_clip_norm=1.0),
    dict(error_feedback="ef21")])
def test_a_refused_step_leaves_every_correction_state_as_it_was(options):
    """Velocity, accumulation and EF21's estimate and sum follow the step's decision
    (tfdist.step.transaction): a NaN anywhere changes none of them."""
    strategy = tf.distribute.get_strategy()
    hook = build("topk", ratio=0.1, min_size=1, **options)
    variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
    hook.build(strategy, variables)
    good = [tf.constant(t) for t in grads(0, 0)]
    with transaction.active(transaction.decide(good)):
        hook.exchange(good, variables, tf.constant(0, tf.int64))
    before = {k: v.numpy() for k, v in hook.state.items()}
    assert all(np.any(v != 0) for v in before.values()), before.keys()
    bad = list(good)
    bad[1] = tf.tensor_scatter_nd_update(bad[1], [[0, 0]], [np.nan])
    with transaction.active(transaction.decide(bad)) as decision:
        hook.exchange(bad, variables, tf.constant(1, tf.int64))
    assert not bool(decision.committed)
    for key, value in hook.state.items():
        np.testing.assert_array_equal(value.numpy(), before[key], err_msg=key)


# --- config keys, validation, saving ------------------------------------------------

def test_corrections_are_config_keys_validated_and_saved_with_the_model():
    section = {"name": "topk", "ratio": 0.01, "error_feedback": True, "momentum_correction": 0.9,
               "local_clip_norm": 2.0, "ratio_warmup_steps": 200, "ratio_warmup_start": 0.25,
               "start_step": 40}
    hook = build(config_from_dict({"compression": section}).compression)
    assert hook.corrections == {"momentum_correction": 0.9, "local_clip_norm": 2.0,
                                "ratio_warmup_steps": 200, "ratio_warmup_start": 0.25}
    for rebuilt in (build(**hook.get_config()), build(hook.get_config())):
        assert rebuilt.get_config() == hook.get_config()
        assert rebuilt.corrections == hook.corrections and rebuilt.schedule == hook.schedule
    ef21 = build("randomk", error_feedback="ef21", start_step=5)
    assert build(**ef21.get_config()).get_config() == ef21.get_config()
    assert ef21.get_config()["error_feedback"] == "ef21"
    blocks = build("sign", block_size=256, error_feedback=True)
    assert blocks.get_config()["block_size"] == 256
    assert build(**blocks.get_config()).compressor.block_size == 256
    assert "block_size" not in build("sign").get_config()  # the default: per tensor


BAD = [
    ({"name": "topk", "momentum_correction": 0.9}, "momentum_correction",
     "needs error_feedback: true"),
    ({"name": "topk", "error_feedback": "ef21", "momentum_correction": 0.9},
     "momentum_correction", "needs error_feedback: true"),
    ({"name": "topk", "error_feedback": True, "momentum_correction": 1.0},
     "momentum_correction", "between 0 and 0.999"),
    ({"name": "topk", "error_feedback": True, "momentum_correction": -0.1},
     "momentum_correction", "between 0 and 0.999"),
    ({"name": "sign", "error_feedback": True, "momentum_correction": 0.9},
     "momentum_correction", r"applies only to \[topk, randomk\]"),
    ({"name": "topk", "local_clip_norm": -1}, "local_clip_norm", ">= 0"),
    ({"name": "topk", "local_clip_norm": "big"}, "local_clip_norm", "a finite number, got a string"),
    ({"name": "fp16", "local_clip_norm": 1.0}, "local_clip_norm", "applies only to"),
    ({"name": "sign", "ratio_warmup_steps": 10}, "ratio_warmup_steps", "applies only to"),
    ({"name": "topk", "ratio_warmup_steps": 1.5}, "ratio_warmup_steps", "an integer"),
    ({"name": "topk", "ratio_warmup_steps": 10, "ratio_warmup_start": 0}, "ratio_warmup_start",
     "> 0"),
    ({"name": "topk", "ratio": 0.3, "ratio_warmup_steps": 10}, "ratio_warmup_start",
     "a start above ratio"),
    ({"name": "powersgd", "error_feedback": "ef21"}, "error_feedback",
     "ef21 error feedback applies to"),
    ({"name": "topk", "error_feedback": "maybe"}, "error_feedback", "true, false or 'ef21'"),
    ({"name": "sign", "block_size": 100}, "block_size", "a multiple of 64"),
    ({"name": "sign", "block_size": -64}, "block_size", "between 0 and 16777216"),
    ({"name": "topk", "block_size": 64}, "block_size", "applies only to"),
    ({"name": "topk", "error_feedback": True, "freeze_variance": True}, "freeze_variance",
     "needs a warm-up that learns it, start_step > 0"),
    ({"name": "topk", "start_step": 5, "freeze_variance": "yes"}, "freeze_variance",
     "true or false"),
]


@pytest.mark.parametrize("section, key, message", BAD, ids=[f"{b[1]}-{i}" for i, b in
                                                             enumerate(BAD)])
def test_bad_corrections_are_config_errors_naming_the_key(write_config, section, key, message):
    import json

    path = write_config(f"compression: {json.dumps(section)}\n")
    with pytest.raises(ConfigError, match=message) as error:
        tfdist.load_config(path)
    text = str(error.value)
    assert f"compression.{key}" in text and "job.yaml" in text and "\n" not in text


@pytest.mark.parametrize("compressor, options, message", [
    (TopK(0.01), dict(momentum_correction=0.9), "needs error_feedback=True"),
    (Sign(), dict(error_feedback=True, momentum_correction=0.9), "applies only to"),
    (TopK(0.01), dict(error_feedback=True, momentum_correction=2.0), "momentum_correction: expected a value between 0 and 0.999"),
    (TopK(0.3), dict(ratio_warmup_steps=5), "start must be above"),
    (TopK(0.01), dict(local_clip_norm=-1.0), "local_clip_norm: expected a value >= 0"),
    (TopK(0.01), dict(error_feedback="yes"), "True, False or 'ef21'"),
])
def test_the_hook_refuses_what_the_config_refuses(compressor, options, message):
    with pytest.raises(ValueError, match=message):
        GradientCompression(compressor, **options)
    with pytest.raises(ValueError, match="block_size: expected an integer >= 0 and <= 16777216, "
                       "a multiple of 64"):
        Sign(block_size=32)


# --- whole training steps: fit, Trainer and a user's own loop, against NumPy SGD ------

D, BATCH, LR, TRAIN_STEPS = 96, 8, 0.05, 7
DGC = dict(ratio=0.05, error_feedback=True, min_size=1, start_step=2, momentum_correction=0.9,
           local_clip_norm=2.0, ratio_warmup_steps=4, ratio_warmup_start=0.5)


def regression_data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(BATCH * TRAIN_STEPS, D)).astype("float32")
    y = (x @ rng.normal(size=(D, 1)) + 0.1 * rng.normal(size=(len(x), 1))).astype("float32")
    return x, y


def sgd_with_dgc_reference(w0):
    """Plain SGD on the mean squared error, each replica's gradient (of its half of the
    batch, scaled by 1/N as in the sum all-reduce) through DGC: uncompressed for
    start_step steps, then the paper's algorithm with the staged ratio."""
    x, y = regression_data()
    schedule = ratio_schedule(DGC["ratio"], DGC["ratio_warmup_start"],
                              DGC["ratio_warmup_steps"])
    w = w0.astype(np.float64).ravel()
    u, v = np.zeros((2, D)), np.zeros((2, D))
    for step in range(TRAIN_STEPS):
        total = np.zeros(D)
        for i in range(2):
            xb = x[step * BATCH + i * BATCH // 2:step * BATCH + (i + 1) * BATCH // 2]
            yb = y[step * BATCH + i * BATCH // 2:step * BATCH + (i + 1) * BATCH // 2, 0]
            g = 2 * xb.T @ (xb @ w - yb) / len(xb) / 2
            if step < DGC["start_step"]:
                total += g
                continue
            g = g * min(1.0, DGC["local_clip_norm"] / math.sqrt(2) / np.linalg.norm(g))
            u[i] = DGC["momentum_correction"] * u[i] + g
            v[i] = v[i] + u[i]
            sent = topk(v[i], schedule[stage_of(schedule, step - DGC["start_step"])][1])
            v[i], u[i] = v[i] - sent, u[i] * (sent == 0)
            total += sent
        w = w - LR * total
    return w


def train_regression(strategy, loop, base=None, options=DGC):
    x, y = regression_data()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
        optimizer = tfdist.keras.DistributedOptimizer(base or keras.optimizers.SGD(LR), "topk",
                                                      strategy=strategy, **options)
    w0 = model.weights[0].numpy()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    if loop == "fit":
        with strategy.scope():
            model.compile(optimizer, "mse")
        model.fit(data, epochs=1, verbose=0, callbacks=[tfdist.callbacks.TrainingHooks()])
    elif loop == "trainer":
        tfdist.Trainer(model, optimizer, "mse", strategy=strategy).fit(data, verbose=0)
    else:
        with strategy.scope():
            optimizer.build(model.trainable_variables)

        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.square(model(xb) - yb)[:, 0],
                                                  global_batch_size=BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        @tfdist.function(model=model, optimizer=optimizer)
        def train_step(xb, yb):
            strategy.run(replica_step, args=(xb, yb))

        for xb, yb in strategy.experimental_distribute_dataset(data):
            train_step(xb, yb)
        train_step.before_read()
    return w0, model.weights[0]


@pytest.mark.parametrize("loop", ["fit", "trainer", "own"])
def test_dgc_trains_like_the_numpy_reference_in_every_loop(strategies, loop):
    strategy = strategies("mirrored")
    w0, kernel = train_regression(strategy, loop)
    want = sgd_with_dgc_reference(w0)
    for replica in replicas_of(strategy, tfdist.step.variables.underlying(kernel)):
        np.testing.assert_allclose(replica.ravel(), want, rtol=2e-4, atol=2e-5)
    assert np.linalg.norm(want - w0.ravel()) > 0.1  # it trained


# --- 1-bit Adam's frozen variance (Tang et al. 2021) --------------------------------

ONE_BIT = dict(ratio=0.1, error_feedback=True, min_size=1, start_step=3, freeze_variance=True)
ADAM = dict(learning_rate=0.02, beta_1=0.9, beta_2=0.999, epsilon=1e-7)


def adam_with_error_feedback_reference(w0, freeze=True):
    """Adam on the sum of the replicas' gradients, uncompressed for start_step steps, then
    top-k with error feedback; with `freeze`, v (and its bias correction) stays as it was
    at start_step (1-bit Adam), else Adam goes on as usual."""
    x, y = regression_data()
    lr, b1, b2, eps = (ADAM[k] for k in ("learning_rate", "beta_1", "beta_2", "epsilon"))
    start = ONE_BIT["start_step"]
    w = w0.astype(np.float64).ravel()
    m, v, e = np.zeros(D), np.zeros(D), np.zeros((2, D))
    for step in range(TRAIN_STEPS):
        total = np.zeros(D)
        for i in range(2):
            xb = x[step * BATCH + i * BATCH // 2:step * BATCH + (i + 1) * BATCH // 2]
            yb = y[step * BATCH + i * BATCH // 2:step * BATCH + (i + 1) * BATCH // 2, 0]
            g = 2 * xb.T @ (xb @ w - yb) / len(xb) / 2
            if step >= start:
                sent = topk(g + e[i], ONE_BIT["ratio"])
                e[i], g = g + e[i] - sent, sent
            total += g
        t = step + 1
        m = m + (total - m) * (1 - b1)
        frozen = freeze and step >= start
        if not frozen:
            v = v + (total ** 2 - v) * (1 - b2)
        w = w - lr * np.sqrt(1 - b2 ** (start if frozen else t)) / (1 - b1 ** t) * m / (
            np.sqrt(v) + eps)
    return w, v


@pytest.mark.parametrize("loop", ["fit", "trainer", "own"])
def test_frozen_variance_trains_like_one_bit_adam_in_every_loop(strategies, loop):
    strategy = strategies("mirrored")
    w0, kernel = train_regression(strategy, loop, keras.optimizers.Adam(**ADAM), ONE_BIT)
    want, want_v = adam_with_error_feedback_reference(w0)
    for replica in replicas_of(strategy, tfdist.step.variables.underlying(kernel)):
        np.testing.assert_allclose(replica.ravel(), want, rtol=2e-4, atol=2e-5)
    live, live_v = adam_with_error_feedback_reference(w0, freeze=False)
    assert np.abs(live - want).max() > 1e-3  # freezing made a difference the test sees
    assert not np.allclose(live_v, want_v, rtol=1e-3)


def test_frozen_variance_keeps_the_optimizers_second_moment_and_is_saved(strategies):
    strategy = strategies("mirrored")
    x, y = regression_data()
    with strategy.scope():
        model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.AdamW(**ADAM), "topk",
                                                      strategy=strategy, **ONE_BIT)
    trainer = tfdist.Trainer(model, optimizer, "mse", strategy=strategy)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    trainer.fit(data.take(ONE_BIT["start_step"]), verbose=0)
    v_at_start = replicas_of(strategy, optimizer._velocities[0])
    trainer.fit(data.skip(ONE_BIT["start_step"]), verbose=0)
    assert int(optimizer.iterations.numpy()) == TRAIN_STEPS
    assert not np.allclose(v_at_start[0], 0)  # learned in the warm-up
    np.testing.assert_array_equal(replicas_of(strategy, optimizer._velocities[0]), v_at_start)
    hook = tfdist.seam.optimizer.pipeline_of(optimizer).exchange_owner
    assert build(**hook.get_config()).freeze_variance and hook.get_config()["freeze_variance"]


@pytest.mark.parametrize("base, message", [
    (lambda: keras.optimizers.SGD(0.1), "needs keras.optimizers.Adam or AdamW.*Received: SGD"),
    (lambda: keras.optimizers.Adam(amsgrad=True), "with amsgrad=True"),
])
def test_frozen_variance_refuses_an_optimizer_without_adams_variance(strategies, base, message):
    strategy = strategies("mirrored")
    with strategy.scope():
        model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
        optimizer = tfdist.keras.DistributedOptimizer(base(), "topk", strategy=strategy,
                                                      **ONE_BIT)
        with pytest.raises(tfdist.errors.UnsupportedError, match=message):
            optimizer.build(model.trainable_variables)


def test_frozen_variance_needs_a_warm_up():
    with pytest.raises(ValueError, match="start_step > 0"):
        GradientCompression(TopK(0.01), error_feedback=True, freeze_variance=True)
    hook = build(config_from_dict({"compression": {
        "name": "topk", "error_feedback": True, "start_step": 80, "freeze_variance": True}})
        .compression)
    assert hook.freeze_variance and hook.start_step == 80
    assert hook.frozen_variance_step() is None  # the uncompressed warm-up: v still learns
    hook.enter_phase(hook.phase(80))
    assert hook.frozen_variance_step() == 80


def test_pack_is_the_flat_buffer_the_references_use():
    # the references work on the concatenated tensors: topk's layout is unpadded
    buffer, layout = pack([tf.constant(t) for t in grads(0, 0)], TopK(0.1).align)
    np.testing.assert_array_equal(buffer.numpy(), flat(grads(0, 0)))
    assert layout.size == SIZE
