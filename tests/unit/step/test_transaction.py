"""The transactional step: a NaN or Inf gradient on one replica changes nothing anywhere.

Each case trains on 2 logical CPUs: a good step, a step whose batch holds a NaN in *one*
replica's half only (the other replica's batch is fine), then another good step. The
refused step must raise tfdist's error and leave every replica's copy of everything a step
can change — weights, optimizer slots and `iterations`, error-feedback residuals, PowerSGD's
Q, local SGD's anchors, gradient accumulators, the Trainer's step and the model's
BatchNormalization statistics — bit for bit as before it; and the run must then end exactly
where a run that never saw the bad batch ends (an independent computation of "no trace").
The two-process version is in test_multiworker_training.py.
"""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.compression import build
from tfdist.step import transaction
from tfdist.step.variables import underlying

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")

COMPRESSORS = ["none", "fp16", "bf16", "int8", "qsgd", "sign", "topk", "randomk", "powersgd"]
BATCH = 32  # 16 per replica


def batches(nan_replica):
    """Three global batches; the middle one has a NaN pixel in `nan_replica`'s half only."""
    from models import images

    x, y = images(3 * BATCH, seed=7)
    x[BATCH + 16 * nan_replica + 5, 2, 3, 0] = np.nan
    return [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, 3 * BATCH, BATCH)]


def hook_variables(hooks):
    """The state variables of tfdist's hooks (residuals, Qs, anchors)."""
    found = []
    for hook in hooks:
        for inner in (hook, getattr(hook, "compression", None)):
            if inner is not None:
                found += list(getattr(inner, "state", {}).values())  # residual, Qs
                found += list(getattr(inner, "anchors", None) or [])
    return found


def every_replica(strategy, model, hooks, extra=()):
    """{name: value} of every replica's copy of all the state a step can change."""
    variables = [(v.path, underlying(v)) for v in model.weights + model.optimizer.variables]
    variables += [(f"hook/{i}", v) for i, v in enumerate(hook_variables(hooks))]
    variables += [(f"extra/{i}", v) for i, v in enumerate(extra)]
    state = {}
    for name, variable in variables:
        for replica, value in enumerate(strategy.experimental_local_results(variable)):
            state[f"{name}@{replica}"] = np.array(value.numpy())
    return state


def assert_same(after, before):
    assert after.keys() == before.keys()
    changed = [k for k in before if not np.array_equal(after[k], before[k], equal_nan=False)]
    assert not changed, f"changed by a refused step: {changed[:6]}"
    for key, value in before.items():
        assert np.all(np.isfinite(value)), key


class Run:
    """One model trained step by step with `fit` or the Trainer, under `strategy`."""

    def __init__(self, strategy, loop, compression, error_feedback, batchnorm=False,
                 local_sgd=None, accumulate=None):
        from models import conv_model, loss

        self.strategy, self.loop = strategy, loop
        with strategy.scope():
            self.model = conv_model(seed=3, batchnorm=batchnorm, dropout=0.25 if batchnorm else 0)
            optimizer = keras.optimizers.Adam(0.01, gradient_accumulation_steps=accumulate)
        options = dict(min_size=64, error_feedback=error_feedback)
        self.hooks = [build(compression, **options)] if compression != "none" else []
        if local_sgd:
            self.hooks = [tfdist.local_sgd.ModelAverager(local_sgd, compression=compression)]
        self.callbacks = []
        if loop == "trainer":
            self.trainer = tfdist.Trainer(self.model, optimizer, loss(), strategy=strategy,
                                          hooks=self.hooks)
            self.counters = [self.trainer.optimizer.iterations]
        else:
            if not local_sgd:  # tfdist's exchange, even uncompressed
                exchange = self.hooks[0] if self.hooks else "none"
                optimizer = tfdist.keras.DistributedOptimizer(optimizer, exchange,
                                                              strategy=strategy)
            self.callbacks = [tfdist.callbacks.TrainingHooks()]
            if local_sgd:
                callback = tfdist.callbacks.LocalSGD(local_sgd, compression=compression)
                self.hooks, self.callbacks = [callback.averager], [callback]
            with strategy.scope():
                self.model.compile(optimizer, loss())
            self.counters = []

    def step(self, batch, callbacks=()):
        """Trains on `batch` (x, y): one step per BATCH examples."""
        x, y = batch
        if self.loop == "trainer":
            data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
            self.trainer.fit(data, verbose=0, callbacks=list(callbacks))
        else:
            self.model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
                           callbacks=self.callbacks + list(callbacks))

    def state(self):
        return every_replica(self.strategy, self.model, self.hooks, self.counters)


class Snapshot(keras.callbacks.Callback):
    """Every replica's state after the first step of a fit (the good one)."""

    def __init__(self, run):
        super().__init__()
        self.run = run

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            self.state = self.run.state()


def refused_then_continued(strategy, loop, compression, error_feedback, nan_replica, **kwargs):
    """Runs good, bad (must be refused, no trace), good; returns the final state and that of
    the same run without the bad batch."""
    good, bad, last = batches(nan_replica)
    run = Run(strategy, loop, compression, error_feedback, **kwargs)
    run.step(good)
    before = run.state()
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf gradient"):
        run.step(bad)
    assert_same(run.state(), before)
    run.step(last)
    clean = Run(strategy, loop, compression, error_feedback, **kwargs)
    clean.step(good)
    clean.step(last)
    return run.state(), clean.state()


def assert_no_trace(final, clean):
    """The run that met the bad batch ends exactly where the one that never did ends
    (state names differ only by Keras' per-model variable paths)."""
    assert len(final) == len(clean)
    for (name, a), b in zip(final.items(), clean.values()):  # the same order of creation
        np.testing.assert_array_equal(a, b, err_msg=name)


#: Every compressor with error feedback (its residuals: state a refused step must not touch),
#: and without it where the compressor keeps state of its own (PowerSGD's Q) or only casts
#: (fp16): 11 cells of the 17, for CI's time.
NAN_CELLS = [("none", False), ("fp16", False), ("powersgd", False)] + [
    (name, True) for name in COMPRESSORS if name != "none"]


@pytest.mark.parametrize("compression,error_feedback", NAN_CELLS)
def test_fit_refuses_a_nan_on_one_replica_and_keeps_no_trace(strategies, compression,
                                                             error_feedback):
    nan_replica = COMPRESSORS.index(compression) % 2  # both replicas, across the cases
    final, clean = refused_then_continued(strategies("mirrored"), "fit", compression,
                                          error_feedback, nan_replica)
    assert_no_trace(final, clean)


@pytest.mark.parametrize("loop", ["fit", "trainer"])
def test_ten_refused_steps_in_a_row_each_leave_every_replica_as_it_was(strategies, loop):
    """The race the old per-replica check lost: the NaN alternates between the replicas,
    10 times (5 on each), between good steps; every refusal is checked on every replica's
    copy (20 times until CI's time asked for fewer)."""
    from models import images

    strategy = strategies("mirrored")
    run = Run(strategy, loop, "randomk", True)
    clean = Run(strategy, loop, "randomk", True)
    snapshot = Snapshot(run)
    good = [images(BATCH, seed=attempt) for attempt in range(10)]
    for attempt, (x, y) in enumerate(good):  # each: a good step, then a refused one, in one fit
        bad = x.copy()
        bad[16 * (attempt % 2) + attempt % 16, 1, 1, 0] = np.nan
        with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf gradient"):
            run.step((np.concatenate([x, bad]), np.concatenate([y, y])), [snapshot])
        assert_same(run.state(), snapshot.state)
    clean.step(tuple(np.concatenate(part) for part in zip(*good)))  # the 10 good steps
    assert_no_trace(run.state(), clean.state())


@pytest.mark.parametrize("compression,error_feedback", [("none", False), ("sign", True),
                                                        ("powersgd", True)])  # (random-k's
# residuals: the fit cells above; one case fewer for CI's time)
def test_trainer_refuses_a_nan_and_restores_batchnorm_statistics(strategies, compression,
                                                                  error_feedback):
    """The Trainer also takes back what the forward pass of the refused batch did to the
    model's non-trainable state (BatchNormalization statistics, the dropout seed)."""
    for nan_replica in (0, 1):
        final, clean = refused_then_continued(strategies("mirrored"), "trainer", compression,
                                              error_feedback, nan_replica, batchnorm=True)
        assert_no_trace(final, clean)


@pytest.mark.parametrize("loop", ["fit", "trainer"])
def test_local_sgd_with_a_compressed_average_keeps_its_anchors(strategies, loop):
    final, clean = refused_then_continued(strategies("mirrored"), loop, "int8", False, 1,
                                          local_sgd=2)
    assert_no_trace(final, clean)


@pytest.mark.parametrize("loop", [pytest.param("fit", marks=pytest.mark.matrix), "trainer"])
def test_gradient_accumulation_keeps_its_accumulators(strategies, loop):
    final, clean = refused_then_continued(strategies("mirrored"), loop, "none", False, 0,
                                          accumulate=2)
    assert_no_trace(final, clean)


def test_central_storage_refuses_a_nan_on_one_replica(strategies):
    final, clean = refused_then_continued(strategies("central_storage"), "fit", "none", False, 1)
    assert_no_trace(final, clean)


@pytest.mark.matrix
def test_an_inf_is_refused_like_a_nan(strategies):
    strategy = strategies("mirrored")
    good, _, _ = batches(0)
    x, y = good[0].copy(), good[1]
    x[20, 4, 4, 0] = np.inf  # replica 1's half
    run = Run(strategy, "fit", "topk", True)
    run.step(good)
    before = run.state()
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf gradient"):
        run.step((x, y))
    assert_same(run.state(), before)


@pytest.mark.matrix
def test_the_decision_is_the_same_on_every_replica(strategies):
    """One replica's non-finite gradient refuses the step on all of them; the count of
    refusing replicas is reported to each."""
    strategy = strategies("mirrored")

    @tf.function
    def decide(bad_replica):
        def replica_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            grad = tf.where(tf.equal(replica, bad_replica), np.float32(np.inf), 1.0)
            decision = transaction.decide([tf.fill([3], grad), None])
            return decision.committed, decision.refusals

        return strategy.run(replica_fn)

    for bad, expected in ((0, False), (1, False), (2, True)):  # 2: no replica is bad
        committed, refusals = decide(tf.constant(bad))
        assert [bool(c) for c in strategy.experimental_local_results(committed)] == [expected] * 2
        assert [float(r) for r in strategy.experimental_local_results(refusals)] == \
            [0.0 if expected else 1.0] * 2


def step_ops(strategy, loss_scale):
    """{op type: count} of the compiled step of a custom loop with tfdist's `none` optimizer
    (the conv model's Adam), also inside Keras' `LossScaleOptimizer`; bodies of functions
    and of both branches of every `tf.cond` included."""
    from models import conv_model, images

    with strategy.scope():
        model = conv_model(seed=3)
        optimizer = keras.optimizers.Adam(0.01)
        if loss_scale:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer = tfdist.keras.DistributedOptimizer(optimizer, "none", strategy=strategy)
        optimizer.build(model.trainable_variables)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=True), from_logits=True))
            scaled = optimizer.scale_loss(loss) if loss_scale else loss
        optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables),
                                      model.trainable_variables))

    step = tfdist.function(lambda x, y: strategy.run(replica_step, args=(x, y)), model=model,
                           optimizer=optimizer)
    x, y = images(BATCH, seed=1)
    step(x, y)  # the driver traces the step for the hooks' phase
    graph = step.driver.function(None).get_concrete_function(x, y).graph.as_graph_def()
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return collections.Counter(n.op for n in nodes), len(model.trainable_variables)


def test_where_a_refused_step_fails_no_update_is_in_a_cond(strategies):
    """Float32, no loss scaling: a refused step fails, so the updates wait for that check
    (`Decision.fail_first`) instead of a `tf.cond` each, and the finiteness check has none
    either (the pass-through's cost, issue 33: ~460 graph ops a step on the UNet). Under
    dynamic loss scaling a refused step is skipped, not failed: every variable's update
    stays conditional. (That the guarded updates never run in a refused step is what the
    tests above check, on every replica.)"""
    strategy = strategies("mirrored")
    failing, variables = step_ops(strategy, loss_scale=False)
    skipping, _ = step_ops(strategy, loss_scale=True)
    conds = ("If", "StatelessIf")
    assert sum(failing[op] for op in conds) == 0, failing
    assert sum(skipping[op] for op in conds) >= 2 * variables, skipping  # on each replica
    assert failing["Assert"] >= 2  # each replica's refusal


def test_under_xla_a_refused_step_keeps_its_conds_and_changes_nothing():
    """XLA (`jit_compile=True`; Keras' "auto" on a GPU without a strategy) drops
    `tf.debugging.Assert`, so updates that only waited for it would apply a NaN: there
    each update stays in its `tf.cond` and the refused step is skipped (without the error,
    which XLA drops too). The context is TensorFlow's private seam: checked here."""
    assert transaction.compiled_by_xla() is False
    seen = {}

    def traced(jit):
        seen[jit] = transaction.compiled_by_xla()
        return tf.constant(0)

    for jit in (False, True):
        tf.function(lambda jit=jit: traced(jit), jit_compile=jit)()
    assert seen == {False: False, True: True}
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(0.1), "none"), "mse",
                  jit_compile=True)
    x, y = np.ones((8, 4), "float32"), np.ones((8, 1), "float32")
    fit = dict(batch_size=8, verbose=0, callbacks=[tfdist.callbacks.TrainingHooks()])
    model.fit(x, y, **fit)
    def state():
        return [np.array(v.numpy()) for v in model.weights + model.optimizer.variables]

    before = state()
    x[5, 0] = np.nan
    model.fit(x, y, **fit)
    after = state()
    assert len(after) > 4
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)
    model.fit(np.ones((8, 4), "float32"), y, **fit)  # and it trains on
    assert not np.array_equal(model.get_weights()[0], before[0])


def test_a_hook_assignment_outside_a_step_is_plain_and_inside_a_refused_one_is_dropped():
    variable = tf.Variable([1.0, 2.0])
    transaction.assign(variable, [3.0, 4.0])
    np.testing.assert_array_equal(variable.numpy(), [3.0, 4.0])
    with transaction.active(transaction.decide([tf.constant([np.nan])])):
        transaction.assign(variable, [np.nan, 5.0])
    np.testing.assert_array_equal(variable.numpy(), [3.0, 4.0])
    with transaction.active(transaction.decide([tf.constant([1.0])])):
        transaction.assign(variable, [6.0, 7.0])
    np.testing.assert_array_equal(variable.numpy(), [6.0, 7.0])
    assert transaction.current() is None


FINITE_CASES = {  # name: tensors (NumPy arrays)
    "finite": [np.ones((3, 4), "float32"), np.arange(5, dtype="float32")],
    "a NaN": [np.ones(3, "float32"), np.array([1.0, np.nan], "float32")],
    "an Inf": [np.array([np.inf, 1.0], "float32")],
    "Inf and -Inf in two tensors": [np.array([np.inf], "float32"),
                                    np.array([-np.inf], "float32")],
    "finite, but the sum overflows float32": [np.full(4, 3e38, "float32")],
    "float16 whose sum overflows float16": [np.full(4, 60000, "float16")],
    "a float16 Inf": [np.array([np.inf, 2], "float16")],
    "bfloat16 and float32": [np.ones(3, "float32"), np.ones(2, "float32")],
    "float64 beyond float32's range": [np.array([1e300, -1e300, 1e300])],
    "a float64 NaN": [np.array([1e300, np.nan])],
    "an empty tensor": [np.zeros((0, 3), "float32"), np.ones(2, "float32")],
}


@pytest.mark.parametrize("case", FINITE_CASES)
@pytest.mark.parametrize("compiled", [False, True])
def test_all_finite_is_numpys_isfinite_of_the_sum(case, compiled):
    """The verdict's check (one sum, in float32 or wider) says what NumPy says: every
    element finite, and float32 values that do not sum beyond float32's range (those
    refuse the step too: they are the only difference from checking each element)."""
    arrays = FINITE_CASES[case]
    tensors = [tf.constant(a) for a in arrays]
    if case.startswith("bfloat16"):
        tensors[0] = tf.cast(tensors[0], tf.bfloat16)
    check = tf.function(transaction.all_finite) if compiled else transaction.all_finite
    each = all(np.all(np.isfinite(a)) for a in arrays)
    with np.errstate(over="ignore", invalid="ignore"):
        total = sum(np.sum(a, dtype=np.float32) for a in arrays if a.dtype != np.float64)
    expected = each and bool(np.isfinite(total))
    assert expected is (each and case != "finite, but the sum overflows float32")
    assert bool(check(tensors)) is expected
    assert bool(transaction.all_finite([])) is True
