"""DiLoCo and Streaming DiLoCo (`tfdist.local_sgd`) on 2 logical CPUs, against NumPy.

A linear model with a squared loss has gradients NumPy computes exactly, so each
replica's inner steps, the mean pseudo-gradient, the outer Nesterov step, the staggered
fragments and the overlapped, mixed exchange are all recomputed independently here.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.local_sgd import DiLoCo, ModelAverager
from tfdist.local_sgd import fragments as fragmenting
from tfdist.step.variables import underlying

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")

FEATURES, OUTPUTS, HALF = 3, 2, 4  # each replica takes HALF examples of a global batch
INNER_RATE = 0.05


def data(steps, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * 2 * HALF, FEATURES)).astype(np.float32)
    y = rng.normal(size=(steps * 2 * HALF, OUTPUTS)).astype(np.float32)
    return x, y


def linear_model(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(
            OUTPUTS, kernel_initializer=keras.initializers.RandomNormal(seed=1),
            bias_initializer=keras.initializers.RandomNormal(seed=2))])
        model.compile(keras.optimizers.SGD(INNER_RATE), "mse")
    return model


def replicas_of(model):
    """[replica][variable] arrays."""
    results = model.distribute_strategy.experimental_local_results
    per_variable = [[t.numpy() for t in results(underlying(v))] for v in model.trainable_variables]
    return [list(r) for r in zip(*per_variable)]


def train(strategy, steps, callbacks=(), **options):
    """(model, its first weights, the averager) after `steps` steps of `model.fit` with
    `tfdist.callbacks.LocalSGD(**options)`."""
    model = linear_model(strategy)
    start = [v.numpy() for v in model.trainable_variables]
    x, y = data(steps)
    local_sgd = tfdist.callbacks.LocalSGD(**options)
    model.fit(x, y, batch_size=2 * HALF, epochs=1, shuffle=False, verbose=0,
              callbacks=[local_sgd, *callbacks])
    return model, start, local_sgd.averager


# --- NumPy -----------------------------------------------------------------------------

def gradient(params, x, y):
    """Gradients of mean((x W + b - y)^2) over a replica's batch."""
    kernel, bias = params
    error = 2 * (x @ kernel + bias - y) / error_count(y)
    return [x.T @ error, error.sum(axis=0)]


def error_count(y):
    return y.size


class NumpyDiLoCo:
    """DiLoCo as the papers write it, on [replica][variable] arrays; outer Nesterov in
    PyTorch's form (buf = mu buf + delta; theta -= lr (delta + mu buf))."""

    def __init__(self, start, period, outer_rate, momentum, groups, overlap=0, mix=0.0):
        self.replicas = [[p.copy() for p in start] for _ in range(2)]
        self.anchor = [p.copy() for p in start]
        self.buffer = [np.zeros_like(p) for p in start]
        self.period, self.rate, self.momentum = period, outer_rate, momentum
        self.groups, self.overlap, self.mix = groups, overlap, mix
        self.pending = {}  # fragment -> (mean pseudo-gradient, local step to apply at)

    def run(self, x, y, steps):
        for step in range(1, steps + 1):
            synced = set()  # fragments whose replicas agree after this step
            batch = slice((step - 1) * 2 * HALF, step * 2 * HALF)
            for r, params in enumerate(self.replicas):
                half = slice(batch.start + r * HALF, batch.start + (r + 1) * HALF)
                grads = gradient(params, x[half], y[half])
                self.replicas[r] = [p - INNER_RATE * g for p, g in zip(params, grads)]
            for fragment, (delta, at) in list(self.pending.items()):
                if at == step:
                    self.apply(fragment, delta, self.mix)
                    del self.pending[fragment]
                    synced |= {fragment} if self.mix == 0 else set()
            for fragment in fragmenting.due(step, len(self.groups), self.period):
                delta = self.pseudo_gradient(fragment)
                if self.overlap:
                    self.pending[fragment] = (delta, step + self.overlap)
                else:
                    self.apply(fragment, delta, 0.0)
                    synced.add(fragment)
        # The read at the end makes one model: exchanges in flight arrive (unmixed), then
        # the fragments whose replicas still differ synchronise.
        for fragment, (delta, _) in list(self.pending.items()):
            self.apply(fragment, delta, 0.0)
            synced.add(fragment)
        for fragment in sorted(set(range(len(self.groups))) - synced):
            self.apply(fragment, self.pseudo_gradient(fragment), 0.0)

    def pseudo_gradient(self, fragment):
        return {i: np.mean([self.anchor[i] - r[i] for r in self.replicas], axis=0)
                for i in self.groups[fragment]}

    def apply(self, fragment, delta, mix):
        for i in self.groups[fragment]:
            self.buffer[i] = self.momentum * self.buffer[i] + delta[i]
            self.anchor[i] = self.anchor[i] - self.rate * (delta[i] + self.momentum * self.buffer[i])
            for r in self.replicas:
                r[i] = mix * r[i] + (1 - mix) * self.anchor[i]


# --- against NumPy ---------------------------------------------------------------------

@pytest.mark.parametrize("fragments,overlap,mix", [(1, 0, 0.0), (2, 0, 0.0), (1, 1, 0.5),
                                                   pytest.param(2, 2, 0.0, marks=pytest.mark.matrix)])
def test_outer_nesterov_steps_equal_numpy(strategies, fragments, overlap, mix):
    strategy = strategies("mirrored")
    period, steps = 4, 12
    model, start, averager = train(
        strategy, steps, period=period, outer={"name": "nesterov", "learning_rate": 0.7,
                                               "momentum": 0.9},
        fragments=fragments, overlap_steps=overlap, overlap_mix=mix)
    expected = NumpyDiLoCo(start, period, 0.7, 0.9, averager.groups, overlap, mix)
    expected.run(*data(steps), steps)
    for replica in replicas_of(model):  # every replica holds the same, NumPy's, weights
        for got, want in zip(replica, expected.anchor):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    if fragments == 1 and not overlap:
        assert averager.outer_optimizer.iterations.numpy() == steps // period


@pytest.mark.parametrize("fragments,overlap,mix", [(2, 2, 0.5), (2, 0, 0.0)])
def test_streamed_local_sgd_without_an_outer_step_equals_numpy(strategies, fragments,
                                                                overlap, mix):
    """Plain local SGD from the first step, synchronised in fragments beside the next steps
    and mixed with the local weights (configs/unet_streaming_local_sgd.yaml's shape): each
    fragment's replicas become the mean, as an outer SGD step of rate 1 without momentum
    would make them."""
    strategy = strategies("mirrored")
    period, steps = 4, 12
    model, start, averager = train(strategy, steps, period=period, fragments=fragments,
                                   overlap_steps=overlap, overlap_mix=mix)
    assert averager.outer_optimizer is None
    expected = NumpyDiLoCo(start, period, 1.0, 0.0, averager.groups, overlap, mix)
    expected.run(*data(steps), steps)
    for replica in replicas_of(model):
        for got, want in zip(replica, expected.anchor):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_the_outer_step_is_not_plain_averaging(strategies):
    strategy = strategies("mirrored")
    diloco, _, _ = train(strategy, 8, period=4, outer="nesterov")
    plain, _, _ = train(strategy, 8, period=4)
    gap = max(np.abs(a - b).max() for a, b in zip(replicas_of(diloco)[0], replicas_of(plain)[0]))
    assert gap > 1e-3


def test_outer_sgd_at_rate_one_without_momentum_is_todays_local_sgd_bit_for_bit(strategies):
    strategy = strategies("mirrored")
    today, _, _ = train(strategy, 9, period=3)
    outer, _, _ = train(strategy, 9, period=3, outer={"name": "sgd", "learning_rate": 1.0})
    for a, b in zip(replicas_of(today), replicas_of(outer)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    # and through the optimizer itself (a Keras SGD instance is always run as one)
    stepped, _, _ = train(strategy, 9, period=3, outer=keras.optimizers.SGD(1.0))
    for x, y in zip(replicas_of(today)[0], replicas_of(stepped)[0]):
        np.testing.assert_allclose(x, y, atol=1e-6)


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(replicas_of(self.model))


def test_each_fragment_is_synchronised_once_per_period_at_its_step(strategies):
    strategy = strategies("mirrored")
    period, fragments, steps = 6, 3, 12
    record = Record()
    _, _, averager = train(strategy, steps, [record], period=period, outer="nesterov",
                           fragments=fragments)
    assert len(averager.groups) == 2  # a Dense layer has 2 variables: 2 fragments at most
    for step, (a, b) in enumerate(record.seen, start=1):
        agree = [all(np.array_equal(a[i], b[i]) for i in group) for group in averager.groups]
        due = fragmenting.due(step, len(averager.groups), period)
        assert agree == [f in due for f in range(len(averager.groups))], (step, agree)
    assert [fragmenting.offset(f, 2, period) for f in range(2)] == [3, 0]


def test_fragments_split_the_model_in_similar_consecutive_parts():
    assert fragmenting.split([10, 10, 10, 10], 2) == [[0, 1], [2, 3]]
    assert fragmenting.split([1, 1, 100], 3) == [[0], [1], [2]]
    assert fragmenting.split([5], 4) == [[0]]
    groups = fragmenting.split(list(range(1, 30)), 4)
    assert sum(groups, []) == list(range(29)) and len(groups) == 4
    shares = [sum(range(1, 30)[i] for i in g) / sum(range(1, 30)) for g in groups]
    assert max(shares) < 0.4


def test_every_step_a_fragment_is_due_at_most_once_per_period():
    for period, count in [(8, 1), (8, 3), (32, 4), (5, 5)]:
        due = [f for step in range(1, 3 * period + 1) for f in fragmenting.due(step, count, period)]
        assert sorted(due) == sorted(list(range(count)) * 3)


# --- options -----------------------------------------------------------------------------

@pytest.mark.parametrize("options,match", [
    ({"fragments": 0}, "fragments"), ({"fragments": 9}, "fragments"),
    ({"overlap_steps": 8}, "overlap_steps"), ({"overlap_mix": 1.5}, "overlap_mix"),
    ({"outer": "nesterovv"}, "nesterovv"), ({"outer": {"name": "sgd", "momentun": 0.9}}, "momentun"),
])
def test_bad_options_are_refused_with_their_name(options, match):
    with pytest.raises(ValueError, match=match):
        ModelAverager(8, **options)


@pytest.mark.parametrize("arguments, key", [
    (lambda: dict(outer=keras.optimizers.SGD(0.1, clipnorm=1.0)), "outer"),
    (lambda: dict(outer=keras.optimizers.Adamax(0.1)), "outer"),
    (lambda: dict(compression=tfdist.compression.build("topk", start_step=4)),
     "compression.start_step"),
    (lambda: dict(warmup_steps="auto", warmup_compression=tfdist.compression.build("topk")),
     "warmup_steps"),
    (lambda: dict(warmup_steps=4, warmup_compression=tfdist.compression.build(
        "topk", ratio_warmup_steps=4, ratio_warmup_start=0.5)), "warmup_compression"),
], ids=["clipped-outer", "another-class", "delayed-compression", "auto-without-auto",
        "phased-warmup"])
def test_an_object_it_cannot_take_is_a_config_error_naming_its_argument(arguments, key):
    """Objects no config file can hold (a Keras optimizer, a compression hook) are checked
    where they are used, with the config's one error type, naming the argument."""
    from tfdist.config import ConfigError

    with pytest.raises(ConfigError) as refused:
        ModelAverager(8, **arguments())
    assert (refused.value.file, refused.value.key) == ("ModelAverager()", key)


def test_the_outer_optimizer_is_built_from_a_name_a_mapping_or_an_instance():
    from tfdist.local_sgd.outer import is_plain_average, outer_optimizer

    nesterov = outer_optimizer("nesterov")
    assert nesterov.nesterov and nesterov.momentum == 0.9
    assert float(nesterov.learning_rate) == pytest.approx(0.7)
    adam = outer_optimizer({"name": "adam", "learning_rate": 0.1})
    assert isinstance(adam, keras.optimizers.Adam) and float(adam.learning_rate) == pytest.approx(0.1)
    given = keras.optimizers.SGD(0.3, momentum=0.5)
    copy = outer_optimizer(given)
    assert copy is not given and copy.get_config() == given.get_config()
    assert is_plain_average(None) and is_plain_average({"name": "sgd", "learning_rate": 1})
    assert DiLoCo(8).outer == "nesterov" and ModelAverager(8).outer is None
    assert not is_plain_average({"name": "sgd", "learning_rate": 1, "momentum": 0.9})


# --- every loop, and backups -------------------------------------------------------------

STREAMING = dict(period=4, outer="nesterov", fragments=2, overlap_steps=1)


@pytest.mark.matrix
def test_the_same_hook_in_the_trainer_and_your_own_loop_gives_fits_weights(strategies):
    strategy = strategies("mirrored")
    steps = 12
    fitted, _, _ = train(strategy, steps, **STREAMING)
    x, y = data(steps)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(2 * HALF)

    model = linear_model(strategy)
    trainer = tfdist.Trainer(model, keras.optimizers.SGD(INNER_RATE),
                             keras.losses.MeanSquaredError(), strategy=strategy,
                             hooks=[ModelAverager(**STREAMING)])
    trainer.fit(batches, epochs=1, verbose=0)
    trained = replicas_of(model)

    model = linear_model(strategy)
    with strategy.scope():
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(INNER_RATE),
                                                      hooks=[ModelAverager(**STREAMING)])
        optimizer.build(model.trainable_variables)

    def replica_step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(model(features) - labels), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=2 * HALF)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))

    step = tfdist.function(lambda inputs: strategy.run(replica_step, args=(inputs,)),
                           model=model, optimizer=optimizer)
    for batch in strategy.experimental_distribute_dataset(batches):
        step(batch)
    step.before_read()
    own = replicas_of(model)
    for replicas in (trained, own):
        for replica in replicas:
            for got, want in zip(replica, replicas_of(fitted)[0]):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_backup_resumes_the_outer_momentum_exactly(strategies, tmp_path):
    from faults import Interrupt

    strategy = strategies("mirrored")
    x, y = data(4)

    def run(callbacks, averager):
        model = linear_model(strategy)
        model.fit(x, y, batch_size=2 * HALF, epochs=4, shuffle=False, verbose=0,
                  callbacks=[tfdist.callbacks.LocalSGD(**averager), *callbacks])
        return model

    options = dict(period=2, outer="nesterov")
    clean = run([], options)
    momentum = [m.numpy() for m in clean.optimizer.tfdist_hook_state[0].momentums]
    assert max(np.abs(m).max() for m in momentum) > 1e-3  # a state worth resuming
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        run([tfdist.callbacks.BackupAndRestore(backup), Interrupt(epoch=2)], options)
    resumed = run([tfdist.callbacks.BackupAndRestore(backup)], options)
    for got, want in zip(replicas_of(resumed)[0], replicas_of(clean)[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    restored = resumed.optimizer.tfdist_hook_state[0]
    assert restored.iterations.numpy() == clean.optimizer.tfdist_hook_state[0].iterations.numpy()
