"""DGC's corrections and EF21 (tfdist.compression.corrections) against NumPy references of
the papers' algorithms, over several steps on 2 replicas (2 logical CPUs)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tfdist.compression import GradientCompression, Sign, TopK, build
from tfdist.compression.buffers import pack
from tfdist.compression.corrections import ratio_schedule, stage_of
from tfdist.config import ConfigError, config_from_dict

pytestmark = pytest.mark.usefixtures("two_cpus")

SHAPES = [(6, 5, 4), (30, 10)]
SIZE = sum(math.prod(s) for s in SHAPES)
STEPS = 5


def grads(step, replica):
    rng = np.random.default_rng(100 * step + replica)
    return [rng.normal(size=s).astype("float32") * (1 + replica) for s in SHAPES]


def flat(tensors):
    return np.concatenate([np.ravel(t) for t in tensors])


def run_hook(strategy, hook, steps=STEPS):
    """Each step's exchanged sum as a flat array, per replica: [step][replica]."""
    with strategy.scope():
        variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
        hook.build(strategy, variables)
    out = []
    for step in range(steps):
        hook.enter_phase(hook.phase(step))  # what the loop's driver does

        @tf.function
        def run(values, step):
            return strategy.run(lambda *g: hook.exchange(list(g), variables, step), args=values)

        values = [strategy.experimental_distribute_values_from_function(
            lambda ctx, i=i, step=step: tf.constant(grads(step, ctx.replica_id_in_sync_group)[i]))
            for i in range(len(SHAPES))]
        result = run(values, tf.constant(step, tf.int64))
        per_tensor = [[t.numpy() for t in strategy.experimental_local_results(r)] for r in result]
        out.append([flat(tensors) for tensors in zip(*per_tensor)])
    return out


def topk(x, ratio):
    """NumPy top-k: `x` where |x| is among the k largest, else 0."""
    k = max(1, math.ceil(ratio * x.size))
    kept = np.zeros_like(x)
    idx = np.argsort(-np.abs(x))[:k]
    kept[idx] = x[idx]
    return kept


def dgc_reference(ratio, momentum=0.0, clip=0.0, ratios=None, replicas=2, steps=STEPS):
    """Lin et al. 2018, Algorithm 1 (+ momentum factor masking, local clipping)."""
    u = [np.zeros(SIZE, np.float32) for _ in range(replicas)]
    v = [np.zeros(SIZE, np.float32) for _ in range(replicas)]
    sums = []
    for step in range(steps):
        r = ratios[step] if ratios else ratio
        total = np.zeros(SIZE, np.float32)
        for i in range(replicas):
            g = flat(grads(step, i))
            if clip:
                g = g * min(1.0, clip / math.sqrt(replicas) / np.linalg.norm(g))
            u[i] = momentum * u[i] + g
            v[i] = v[i] + u[i]
            sent = topk(v[i], r)
            v[i] = v[i] - sent
            u[i] = u[i] * (sent == 0)
            total += sent
        sums.append(total)
    return sums


def ef21_reference(ratio, replicas=2, steps=STEPS):
    """Richtarik et al. 2021, Algorithm 1: estimates move by the compressed difference."""
    estimate = [np.zeros(SIZE, np.float32) for _ in range(replicas)]
    total, sums = np.zeros(SIZE, np.float32), []
    for step in range(steps):
        for i in range(replicas):
            change = topk(flat(grads(step, i)) - estimate[i], ratio)
            estimate[i] = estimate[i] + change
            total = total + change
        sums.append(total.copy())
    return sums


def assert_matches(got, expected):
    for step, (replicas, want) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(replicas[0], replicas[1])  # one sum on every replica
        np.testing.assert_allclose(replicas[0], want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"step {step}")


@pytest.mark.parametrize("momentum, clip", [(0.9, 0.0), (0.0, 3.0), (0.9, 3.0)])
def test_dgc_momentum_correction_masking_and_clipping_equal_the_paper(strategies, momentum,
                                                                      clip):
    hook = GradientCompression(TopK(0.05), error_feedback=True, min_size=1,
                               momentum_correction=momentum, local_clip_norm=clip)
    assert_matches(run_hook(strategies("mirrored"), hook), dgc_reference(0.05, momentum, clip))


def test_without_corrections_it_is_plain_error_feedback(strategies):
    hook = GradientCompression(TopK(0.05), error_feedback=True, min_size=1)
    assert_matches(run_hook(strategies("mirrored"), hook), dgc_reference(0.05))


def test_ef21_sends_the_change_of_each_estimate_and_sums_the_estimates(strategies):
    hook = GradientCompression(TopK(0.05), error_feedback="ef21", min_size=1)
    got = run_hook(strategies("mirrored"), hook)
    assert_matches(got, ef21_reference(0.05))
    # the state is the paper's: each replica's estimate, and their sum on every replica
    sums = [t.numpy() for t in strategies("mirrored").experimental_local_results(
        hook.state["ef21_sum"])]
    np.testing.assert_array_equal(sums[0], sums[1])
    np.testing.assert_allclose(sums[0], got[-1][0], rtol=1e-6)


def test_ratio_warmup_is_exponential_in_stages():
    schedule = ratio_schedule(0.01, 0.25, 400)
    assert [first for first, _ in schedule] == [0, 100, 200, 300, 400]
    ratios = [r for _, r in schedule]
    assert ratios[0] == 0.25 and ratios[-1] == pytest.approx(0.01)
    factors = [b / a for a, b in zip(ratios, ratios[1:])]
    assert factors == pytest.approx([(0.01 / 0.25) ** 0.25] * 4)  # the same fall each stage
    assert [stage_of(schedule, s) for s in (0, 99, 100, 399, 400, 10**6)] == [0, 0, 1, 3, 4, 4]
    assert ratio_schedule(0.01, 0.25, 0) == [(0, 0.01)]


def test_ratio_warmup_exchanges_each_stages_k_from_the_delayed_start(strategies):
    # compression starts at step 1; the warm-up's 4 stages then last 1 step each
    hook = GradientCompression(TopK(0.01), error_feedback=True, min_size=1, start_step=1,
                               ratio_warmup_steps=4, ratio_warmup_start=0.4)
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
            residual[i] = corrected - sent
            total += sent
        np.testing.assert_allclose(got[step][0], total, rtol=1e-5, atol=1e-5, err_msg=f"{step}")
        assert hook.bytes_per_step(step)["payload"] == 8 * math.ceil(ratio * SIZE)


def test_corrections_are_config_keys_validated_and_saved_with_the_model():
    section = {"name": "topk", "ratio": 0.01, "error_feedback": True, "momentum_correction": 0.9,
               "local_clip_norm": 2.0, "ratio_warmup_steps": 200, "ratio_warmup_start": 0.25}
    hook = build(config_from_dict({"compression": section}).compression)
    assert hook.corrections == {"momentum_correction": 0.9, "local_clip_norm": 2.0,
                                "ratio_warmup_steps": 200, "ratio_warmup_start": 0.25}
    rebuilt = build(**hook.get_config())
    assert rebuilt.corrections == hook.corrections and rebuilt.schedule == hook.schedule
    ef21 = build("sign", error_feedback="ef21")
    assert build(**ef21.get_config()).error_feedback == "ef21"
    assert isinstance(ef21.compressor, Sign)
    bad = [({"name": "topk", "momentum_correction": 0.9}, "needs error_feedback: true"),
           ({"name": "topk", "error_feedback": True, "momentum_correction": 1.0},
            "momentum_correction"),
           ({"name": "fp16", "local_clip_norm": 1.0}, "applies only to"),
           ({"name": "sign", "ratio_warmup_steps": 10}, "applies only to"),
           ({"name": "powersgd", "error_feedback": "ef21"}, "ef21 error feedback applies to"),
           ({"name": "topk", "error_feedback": "maybe"}, "true, false or 'ef21'")]
    for section, message in bad:
        with pytest.raises(ConfigError, match=message):
            config_from_dict({"compression": section})


def test_pack_is_the_flat_buffer_the_references_use():
    # the references work on the concatenated tensors: topk's layout is unpadded
    buffer, layout = pack([tf.constant(t) for t in grads(0, 0)], TopK(0.1).align)
    np.testing.assert_array_equal(buffer.numpy(), flat(grads(0, 0)))
    assert layout.size == SIZE
