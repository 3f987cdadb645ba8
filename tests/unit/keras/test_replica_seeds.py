"""Per-replica random draws (tfdist/keras/replica_seeds.py): under a TF strategy Keras 3's
random layers draw the same numbers on every replica (a global batch of N×B rows gets B
masks or transforms); `tfdist.keras.per_replica_seeds(model)` gives each replica its own.
Counted here on 2 replicas, in `fit` against a hand computation, on one replica against
plain Keras, and on 2 worker processes. Also the documented fact beside it: a custom
`train_step` that does not scale its loss takes N times one device's step."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.keras.replica_seeds import ReplicaSeedGenerator
from paths import JOBS

pytestmark = pytest.mark.usefixtures("two_cpus")

B, FEATURES = 16, 64  # rows per replica; a row's mask has 2**64 outcomes: no collisions


def draw(strategy, model, x, steps=1):
    """[step][replica] -> NumPy output of `model(x_r, training=True)`, where replica r
    reads its share of the global batch `x`."""
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(x))
    batch = next(iter(data))
    step = tf.function(lambda b: strategy.run(lambda v: model(v, training=True), (b,)))
    return [[o.numpy() for o in strategy.experimental_local_results(step(batch))]
            for _ in range(steps)]


def distinct(arrays):
    """The number of distinct rows over `arrays` (rounded to 1e-4)."""
    return len({row.round(4).tobytes() for a in arrays for row in a.reshape(len(a), -1)})


def two_layers(strategy, make):
    """(plain, folded): two copies of the layer `make()` makes (same seed), under the
    strategy's scope; the second given per-replica seeds."""
    with strategy.scope():
        plain, folded = make(), make()
    assert tfdist.keras.per_replica_seeds(folded) is folded
    return plain, folded


def image(rows):
    """`rows` copies of one asymmetric 8x8 image (every transform shows)."""
    return np.repeat(np.arange(64, dtype="float32").reshape(1, 8, 8, 1), rows, axis=0)


@pytest.mark.parametrize("make, x", [
    (lambda: keras.layers.Dropout(0.5, seed=7), np.ones((2 * B, FEATURES), "float32")),
    (lambda: keras.layers.GaussianNoise(1.0, seed=7), np.ones((2 * B, FEATURES), "float32")),
    (lambda: keras.layers.RandomRotation(0.4, seed=7), image(2 * B))],
    ids=["Dropout", "GaussianNoise", "RandomRotation"])
def test_a_global_batch_gets_n_times_b_draws_with_the_option_and_b_without(strategies, make,
                                                                            x):
    plain, folded = two_layers(strategies("mirrored"), make)
    [without], [with_] = draw(strategies("mirrored"), plain, x), \
        draw(strategies("mirrored"), folded, x)
    np.testing.assert_array_equal(without[0], without[1])  # Keras: row i alike on both
    assert distinct(without) == B
    assert distinct(with_) == 2 * B
    assert all(not np.allclose(a, b) for a, b in zip(with_[0], with_[1]))  # every row


def test_central_storage_replicas_draw_their_own_too(strategies):
    strategy = strategies("central_storage")
    plain, folded = two_layers(strategy, lambda: keras.layers.Dropout(0.5, seed=7))
    x = np.ones((2 * B, FEATURES), "float32")
    [without], [with_] = draw(strategy, plain, x), draw(strategy, folded, x)
    assert (distinct(without), distinct(with_)) == (B, 2 * B)


def test_random_flip_flips_each_replicas_rows_its_own_way_with_the_option(strategies):
    """A flip has 4 outcomes a row: what differs is each replica's sequence of them."""
    make = lambda: keras.layers.RandomFlip("horizontal_and_vertical", seed=7)  # noqa: E731
    plain, folded = two_layers(strategies("mirrored"), make)
    x = image(2 * B)
    [without], [with_] = draw(strategies("mirrored"), plain, x), \
        draw(strategies("mirrored"), folded, x)
    outcomes = lambda out: [row.round(4).tobytes() for row in out]  # noqa: E731
    assert outcomes(without[0]) == outcomes(without[1])
    assert outcomes(with_[0]) != outcomes(with_[1])
    assert distinct(with_[0]) > 1 and distinct(with_[1]) > 1  # rows still differ within


def test_draws_change_from_step_to_step_as_before(strategies):
    plain, folded = two_layers(strategies("mirrored"),
                               lambda: keras.layers.Dropout(0.5, seed=7))
    x = np.ones((2 * B, FEATURES), "float32")
    for layer in (plain, folded):
        steps = draw(strategies("mirrored"), layer, x, steps=3)
        assert distinct([s[0] for s in steps]) == 3 * B  # replica 0: new masks each step
        assert distinct([s[1] for s in steps]) == 3 * B
        # Keras' own state counts on: one step per call, folded or not.
        np.testing.assert_array_equal(layer.seed_generator.state.numpy(), [7, 3])


def test_nested_models_and_a_users_own_generator_class_fold_too(strategies):
    class Shifted(keras.random.SeedGenerator):  # a user's generator: its behaviour kept
        def next(self, ordered=True):
            return super().next(ordered) + tf.constant([1, 0], tf.int64)

    class Noise(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.generator = Shifted(3)

        def call(self, x, training=False):
            return x + keras.random.normal(tf.shape(x), seed=self.generator)

    strategy = strategies("mirrored")
    with strategy.scope():
        inner = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dropout(0.5)])
        model = keras.Sequential([keras.Input((FEATURES,)), inner, Noise()])
    tfdist.keras.per_replica_seeds(model)
    generators = [g for layer in model._flatten_layers() for g in layer._seed_generators]
    assert len(generators) == 2
    assert all(isinstance(g, ReplicaSeedGenerator) for g in generators)
    shifted = model.layers[-1].generator
    assert isinstance(shifted, Shifted) and type(shifted).__name__ == "Shifted"
    [out] = draw(strategy, model, np.zeros((2 * B, FEATURES), "float32"))  # noise alone
    assert distinct(out) == 2 * B
    for r in range(2):  # replica r: Keras' normal at fold_in(Shifted's seed [3 + 1, 0], r)
        seed = tf.random.experimental.stateless_fold_in(tf.constant([4, 0], tf.int64), r)
        expected = tf.random.stateless_normal((B, FEATURES), seed=_keras_seed(seed))
        np.testing.assert_allclose(out[r], expected.numpy(), rtol=1e-6)


def test_a_layer_added_after_the_call_draws_as_before_until_it_is_called_again(strategies):
    strategy = strategies("mirrored")
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,))])
        tfdist.keras.per_replica_seeds(model)
        model.add(keras.layers.Dropout(0.5, seed=7))
        twin = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dropout(0.5, seed=7)])
    x = np.ones((2 * B, FEATURES), "float32")
    [late] = draw(strategy, model, x)
    np.testing.assert_array_equal(late[0], late[1])
    tfdist.keras.per_replica_seeds(model)
    tfdist.keras.per_replica_seeds(model)  # idempotent: folded once
    tfdist.keras.per_replica_seeds(twin)
    [again] = draw(strategy, model, x)
    assert distinct(again) == 2 * B
    twin.layers[0].seed_generator.state.assign([7, 1])  # the same step as `again`
    [once] = draw(strategy, twin, x)
    np.testing.assert_array_equal(np.concatenate(again), np.concatenate(once))


# --- fit ------------------------------------------------------------------------------------

def _keras_seed(seed):
    """Keras' TF backend's cast of an int64 seed to the int32 stateless ops take."""
    return tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)


def _one_sgd_step_by_hand(seeds, lr=0.1, target=1.0):
    """The kernel after one SGD step of Dropout(0.5) -> Dense(1, no bias, kernel 0.1) on
    rows of ones under MSE, replica r's B rows masked from `seeds[r]`, the replicas'
    mean gradients averaged (Keras' loss scaling + the all-reduce sum)."""
    kernel = np.full((FEATURES, 1), 0.1)
    grads = []
    for seed in seeds:
        h = tf.nn.experimental.stateless_dropout(tf.ones((B, FEATURES)), 0.5,
                                                 seed=_keras_seed(seed)).numpy()
        grads.append((2 * (h @ kernel - target) * h).mean(axis=0)[:, None])
    return kernel - lr * np.mean(grads, axis=0)


def dropout_regression(folded):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((FEATURES,)), keras.layers.Dropout(0.5, seed=7),
        keras.layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(0.1))])
    if folded:
        tfdist.keras.per_replica_seeds(model)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


@pytest.mark.parametrize("folded", [False, True])
def test_fit_on_two_replicas_draws_the_masks_the_hand_computation_names(strategies, folded):
    """fit's one step equals the step computed by hand from replica r's seed: Keras'
    [7, 0] on both without the option, fold_in([7, 0], r) with it."""
    strategy = strategies("mirrored")
    with strategy.scope():
        model = dropout_regression(folded)
    data = tf.data.Dataset.from_tensors((tf.ones((2 * B, FEATURES)), tf.ones((2 * B, 1))))
    model.fit(data, epochs=1, verbose=0)
    state = tf.constant([7, 0], tf.int64)
    seeds = [tf.cast(tf.random.experimental.stateless_fold_in(state, r), tf.int64)
             if folded else state for r in range(2)]
    np.testing.assert_allclose(model.layers[-1].kernel.numpy(), _one_sgd_step_by_hand(seeds),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model.layers[0].seed_generator.state.numpy(), [7, 1])


def _fit(strategy, make, folded, x, y):
    with strategy.scope():
        keras.utils.set_random_seed(2)
        model = make()
        if folded:
            tfdist.keras.per_replica_seeds(model)
        model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(x, y, batch_size=2 * B, epochs=2, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights]


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * B, 8, 8, 1)).astype("float32")
    return x, x.mean(axis=(1, 2))


def _deterministic():
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3),
                             keras.layers.Flatten(), keras.layers.Dense(1)])


def _random():
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.RandomFlip(seed=3),
                             keras.layers.RandomRotation(0.2, seed=4),
                             keras.layers.GaussianNoise(0.1, seed=5), keras.layers.Conv2D(4, 3),
                             keras.layers.Flatten(), keras.layers.Dropout(0.3, seed=6),
                             keras.layers.Dense(1)])


def test_a_model_with_no_random_layers_trains_to_the_same_weights_with_and_without(strategies):
    x, y = _data()
    without = _fit(strategies("mirrored"), _deterministic, False, x, y)
    with_ = _fit(strategies("mirrored"), _deterministic, True, x, y)
    for a, b in zip(without, with_):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["default", "one_device"])
def test_on_one_replica_a_random_model_trains_exactly_as_plain_keras(strategies, name):
    x, y = _data()
    strategy = tf.distribute.get_strategy() if name == "default" else strategies(name)
    without = _fit(strategy, _random, False, x, y)
    with_ = _fit(strategy, _random, True, x, y)
    for a, b in zip(without, with_):
        np.testing.assert_array_equal(a, b)


def test_a_saved_model_loads_as_plain_keras(tmp_path):
    model = tfdist.keras.per_replica_seeds(dropout_regression(False))
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert type(loaded.layers[0].seed_generator) is keras.random.SeedGenerator
    as_saved = lambda m: json.loads(json.dumps(m.get_config()))  # noqa: E731 (tuples: lists)
    assert as_saved(loaded) == as_saved(model)  # the config never names tfdist
    np.testing.assert_array_equal(loaded.layers[0].seed_generator.state.numpy(),
                                  model.layers[0].seed_generator.state.numpy())


def test_a_custom_train_step_that_does_not_scale_its_loss_steps_n_times(strategies):
    """The documented behaviour (docs/guides/fit.md): TF's strategies sum the replicas'
    gradients, Keras' `compute_loss` divides by the replicas; a train_step that takes a
    plain mean moves the weights 2x one device's step on 2 replicas."""
    class Unscaled(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            return {"loss": loss}

    def step(strategy, cls):
        with strategy.scope():
            inputs = keras.Input((4,))
            model = cls(inputs, keras.layers.Dense(1, kernel_initializer="ones")(inputs))
            model.compile(keras.optimizers.SGD(0.01), "mse")
        x = np.arange(4 * 2 * B, dtype="float32").reshape(2 * B, 4) / 100
        model.fit(x, np.zeros((2 * B, 1), "float32"), batch_size=2 * B, epochs=1,
                  shuffle=False, verbose=0)
        return model.layers[-1].kernel.numpy() - 1

    one = step(tf.distribute.get_strategy(), Unscaled)
    np.testing.assert_allclose(step(strategies("mirrored"), Unscaled), 2 * one, rtol=1e-5)
    np.testing.assert_allclose(step(strategies("mirrored"), keras.Model), one, rtol=1e-5)


# --- two worker processes ------------------------------------------------------------------

JOB = JOBS / "replica_seeds_job.py"


@pytest.mark.multiprocess
def test_two_workers_draw_their_own_masks_only_with_the_option(write_config, tmp_path):
    config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    (tmp_path / "tmp").mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds", "5", "--",
         sys.executable, str(JOB), str(tmp_path)],
        capture_output=True, text=True, timeout=240,
        env={**__import__("os").environ, "TMPDIR": str(tmp_path / "tmp")})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    masks = [json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in (0, 1)]
    plain = [np.array(m["plain"]) for m in masks]
    folded = [np.array(m["folded"]) for m in masks]
    np.testing.assert_array_equal(plain[0], plain[1])  # Keras: the same rows on each worker
    assert distinct(plain) == len(plain[0])
    assert distinct(folded) == 2 * len(folded[0])
