"""Mixed precision on 2 replicas: dynamic loss scaling is part of the transactional step.

One replica's batch is made to overflow at chosen steps (a large but finite input: the
loss stays finite, the scaled float16 gradients do not) while the other's does not. Every
replica must skip the same steps, halve the loss scale identically, and end exactly where
a run that never saw those batches ends (the independent computation: skipping a step
must leave no trace, and scales are powers of two, so nothing else differs) — with each
compressor, a delayed start, local SGD and DiLoCo; in `fit`, the Trainer and your own loop.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.seam.loss_scale import LossScaleOptimizer

pytestmark = pytest.mark.usefixtures("two_cpus")

STEPS, BATCH, BAD_STEPS, GROWTH = 8, 32, (2, 5), 3
EXCHANGES = {  # name: DistributedOptimizer options
    "none": {},
    "fp16": {"compression": "fp16", "min_size": 0},
    "int8": {"compression": "int8", "min_size": 0},
    "qsgd": {"compression": "qsgd", "min_size": 0},
    "sign+EF": {"compression": "sign", "error_feedback": True, "min_size": 0},
    "topk+EF": {"compression": "topk", "ratio": 0.3, "error_feedback": True, "min_size": 0},
    "randomk+EF": {"compression": "randomk", "ratio": 0.3, "error_feedback": True,
                   "min_size": 0},
    "powersgd+EF": {"compression": "powersgd", "rank": 2, "error_feedback": True,
                    "min_size": 0},
    "topk+EF from step 3": {"compression": "topk", "ratio": 0.3, "error_feedback": True,
                            "min_size": 0, "start_step": 3},
    "local SGD 2": {"hooks": "local_sgd"},
    "DiLoCo 2": {"hooks": "diloco"},
}


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def model_for(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1, dtype="float32")])


def batches(bad_steps=BAD_STEPS, bad_replica=1):
    """STEPS global batches; at `bad_steps` one sample of `bad_replica`'s half is 300:
    its loss is finite, its gradient times the loss scale overflows float16."""
    rng = np.random.default_rng(0)
    out = []
    for step in range(STEPS):
        x = rng.normal(size=(BATCH, 4)).astype("float32")
        y = x.sum(axis=1, keepdims=True) * 0.5
        if step in bad_steps:
            x[bad_replica * BATCH // 2 + 3] = 300.0
        out.append((x, y))
    return out


def optimizer_for(name, strategy, wrap=None):
    options = dict(EXCHANGES[name])
    hooks = options.pop("hooks", None)
    if hooks:
        period = 2
        hooks = [tfdist.local_sgd.ModelAverager(period) if hooks == "local_sgd"
                 else tfdist.local_sgd.DiLoCo(period, outer={"name": "nesterov",
                                                             "learning_rate": 0.5})]
    compression = options.pop("compression", "none")
    inner = keras.optimizers.SGD(0.01)
    if wrap == "inside":  # DistributedOptimizer(LossScaleOptimizer(...)): the reverse
        inner = keras.optimizers.LossScaleOptimizer(inner, dynamic_growth_steps=GROWTH)
    optimizer = tfdist.keras.DistributedOptimizer(inner, compression, strategy=strategy,
                                                  hooks=hooks or (), **options)
    if wrap == "outside":  # LossScaleOptimizer(DistributedOptimizer(...)), by hand
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, dynamic_growth_steps=GROWTH)
    return optimizer


class Trajectory(keras.callbacks.Callback):
    """After every batch: the loss scale, the step count and the first kernel, on every
    replica."""

    def __init__(self, strategy, optimizer=None):
        super().__init__()
        self.strategy, self.optimizer = strategy, optimizer
        self.scales, self.steps, self.kernels = [], [], []

    def on_train_batch_end(self, batch, logs=None):
        local = self.strategy.experimental_local_results
        optimizer = self.optimizer or self.model.optimizer
        self.scales.append([float(v) for v in local(optimizer.dynamic_scale.value)])
        self.steps.append(int(optimizer.iterations.numpy()))
        self.kernels.append([k.numpy() for k in local(self.model.layers[0].kernel.value)])


def weights(strategy, model):
    """[replica][variable] arrays."""
    local = strategy.experimental_local_results
    return list(zip(*[[v.numpy() for v in local(w.value)] for w in model.weights]))


def fit(strategy, name, data, wrap=None):
    with strategy.scope():
        model = model_for()
        optimizer = optimizer_for(name, strategy, wrap)
        model.compile(optimizer, "mse")  # under mixed_float16: Keras adds the loss scale
        model.optimizer.dynamic_growth_steps = GROWTH
    trajectory = Trajectory(strategy)
    x, y = (np.concatenate(part) for part in zip(*data))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
              callbacks=[tfdist.callbacks.TrainingHooks(), trajectory])
    return model, trajectory


def expected_scales(bad_steps=BAD_STEPS):
    """Keras' schedule: halve on an overflow, double after GROWTH committed steps."""
    scale, run, scales = 2.0 ** 15, 0, []
    for step in range(STEPS):
        if step in bad_steps:
            scale, run = scale / 2, 0
        else:
            run += 1
            if run == GROWTH:
                scale, run = scale * 2, 0
        scales.append(scale)
    return scales


def assert_skipped_everywhere(trajectory, bad_steps=BAD_STEPS, synchronous=True):
    """The same loss scale on both replicas, on Keras' schedule; the step count skips the
    bad steps; nothing changed in them, on either replica; weights finite (and identical
    on both replicas, unless local SGD lets them differ between averages)."""
    for replicas in trajectory.scales:
        assert replicas[0] == replicas[1]
    assert [s[0] for s in trajectory.scales] == expected_scales(bad_steps)
    committed = [step not in bad_steps for step in range(STEPS)]
    assert trajectory.steps == list(np.cumsum(committed))
    for step, kernels in enumerate(trajectory.kernels):
        if synchronous:
            np.testing.assert_array_equal(kernels[0], kernels[1])
        for replica in (0, 1):
            assert np.isfinite(kernels[replica]).all()
            if step in bad_steps:  # a skipped step changed nothing
                np.testing.assert_array_equal(kernels[replica],
                                              trajectory.kernels[step - 1][replica])


def assert_same_model(strategy, model, reference):
    mine, theirs = weights(strategy, model), weights(strategy, reference)
    for replica in mine:
        for a, b in zip(replica, theirs[0]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(EXCHANGES))
def test_fit_skips_an_overflow_on_one_replica_everywhere_and_leaves_no_trace(
        strategies, mixed_float16, name):
    strategy = strategies("mirrored")
    model, trajectory = fit(strategy, name, batches())
    assert isinstance(model.optimizer, LossScaleOptimizer)  # Keras' own, taken over
    assert_skipped_everywhere(trajectory, synchronous="hooks" not in EXCHANGES[name])
    clean = [b for step, b in enumerate(batches()) if step not in BAD_STEPS]
    reference, _ = fit(strategy, name, clean)
    assert_same_model(strategy, model, reference)


@pytest.mark.parametrize("wrap", [pytest.param("outside", marks=pytest.mark.matrix), "inside"])
def test_every_composition_a_keras_user_writes_runs_the_same_step(strategies,
                                                                  mixed_float16, wrap):
    """LossScaleOptimizer(DistributedOptimizer(...)) and DistributedOptimizer(
    LossScaleOptimizer(...)) train exactly as compile's own wrapping."""
    strategy = strategies("mirrored")
    model, trajectory = fit(strategy, "topk+EF", batches(), wrap=wrap)
    assert isinstance(model.optimizer, LossScaleOptimizer)
    assert_skipped_everywhere(trajectory)
    reference, _ = fit(strategy, "topk+EF", batches())
    assert_same_model(strategy, model, reference)


def dataset(data):
    x, y = (np.concatenate(part) for part in zip(*data))
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def train_with_trainer(strategy, data):
    with strategy.scope():
        model = model_for()
        optimizer = optimizer_for("powersgd+EF", strategy)
    trainer = tfdist.Trainer(model, optimizer, "mse", strategy=strategy)
    trainer.optimizer.dynamic_growth_steps = GROWTH
    trajectory = Trajectory(strategy)
    history = trainer.fit(dataset(data), epochs=1, callbacks=[trajectory], verbose=0)
    return model, trajectory, history.history


@pytest.mark.matrix
def test_the_trainer_scales_the_loss_of_a_mixed_float16_model_and_skips_alike(
        strategies, mixed_float16):
    """The Trainer adds the loss scale itself (as compile does); a skipped step counts in
    no metric: the logged loss is the mean over the committed steps only."""
    strategy = strategies("mirrored")
    model, trajectory, history = train_with_trainer(strategy, batches())
    assert isinstance(model.optimizer, LossScaleOptimizer)
    assert_skipped_everywhere(trajectory)
    clean = [b for step, b in enumerate(batches()) if step not in BAD_STEPS]
    reference, _, clean_history = train_with_trainer(strategy, clean)
    assert_same_model(strategy, model, reference)
    assert history["loss"][0] == pytest.approx(clean_history["loss"][0], rel=1e-5)


def own_loop(strategy, data):
    """TensorFlow's custom-training tutorial with Keras' loss scaling: scale_loss, then
    the optimizer's apply; `tfdist.function(model=...)` on a model never compiled."""
    with strategy.scope():
        model = model_for()
        optimizer = optimizer_for("topk+EF", strategy, wrap="inside")
        optimizer.dynamic_growth_steps = GROWTH
        optimizer.build(model.trainable_variables)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = keras.losses.mean_squared_error(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    @tfdist.function(model=model)
    def train_step(x, y):
        strategy.run(replica_step, args=(x, y))

    trajectory = Trajectory(strategy, optimizer)
    trajectory.set_model(model)
    for x, y in strategy.experimental_distribute_dataset(dataset(data)):
        train_step(x, y)
        trajectory.on_train_batch_end(0)
    train_step.before_read()
    assert train_step.driver.optimizers == [optimizer.inner_optimizer]  # found on its own
    return model, trajectory


def test_your_own_loop_with_scale_loss_skips_alike(strategies, mixed_float16):
    strategy = strategies("mirrored")
    model, trajectory = own_loop(strategy, batches())
    assert_skipped_everywhere(trajectory)
    clean = [b for step, b in enumerate(batches()) if step not in BAD_STEPS]
    reference, _ = own_loop(strategy, clean)
    assert_same_model(strategy, model, reference)


class GAN(keras.Model):
    """The keras-io "Customizing what happens in fit()" GAN (vectors for images): an
    overridden `train_step` with two optimizers, kept as the model's attributes."""

    def __init__(self, latent_dim=4, size=8):
        super().__init__()
        self.latent_dim = latent_dim
        self.discriminator = keras.Sequential([keras.Input((size,)),
                                               keras.layers.Dense(16, activation="relu"),
                                               keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((latent_dim,)),
                                           keras.layers.Dense(16, activation="relu"),
                                           keras.layers.Dense(size)])
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.seed_generator = keras.random.SeedGenerator(1337)
        self.built = True  # its parts are; it has no call() of its own

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
        # tfdist's one addition: state made under the scope, before the first replica step
        d_optimizer.build(self.discriminator.trainable_variables)
        g_optimizer.build(self.generator.trainable_variables)

    def train_step(self, real):
        batch_size = tf.shape(real)[0]
        latent = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        combined = tf.concat([self.generator(latent), real], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        latent = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            fake = self.discriminator(self.generator(latent))
            g_loss = self.loss_fn(tf.zeros((batch_size, 1)), fake)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


class Phases(keras.callbacks.Callback):
    """Whether each of the GAN's exchanges compressed, step by step."""

    def __init__(self):
        super().__init__()
        self.seen = {"d": [], "g": []}

    def on_train_batch_end(self, batch, logs=None):
        for key in self.seen:
            hook = tfdist.core.pipeline_of(getattr(self.model, f"{key}_optimizer")).hooks[0]
            self.seen[key].append(hook.compressing)


def test_a_gan_with_two_compressing_optimizers_switches_each_at_its_step(strategies):
    """Both optimizers are found (as the model's attributes), each switches at its own
    start_step, and CommStats reports each from what its exchange sent: before d's
    start the first epoch mixes uncompressed steps in, which the configuration (what
    CommStats read before) would not show."""
    strategy = strategies("mirrored")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        gan = GAN()
        d_optimizer = tfdist.keras.DistributedOptimizer(
            keras.optimizers.Adam(3e-4), "topk", ratio=0.25, error_feedback=True, min_size=0,
            start_step=2, strategy=strategy)
        g_optimizer = tfdist.keras.DistributedOptimizer(
            keras.optimizers.Adam(3e-4), "int8", min_size=0, start_step=6, strategy=strategy)
        gan.compile(d_optimizer, g_optimizer,
                    keras.losses.BinaryCrossentropy(from_logits=True))
    real = np.random.default_rng(0).normal(2.0, 1.0, size=(8 * 16, 8)).astype("float32")
    phases = Phases()
    history = gan.fit(real, batch_size=16, epochs=2, verbose=0, shuffle=False, callbacks=[
        tfdist.callbacks.TrainingHooks(), tfdist.callbacks.CommStats(), phases]).history
    assert phases.seen["d"] == [False] * 2 + [True] * 14
    assert phases.seen["g"] == [False] * 6 + [True] * 10
    assert int(d_optimizer.iterations.numpy()) == int(g_optimizer.iterations.numpy()) == 16
    verdict = 4  # each step's finiteness flag, all-reduced beside the payload (float32)
    for key, optimizer in (("d", d_optimizer), ("g", g_optimizer)):
        compressed = tfdist.core.pipeline_of(optimizer).hooks[0].bytes_per_step(10)["payload"]
        sent = history[f"{key}_optimizer/comm_payload_bytes"]
        assert sent[1] == compressed + verdict  # every step of epoch 1 compressed
        assert sent[0] > sent[1]  # epoch 0 began uncompressed: the configuration says not
        assert history[f"{key}_optimizer/compression_ratio"][1] == pytest.approx(
            4 * sum(int(np.prod(v.shape)) for v in optimizer._trainable_variables) / sent[1])
    assert history["comm_payload_bytes"] == [
        d + g for d, g in zip(history["d_optimizer/comm_payload_bytes"],
                              history["g_optimizer/comm_payload_bytes"])]
    assert np.isfinite(history["d_loss"]).all() and np.isfinite(history["g_loss"]).all()


def test_tfdist_function_takes_several_optimizers_and_names_what_to_wrap(strategies):
    """A step applying two tfdist optimizers: given as a list, each is driven; a plain
    Keras optimizer is refused in one line saying what to wrap; one the driver was not
    given is refused by name when the step is traced, not left in its first phase."""
    strategy = strategies("mirrored")
    with strategy.scope():
        model = model_for()
        first, second = model.layers[0].trainable_variables, model.layers[1].trainable_variables
        a = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.01), "topk", ratio=0.5,
                                              error_feedback=True, min_size=0, start_step=1)
        b = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.01), "fp16", min_size=0)
        a.build(first)
        b.build(second)

    def replica_step(x, y):
        with tf.GradientTape(persistent=True) as tape:
            per_example = keras.losses.mean_squared_error(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
        a.apply(tape.gradient(loss, first), first)
        b.apply(tape.gradient(loss, second), second)

    (x, y), = [batches(bad_steps=())[0]]
    data = next(iter(strategy.experimental_distribute_dataset(dataset([(x, y)]))))
    with pytest.raises(ValueError, match="wrap it with tfdist.keras.DistributedOptimizer"):
        tfdist.function(lambda: None, model=model, optimizer=keras.optimizers.SGD())
    only_a = tfdist.function(lambda x, y: strategy.run(replica_step, args=(x, y)),
                             model=model, optimizer=a)
    with pytest.raises(Exception, match=r"applies the tfdist optimizer 'sgd_\d+'.*"  # traced
                                        r"did not find"):
        only_a(*data)
    step = tfdist.function(lambda x, y: strategy.run(replica_step, args=(x, y)),
                           model=model, optimizer=[a, b])
    for _ in range(3):
        step(*data)
    assert step.driver.optimizers == [a, b]
    assert int(a.iterations.numpy()) == int(b.iterations.numpy()) == 3
    assert tfdist.core.pipeline_of(a).hooks[0].compressing  # its phase switched at step 1
    assert len(step.driver._functions) == 2  # traced for steps 0 and 1+


def test_float16_layers_without_loss_scaling_are_refused_before_training(strategies):
    """The policy set after the model's own (its layers compute in float16, the model was
    compiled as float32, so no loss scale): gradients would underflow silently."""
    strategy = strategies("mirrored")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            hidden = keras.layers.Dense(8, activation="relu")  # made under mixed_float16
            keras.mixed_precision.set_global_policy("float32")
            model = keras.Sequential([keras.Input((4,)), hidden, keras.layers.Dense(1)])
            model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(), "fp16"),
                          "mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    x, y = batches(bad_steps=())[0]
    with pytest.raises(tfdist.TfdistError, match=r"layer 'dense_\d+' computes in float16 but "
                                                 r"the optimizer 'optimizer' scales no loss"):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[tfdist.callbacks.TrainingHooks()])


def test_a_non_finite_gradient_in_float16_without_dynamic_scaling_names_the_fix(
        strategies, mixed_float16):
    """A fixed loss scale (Keras' loss_scale_factor) is no dynamic scaling: an overflow is
    still an error, after the collectives, saying what would have skipped it."""
    strategy = strategies("mirrored")
    with strategy.scope():
        model = model_for()
        optimizer = tfdist.keras.DistributedOptimizer(
            keras.optimizers.SGD(0.01, loss_scale_factor=2.0 ** 15), "topk", ratio=0.5,
            min_size=0)
        model.compile(optimizer, "mse", auto_scale_loss=False)
    x, y = batches(bad_steps=(0,))[0]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="NaN or Inf gradient.*without dynamic loss scaling: wrap the "
                             "optimizer in keras.optimizers.LossScaleOptimizer"):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[tfdist.callbacks.TrainingHooks()])


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "bfloat16"])
@pytest.mark.parametrize("name", ["topk+EF", "powersgd+EF", "local SGD 2", "DiLoCo 2"])
def test_bfloat16_trains_with_every_kind_of_exchange(strategies, policy, name):
    """No loss scale under bfloat16 (its range is float32's); weights in bfloat16 under the
    "bfloat16" policy. The exchange's state — residuals, PowerSGD's Q, local SGD's anchors,
    DiLoCo's outer momentum — is float32 (a bfloat16 residual would lose the small values
    error feedback exists to keep); the loss falls and both replicas end identical."""
    strategy = strategies("mirrored")
    keras.mixed_precision.set_global_policy(policy)
    try:
        with strategy.scope():
            model = model_for()
            model.compile(optimizer_for(name, strategy), "mse")
        assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        data = batches(bad_steps=()) * 4
        x, y = (np.concatenate(part) for part in zip(*data))
        history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False,
                            callbacks=[tfdist.callbacks.TrainingHooks()]).history
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert history["loss"][-1] < 0.7 * history["loss"][0]
    replicas = weights(strategy, model)
    for a, b in zip(*replicas):
        np.testing.assert_array_equal(a, b)
    assert model.layers[0].kernel.dtype == ("bfloat16" if policy == "bfloat16" else "float32")
    hook = tfdist.core.pipeline_of(model.optimizer).hooks[0]
    state = list(getattr(hook, "state", {}).values()) + list(
        getattr(hook, "anchor_variables", None) or [])
    if getattr(hook, "outer_optimizer", None) is not None:
        state += [v for v in hook.outer_optimizer.variables if tf.as_dtype(v.dtype).is_floating]
    assert (len(state) > 0) == (name != "local SGD 2")  # plain averaging keeps no state
    assert all(v.dtype == "float32" for v in state)


def test_compression_auto_probes_and_decides_through_skipped_steps(strategies, mixed_float16):
    """auto's probe counts committed steps: a skipped one during the probe only delays its
    decision by a step; every replica then trains through the choice alike."""
    strategy = strategies("mirrored")
    auto = tfdist.compression.AutoCompression(probe_steps=6, probe_seconds=0)
    with strategy.scope():
        model = model_for()
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.01), auto,
                                                        strategy=strategy), "mse")
    data = batches(bad_steps=(2,)) + batches(bad_steps=())[:4]
    x, y = (np.concatenate(part) for part in zip(*data))
    trajectory = Trajectory(strategy)
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False,
              callbacks=[tfdist.callbacks.TrainingHooks(), trajectory])
    decision, = auto.decisions
    assert decision["step"] == 6 and trajectory.steps[-1] == len(data) - 1
    assert [s[0] for s in trajectory.scales][1:3] == [2.0 ** 15, 2.0 ** 14]
    for kernels in trajectory.kernels:
        np.testing.assert_array_equal(kernels[0], kernels[1])
        assert np.isfinite(kernels[0]).all()


def test_checkpoints_hold_every_optimizer_a_model_owns(strategies, tmp_path):
    """BackupAndRestore and ModelCheckpoint (through Keras' save_weights) keep the state
    of each tfdist optimizer: both of a GAN's (attributes of the model), and the loss scale
    with the optimizer inside it (mixed_float16); a fresh model loads them all back."""
    strategy = strategies("mirrored")

    def gan_and_optimizers():
        keras.utils.set_random_seed(0)
        with strategy.scope():
            gan = GAN()
            gan.compile(*[tfdist.keras.DistributedOptimizer(
                keras.optimizers.Adam(3e-4), "topk", ratio=0.25, error_feedback=True,
                min_size=0, strategy=strategy) for _ in range(2)],
                keras.losses.BinaryCrossentropy(from_logits=True))
        return gan

    real = np.random.default_rng(0).normal(2.0, 1.0, size=(4 * 16, 8)).astype("float32")
    gan = gan_and_optimizers()
    gan.fit(real, batch_size=16, epochs=1, verbose=0,
            callbacks=[tfdist.callbacks.TrainingHooks(),
                       tfdist.callbacks.BackupAndRestore(str(tmp_path / "backup"),
                                                         delete_checkpoint=False)])
    restored = gan_and_optimizers()
    newest = tfdist.checkpoint.CheckpointStore(tmp_path / "backup").candidates()[0]
    restored.load_weights(f"{newest}/backup.weights.h5")
    for key in ("d_optimizer", "g_optimizer"):
        mine, theirs = getattr(gan, key), getattr(restored, key)
        assert int(theirs.iterations.numpy()) == 4
        for a, b in zip(mine.variables, theirs.variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, _ = fit(strategy, "DiLoCo 2", batches())
        path = str(tmp_path / "mixed.weights.h5")
        model.save_weights(path)
        with strategy.scope():
            fresh = model_for(seed=1)
            fresh.compile(optimizer_for("DiLoCo 2", strategy), "mse")
        fresh.optimizer.build(fresh.trainable_variables)
        fresh.load_weights(path)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert float(fresh.optimizer.dynamic_scale.numpy()) == float(
        model.optimizer.dynamic_scale.numpy()) == expected_scales()[-1]
    assert int(fresh.optimizer.iterations.numpy()) == STEPS - len(BAD_STEPS)
    outer = tfdist.core.pipeline_of(fresh.optimizer).hooks[0].outer_optimizer
    assert int(outer.iterations.numpy()) > 0  # DiLoCo's outer step, saved with it
