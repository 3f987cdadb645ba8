"""The upstream seams tfdist relies on, checked by their behaviour. If Keras or TensorFlow
moves one, a test here fails with a message naming the tfdist module to revisit — a Keras
upgrade cannot break tfdist silently. Run this file on every Keras version tfdist claims
(`tfdist.seam.optimizer.KERAS_CHECKED`).

The multi-worker seams (MultiWorkerMirroredStrategy's `reduce` calls from Keras' trainer,
ParameterServerStrategy's dataset distribution) are also checked with real processes in
`test_multiworker_training.py`.
"""

import inspect
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_tf_trainer

import tfdist
from tfdist.seam.optimizer import SAVED_KEY, SAVED_NAME
from tfdist.seam.optimizer import CALLED, KERAS_CHECKED, OVERRIDDEN
from tfdist.strategies import CentralStorageStrategy, MirroredStrategy
from tfdist.strategies.keras_build_batch import called_from_keras_trainer
from tfdist.training import GradientPipeline

pytestmark = [pytest.mark.matrix, pytest.mark.usefixtures("two_cpus", "jobs_path")]

OPTIMIZER = "tfdist/seam/optimizer.py"
MWMS = "tfdist/strategies/multi_worker_mirrored.py"
PS = "tfdist/strategies/parameter_server.py"
BUILD_BATCH = "tfdist/strategies/keras_build_batch.py"
KERAS = f"Keras {keras.__version__}"


def test_keras_version_is_one_tfdist_checked():
    """tfdist/seam/optimizer.py lists the Keras versions whose seams this file checked."""
    assert keras.__version__ in KERAS_CHECKED, (
        f"{OPTIMIZER}: {KERAS} is not in KERAS_CHECKED {KERAS_CHECKED}. Run "
        "tests/unit/seam/test_keras_seams.py on it; when every test passes, add it to the table.")


def test_optimizer_seams_are_where_fit_applies_and_exchanges_gradients(strategies):
    """tfdist/seam/optimizer.py overrides Keras' `apply`, `_backend_apply_gradients` and
    `_backend_update_step`, and calls the methods in CALLED; fit goes through them."""
    from counting import CountExchanges
    from models import conv_model, dataset, loss

    for name in OVERRIDDEN + CALLED:
        assert hasattr(keras.optimizers.Adam, name), f"{OPTIMIZER}: {KERAS} optimizers lost {name}"
    strategy = strategies("mirrored")
    hook = CountExchanges()
    pipeline = GradientPipeline([hook])
    with strategy.scope():
        model = conv_model(batchnorm=False, dropout=0)
        optimizer = tfdist.keras.with_gradient_pipeline(keras.optimizers.SGD(0.1), pipeline)
        pipeline.build(strategy, model.trainable_variables)
        model.compile(optimizer, loss())
    model.fit(dataset(64, 32), epochs=1, verbose=0)
    # One exchange per step and replica: Keras still routes fit's update through the seam.
    assert int(hook.count.numpy()) == 2, f"{OPTIMIZER}: {KERAS}'s fit no longer exchanges " \
                                         "gradients through the routed optimizer"
    assert int(optimizer.iterations.numpy()) == 2
    assert type(optimizer).__name__ == "SGD" and isinstance(optimizer, keras.optimizers.SGD)


def _recording(base, names, log):
    """A subclass of the Keras optimizer class `base` whose methods `names` append
    (name, iterations) to `log` when called and ("/" + name, iterations) when they return."""
    def recorded(name):
        def method(self, *args, **kwargs):
            log.append((name, int(self._iterations.numpy())))
            result = getattr(base, name)(self, *args, **kwargs)
            log.append(("/" + name, int(self._iterations.numpy())))
            return result
        return method

    return type(base.__name__, (base,), {name: recorded(name) for name in names})


def test_keras_apply_still_counts_the_step_after_applying_the_gradients():
    """tfdist/seam/optimizer.py's routed `_backend_apply_gradients` replays Keras' own
    (clip, weight decay, update, EMA, EMA overwrite, in this order, before the step is
    counted), and its transactional `apply` takes back the one `_iterations.assign_add(1)`
    Keras' `apply` makes after `_backend_apply_gradients` returned, if a step is refused
    (and `_count_atomically` replaces that counter's `assign_add` on the instance)."""
    seams = ("_backend_apply_gradients", "_clip_gradients", "_apply_weight_decay",
             "_use_weight_decay", "_backend_update_step", "update_step",
             "_update_model_variables_moving_average",
             "_overwrite_model_variables_with_average_value")
    log = []
    optimizer = _recording(keras.optimizers.SGD, seams, log)(
        learning_rate=0.1, weight_decay=0.5, use_ema=True, ema_overwrite_frequency=1)
    variable = keras.Variable([1.0, 2.0])
    optimizer.build([variable])
    counter = optimizer._iterations
    keras_add = counter.assign_add

    def assign_add(delta, *args, **kwargs):
        log.append((f"_iterations.assign_add({int(delta)})", int(counter.numpy())))
        return keras_add(delta, *args, **kwargs)

    counter.assign_add = assign_add  # this instance only, as tfdist's _count_atomically
    optimizer.apply([tf.constant([1.0, 1.0])], [variable])

    calls = [name for name, _ in log if not name.startswith("/")]
    expected = ["_backend_apply_gradients", "_clip_gradients", "_apply_weight_decay",
                "_use_weight_decay", "_backend_update_step", "update_step",
                "_update_model_variables_moving_average",
                "_overwrite_model_variables_with_average_value", "_iterations.assign_add(1)"]
    assert calls == expected, (
        f"{OPTIMIZER}: {KERAS}'s optimizer `apply` made the calls {calls}; tfdist's routed "
        f"`_backend_apply_gradients` replays {expected[:-1]} and its `apply` takes back the "
        "step count at the end. Compare Keras' apply with tfdist's and update the seam.")
    counted = [i for i, (name, _) in enumerate(log) if name.startswith("_iterations")]
    returned = max(i for i, (name, _) in enumerate(log) if name == "/_backend_apply_gradients")
    assert counted == [len(log) - 1] and counted[0] > returned, (
        f"{OPTIMIZER}: {KERAS}'s `apply` no longer counts the step once, after "
        f"_backend_apply_gradients returned: {log}")
    assert all(count == 0 for _, count in log), (
        f"{OPTIMIZER}: {KERAS} counted the step before the update, EMA or overwrite "
        f"read it (tfdist's step reads `iterations` as the step's number): {log}")
    assert int(optimizer.iterations.numpy()) == 1, (
        f"{OPTIMIZER}: {KERAS}'s `apply` no longer adds exactly 1 to `iterations`")

    # tfdist applies weight decay itself, with each update: v -= v * wd * lr, then update.
    plain = keras.optimizers.SGD(learning_rate=0.1, weight_decay=0.5)
    variable = keras.Variable([1.0, 2.0])
    plain.apply([tf.constant([1.0, 1.0])], [variable])
    decayed = np.float32([1.0, 2.0]) * (1 - 0.5 * 0.1) - 0.1
    np.testing.assert_allclose(variable.numpy(), decayed, rtol=1e-6, err_msg=(
        f"{OPTIMIZER}: {KERAS}'s weight decay is no longer `v -= v * weight_decay * lr` "
        "before update_step, which tfdist's `_update_variables` replays"))


def test_keras_losses_scale_by_the_number_of_replicas(strategies):
    """tfdist/training/trainer.py relies on Keras 3 losses returning each replica's share
    (1/N) in replica context, and the full loss outside it."""
    y, p = np.float32([[1.0], [3.0]]), np.float32([[0.0], [0.0]])
    plain = float(keras.losses.MeanSquaredError()(y, p))
    assert plain == pytest.approx(5.0)
    strategy = strategies("mirrored")
    share = strategy.run(lambda: keras.losses.MeanSquaredError()(y, p))
    values = [float(v) for v in strategy.experimental_local_results(share)]
    assert len(values) == strategy.num_replicas_in_sync == 2
    assert values == pytest.approx([plain / 2] * 2), (
        f"tfdist/training/trainer.py: {KERAS}'s losses no longer return 1/N of the loss on "
        f"each of N replicas (got {values} for a loss of {plain})")


class _RecordingMirroredStrategy(MirroredStrategy):
    """tfdist's MirroredStrategy (fresh collective keys; otherwise TF's) that records the
    calls tfdist's strategy subclasses take over, and forwards them."""

    def __init__(self):
        super().__init__()
        self.phase = None
        self.reduces, self.from_keras_trainer = [], []

    def reduce(self, reduce_op, value, axis):
        op = getattr(reduce_op, "value", reduce_op)  # "MEAN" or ReduceOp.MEAN
        self.reduces.append((self.phase, op, tf.nest.is_nested(value), axis))
        return super().reduce(reduce_op, value, axis)

    def experimental_distribute_dataset(self, dataset, options=None):
        # As tfdist.strategies.ParameterServerStrategy asks it (same frame depth).
        self.from_keras_trainer.append((self.phase, called_from_keras_trainer()))
        return super().experimental_distribute_dataset(dataset, options)


@pytest.fixture(scope="module")
def recorded_fit(two_cpus):
    """One fit and evaluate under `_RecordingMirroredStrategy`; Keras' `reduce_per_replica`
    is recorded too: (phase, reduction, ranks of its per-replica leaves)."""
    strategy = _RecordingMirroredStrategy()
    per_replica = []

    def reduce_per_replica(values, strategy_, reduction):
        leaves = [v for v in tf.nest.flatten(values)
                  if isinstance(v, tf.distribute.DistributedValues)]
        ranks = [strategy_.experimental_local_results(v)[0].shape.rank for v in leaves]
        per_replica.append((strategy.phase, reduction, ranks))
        return keras_reduce(values, strategy_, reduction)

    keras_reduce = keras_tf_trainer.reduce_per_replica
    x, y = np.ones((16, 2), np.float32), np.ones((16, 1), np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keras_tf_trainer, "reduce_per_replica", reduce_per_replica)
        with strategy.scope():
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        strategy.phase = "fit"
        model.fit(data, epochs=1, verbose=0)
        strategy.phase = "evaluate"
        model.evaluate(data, verbose=0)
    strategy.phase = None
    return strategy, per_replica


class _StandInMultiWorker(tf.distribute.MultiWorkerMirroredStrategy):
    """An uninitialised MultiWorkerMirroredStrategy (no cluster) whose `extended` says
    whether it is in multi-worker mode; records `reduce` and returns the first replica's
    value."""

    def __init__(self, multi_worker):
        self._extended = type("Extended", (), {
            "_in_multi_worker_mode": lambda _: multi_worker,
            "_local_results": lambda _, value: value.values})()
        self.reduces = []

    def reduce(self, reduce_op, value, axis=None):
        component = value.values[0] if isinstance(value, tf.distribute.DistributedValues) else value
        self.reduces.append((reduce_op, component.shape.rank, axis))
        return component


def test_keras_trainer_still_reduces_nested_batches_and_scalars_with_axis_0(recorded_fit):
    """tfdist/strategies/multi_worker_mirrored.py's `reduce` accepts two calls Keras' trainer
    makes (keras #20585): fit and evaluate reduce their first (nested) batch with
    ``axis=None`` under any strategy, here a MirroredStrategy; and `reduce_per_replica`,
    through which each step's logs pass, reduces scalars with ``axis=0``, which Keras does
    only for a MultiWorkerMirroredStrategy in multi-worker mode: that condition is checked
    with a stand-in strategy (a real one needs several workers:
    test_multiworker_training.py)."""
    strategy, per_replica = recorded_fit
    for phase in ("fit", "evaluate"):
        assert (phase, "MEAN", True, None) in strategy.reduces, (
            f"{MWMS}: {KERAS}'s {phase} no longer reduces a nested batch with axis=None "
            "(reduce calls as (phase, op, nested, axis): "
            f"{sorted(set(strategy.reduces), key=str)}); tfdist's MultiWorkerMirroredStrategy "
            "maps such calls leaf by leaf and may no longer need to.")
    batch_reduces = sum(1 for r in strategy.reduces if r[1:] == ("MEAN", True, None))
    assert strategy.keras_fixes["local_build_batch"] == batch_reduces, (
        f"{BUILD_BATCH}: of {KERAS}'s {batch_reduces} reductions of a first batch, "
        f"{strategy.keras_fixes['local_build_batch']} were answered locally: "
        "called_from_keras_trainer() no longer recognises the caller (module, name or frame "
        "depth moved), and a batch the replicas split unevenly fails again.")
    fit_logs = [(reduction, ranks) for phase, reduction, ranks in per_replica if phase == "fit"]
    assert ("auto", [0]) in fit_logs, (
        f"{MWMS}: {KERAS}'s train step no longer passes its per-replica scalar logs through "
        f"reduce_per_replica(..., 'auto'); recorded {per_replica}")

    loss = strategy.experimental_distribute_values_from_function(lambda _: tf.constant(2.0))
    for multi_worker, calls in ((True, [("MEAN", 0, 0)]), (False, [])):
        stand_in = _StandInMultiWorker(multi_worker)
        keras_tf_trainer.reduce_per_replica({"loss": loss}, stand_in, "auto")
        assert stand_in.reduces == calls, (
            f"{MWMS}: {KERAS}'s reduce_per_replica made the calls {stand_in.reduces} on a "
            f"MultiWorkerMirroredStrategy with multi-worker mode {multi_worker}, expected "
            f"{calls} (strategy.reduce('MEAN', scalar, axis=0), which tfdist's reduce "
            "treats as axis=None).")


def test_keras_trainer_distributes_its_dataset_from_the_module_tfdist_watches(recorded_fit):
    """tfdist/strategies/parameter_server.py refuses Keras' fit when its
    `experimental_distribute_dataset` is called from Keras' trainer module
    (`called_from_keras_trainer`, a frame check): True in fit and evaluate, False here."""
    strategy, _ = recorded_fit
    for phase in ("fit", "evaluate"):
        seen = [called for p, called in strategy.from_keras_trainer if p == phase]
        assert seen and all(seen), (
            f"{PS}: {KERAS}'s {phase} distributed its dataset {len(seen)} time(s), "
            f"called_from_keras_trainer() said {seen}: the trainer moved module or "
            "frame depth, and ParameterServerStrategy no longer explains that Keras "
            "cannot train with it.")
    start = len(strategy.from_keras_trainer)
    strategy.experimental_distribute_dataset(tf.data.Dataset.range(4).batch(2))
    assert strategy.from_keras_trainer[start:] == [(None, False)], (
        f"{PS}: called_from_keras_trainer() is True outside Keras' trainer")


def test_keras_state_is_still_created_without_aggregation(strategies):
    """tfdist/strategies/central_storage.py's fix exists because of this; if Keras starts
    choosing an aggregation itself, the fix becomes a no-op and can go."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization(),
                              keras.layers.Dropout(0.5)])
    assert model.layers[0].moving_mean.aggregation == "none"
    assert keras.metrics.Mean().variables[0].aggregation == "sum"
    strategy = strategies("central_storage")
    before = sum(strategy.keras_fixes.values())
    with strategy.scope():
        keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization()])
        keras.metrics.Mean()
    fixes = sum(strategy.keras_fixes.values()) - before
    assert fixes == 4  # moving mean and variance, metric total and count


def test_upstream_central_storage_still_fails_with_batchnorm():
    """Canary: plain TF CentralStorageStrategy + Keras 3 BatchNormalization. If this starts
    passing, upstream fixed it and tfdist's CentralStorageStrategy can be retired."""
    devices = ["/cpu:0", "/cpu:1"]
    strategy = tf.distribute.experimental.CentralStorageStrategy(compute_devices=devices)
    assert not isinstance(strategy, CentralStorageStrategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization()])
        model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="aggregation"):
        model.fit(np.ones((4, 2)), np.ones((4, 2)), batch_size=4, verbose=0)


def test_upstream_mirrored_still_fails_on_a_batch_the_replicas_split_unevenly(
        tensorflows_mirrored):
    """Canary: plain TF MirroredStrategy + Keras 3 fit on global batches of 7 rows on 2
    replicas. If this starts passing, Keras stopped reducing the first batch and
    tfdist/strategies/keras_build_batch.py can go."""
    strategy = tensorflows_mirrored()
    assert not isinstance(strategy, MirroredStrategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    with pytest.raises(tf.errors.InvalidArgumentError, match="same size and shape"):
        model.fit(np.ones((14, 2)), np.ones((14, 1)), batch_size=7, verbose=0)


def _recording_saves(base, path_of):
    """A subclass of Keras checkpoint callback `base` whose `_save_model` appends
    (args, kwargs, file there before, file there after) to the instance's `saves`."""
    def _save_model(self, *args, **kwargs):
        before = os.path.exists(path_of(self))
        base._save_model(self, *args, **kwargs)
        self.__dict__.setdefault("saves", []).append(
            (args, kwargs, before, os.path.exists(path_of(self))))

    return type(base.__name__, (base,), {"_save_model": _save_model})


class _SwapTrainFunction(keras.callbacks.Callback):
    """Sets `model.train_function` to a new wrapper before every step, as
    tfdist.callbacks.TrainingHooks does; `ran` lists the step each wrapper was made for,
    once per call."""

    def on_train_begin(self, logs=None):
        self.keras_function, self.ran, self.step = self.model.train_function, [], 0

    def on_train_batch_begin(self, batch, logs=None):
        def wrapper(iterator, step=self.step):
            self.ran.append(step)
            return self.keras_function(iterator)

        self.model.train_function = wrapper
        self.step += 1


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # Keras' h5
def test_seams_of_local_sgd_and_phases_are_still_there(tmp_path):
    """Three seams of the step core and its callbacks:
    - tfdist/keras/callbacks/model_checkpoint.py and backup_and_restore.py average local-SGD
      replicas in `_save_model` before Keras writes: Keras' callbacks must save in it;
    - tfdist/keras/callbacks/training_hooks.py sets `model.train_function` in
      `on_train_batch_begin` (a step traced per phase): fit must call it in that step;
    - tfdist/seam/optimizer.py accumulates gradients in Keras' accumulators."""
    from tfdist.keras.callbacks import BackupAndRestore, ModelCheckpoint

    checkpoint = _recording_saves(keras.callbacks.ModelCheckpoint, lambda c: c.filepath)
    backup = _recording_saves(keras.callbacks.BackupAndRestore, lambda c: c._weights_path)
    savers = {  # callback, tfdist's override, saves expected in 2 epochs of 2 steps
        "ModelCheckpoint": (checkpoint(str(tmp_path / "epoch.weights.h5"),
                                       save_weights_only=True), ModelCheckpoint, 2),
        "ModelCheckpoint(save_freq=1)": (checkpoint(str(tmp_path / "batch.weights.h5"),
                                                    save_weights_only=True, save_freq=1),
                                         ModelCheckpoint, 4),
        "BackupAndRestore": (backup(str(tmp_path / "epoch"), delete_checkpoint=False),
                             BackupAndRestore, 2),
        "BackupAndRestore(save_freq=1)": (backup(str(tmp_path / "batch"), save_freq=1,
                                                 delete_checkpoint=False), BackupAndRestore, 4)}
    swap = _SwapTrainFunction()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=4, epochs=2, verbose=0,
              callbacks=[callback for callback, _, _ in savers.values()] + [swap])

    for name, (callback, ours, count) in savers.items():
        module = f"tfdist/keras/callbacks/{ours.__module__.rsplit('.', 1)[1]}.py"
        saves = getattr(callback, "saves", [])
        assert len(saves) == count and saves[0][2:] == (False, True), (
            f"{module}: {KERAS}'s {name} no longer writes its file inside `_save_model` "
            f"({count} times expected, (args, kwargs, before, after): {saves}); tfdist "
            "averages local-SGD replicas there before each save.")
        for args, kwargs, _, _ in saves:
            try:
                inspect.signature(ours._save_model).bind(callback, *args, **kwargs)
            except TypeError as error:
                pytest.fail(f"{module}: {KERAS}'s {name} calls _save_model(*{args}, "
                            f"**{kwargs}), which tfdist's override does not take: {error}")
    assert swap.ran == [0, 1, 2, 3], (
        f"tfdist/keras/callbacks/training_hooks.py: {KERAS}'s fit no longer calls the "
        "`model.train_function` set in on_train_batch_begin in that step (steps run by the "
        f"wrappers: {swap.ran} of 4)")

    optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
    a, b = keras.Variable(np.zeros((2, 3), np.float32)), keras.Variable(np.zeros(3, np.float32))
    optimizer.build([a, b])
    accumulators = [optimizer._accumulated_gradients[optimizer._get_variable_index(v)]
                    for v in (b, a)]
    assert len(optimizer._accumulated_gradients) == 2 and \
        [tuple(x.shape) for x in accumulators] == [(3,), (2, 3)], (
            f"{OPTIMIZER}: {KERAS} no longer keeps one accumulator per variable at "
            "_accumulated_gradients[_get_variable_index(variable)]")
    grads = [tf.ones(3), tf.fill((2, 3), 2.0)]
    for _ in range(2):
        optimizer._backend_increment_gradient_accumulators(grads, accumulators)
    for accumulator, grad in zip(accumulators, grads):
        np.testing.assert_allclose(accumulator.numpy(), 2 * grad.numpy(), err_msg=(
            f"{OPTIMIZER}: {KERAS}'s _backend_increment_gradient_accumulators(grads, "
            "accumulators) no longer adds the gradients into the accumulators"))


def test_keras_loads_a_registered_name_first_else_the_keras_class_which_ignores_decay():
    """tfdist/keras/saving.py saves a routed optimizer as its Keras class (`module`,
    `class_name`) under the registered name "tfdist>DistributedOptimizer", with tfdist's
    settings in the config key `decay`. Keras must look the registered name up first (where
    tfdist is imported it finds tfdist's loader), else import the Keras `module` (a
    process without tfdist), whose optimizer accepts `decay` and ignores it with a warning.
    """
    from tfdist.keras import saving

    optimizer = tfdist.keras.with_gradient_pipeline(keras.optimizers.SGD(0.5), GradientPipeline())
    config = keras.saving.serialize_keras_object(optimizer)
    assert (config["module"], config["class_name"]) == ("keras.src.optimizers.sgd", "SGD")
    assert config["registered_name"] == SAVED_NAME and SAVED_KEY in config["config"]["decay"]
    assert keras.saving.get_registered_object(SAVED_NAME) is saving.Loader
    routed = keras.saving.deserialize_keras_object(config)
    assert tfdist.core.pipeline_of(routed) is not None
    registry = keras.saving.get_custom_objects()
    registry.pop(SAVED_NAME)
    try:  # as in a process that never imported tfdist
        with pytest.warns(UserWarning, match="Argument `decay` is no longer supported and will "
                                             "be ignored"):
            plain = keras.saving.deserialize_keras_object(config)
    finally:
        registry[SAVED_NAME] = saving.Loader
    assert type(plain) is keras.optimizers.SGD and plain.learning_rate == 0.5


def test_a_background_dispatch_returns_at_once_runs_in_order_and_reports_failures():
    """tfdist/step/overlap.py: TensorFlow's asynchronous eager executor, scoped to a block."""
    from tfdist.step.overlap import Background

    background, counter = Background(), tf.Variable(0)
    waited = tf.function(lambda: [counter.assign_add(1), tf.timestamp()][1])
    with background.dispatch():
        for _ in range(5):
            waited()
    background.wait()
    assert int(counter.numpy()) == 5, "tfdist/step/overlap.py: dispatched work was lost"
    failing = tf.function(lambda x: tf.debugging.check_numerics(x, "in the background"))
    with background.dispatch():
        failing(tf.constant(np.nan))  # fails when it runs, not when it is called
    with pytest.raises(tf.errors.InvalidArgumentError):
        background.wait()
    with background.dispatch():
        counter.assign_add(1)
    background.wait()  # usable again after a failure
    assert int(counter.numpy()) == 6


def test_diloco_outer_optimizers_take_the_options_tfdist_offers():
    """tfdist/config/hyperparameters.py OUTER_OPTIMIZERS against Keras' signatures, and
    the update rule (`update_step`) tfdist/local_sgd/averager.py calls."""
    from tfdist.config.hyperparameters import OUTER_OPTIMIZERS

    for name, options in OUTER_OPTIMIZERS.items():
        cls = type(keras.optimizers.get("sgd" if name == "nesterov" else name))
        accepted = inspect.signature(cls.__init__).parameters
        missing = [o for o in options if o not in accepted]
        assert not missing, f"{KERAS}: {cls.__name__} no longer takes {missing}"
        assert list(inspect.signature(cls.update_step).parameters) == [
            "self", "gradient", "variable", "learning_rate"], cls


def test_keras_loss_scale_optimizer_is_what_compile_wraps_and_it_is_taken_over():
    """tfdist/seam/loss_scale.py takes over a Keras LossScaleOptimizer built around a
    tfdist optimizer, in place, when its __init__ sets the inner optimizer's
    `loss_scale_factor` to None; model.compile under mixed_float16 wraps with that class;
    the step reads its `dynamic_scale`, `step_counter`, `dynamic_growth_steps` and
    `_overwrite_variable_with_gradient`, and the inner optimizer's `scale_loss` seam."""
    from keras.src.trainers import trainer as keras_trainer

    from tfdist.seam import loss_scale

    assert keras_trainer.LossScaleOptimizer is keras.optimizers.LossScaleOptimizer, (
        f"{KERAS}: model.compile no longer wraps with keras.optimizers.LossScaleOptimizer")
    routed = tfdist.keras.with_gradient_pipeline(keras.optimizers.SGD(0.1), GradientPipeline())
    wrapped = keras.optimizers.LossScaleOptimizer(routed, dynamic_growth_steps=7)
    assert isinstance(wrapped, loss_scale.LossScaleOptimizer), (
        f"tfdist/seam/loss_scale.py: {KERAS}'s LossScaleOptimizer.__init__ no longer sets "
        "inner_optimizer.loss_scale_factor = None, where tfdist takes it over")
    variable = keras.Variable([1.0, 2.0])
    wrapped.build([variable])
    assert float(wrapped.dynamic_scale.numpy()) == 2.0 ** 15
    assert int(wrapped.step_counter.numpy()) == 0 and wrapped.dynamic_growth_steps == 7
    assert wrapped._overwrite_variable_with_gradient(variable) is False
    assert float(wrapped.scale_loss(tf.constant(2.0))) == 2.0 ** 16
    config = keras.saving.serialize_keras_object(wrapped)
    assert (config["module"], config["class_name"]) == (
        "keras.src.optimizers.loss_scale_optimizer", "LossScaleOptimizer")


def test_keras_fit_still_starts_at_the_epoch_a_restore_left_and_never_resets_it():
    """Keras' BackupAndRestore resumes by setting `model._initial_epoch`, which fit reads
    and never resets: tfdist's BackupAndRestore resets it when training ends, or a second
    fit of the same model (keras-io's fine-tuning) would skip the epochs the first one
    resumed past. A seam moved here means that reset no longer does anything."""
    import inspect

    import keras
    from keras.src.backend.tensorflow import trainer

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    assert model._initial_epoch is None
    assert "initial_epoch = self._initial_epoch or initial_epoch" in inspect.getsource(
        trainer.TensorFlowTrainer.fit)
    model.compile("sgd", "mse")
    model._initial_epoch = 1  # as a restore leaves it
    history = model.fit(np.zeros((4, 1)), np.zeros((4, 1)), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 1  # Keras' own: epoch 0 skipped
    model._initial_epoch = None
    history = model.fit(np.zeros((4, 1)), np.zeros((4, 1)), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


def test_keras_trainer_hands_the_model_train_step_to_strategy_run(strategies):
    """tfdist weighs each replica's gradient by its rows in the step Keras' trainer runs
    (tfdist/strategies/batch_rows.py), which it knows by `model.train_step` being the
    function given to `strategy.run` (Keras 3.10-3.15): inside it, on every replica, the
    weight is known. If Keras wraps it, this fails, and an uneven split is mis-weighted."""
    from tfdist.strategies import batch_rows

    seen = []

    class Seen(keras.Sequential):
        def train_step(self, data):
            seen.append(batch_rows.weight() is not None)
            return super().train_step(data)

    strategy = strategies("mirrored")
    with strategy.scope():
        model = Seen([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    model.fit(np.zeros((6, 2), "float32"), np.zeros((6, 1), "float32"), batch_size=6,
              epochs=1, verbose=0)
    assert seen and all(seen), seen


RAW_ERRORS = "tfdist/strategies/raw_errors.py"


def test_tensorflows_mixed_strategies_error_is_the_one_raw_errors_tells(tensorflows_mirrored):
    """TF's own MirroredStrategy with a Keras optimizer made outside its scope raises the
    RuntimeError `raw_errors.MIXING` matches, from a frame of Keras' optimizer, and
    `mixed_strategies` tells it."""
    from tfdist.strategies import raw_errors

    strategy = tensorflows_mirrored()
    optimizer = keras.optimizers.Adam()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer, "mse")
        with pytest.raises(RuntimeError) as raised:
            optimizer.build(model.trainable_variables)
    found = raw_errors.MIXING.search(str(raised.value))
    assert found and found.group(1) == repr(strategy), (
        f"{RAW_ERRORS}: {KERAS}/TF {tf.__version__} no longer says {raw_errors.MIXING.pattern!r}: "
        f"{raised.value}")
    told = raw_errors.mixed_strategies(raised.value, raised.value.__traceback__, strategy)
    assert told is not None and "Received: optimizer=Adam(" in str(told), (
        f"{RAW_ERRORS}: no frame of {raw_errors.KERAS_OPTIMIZERS} raised it any more")


def test_tensorflows_startup_error_is_the_one_raw_errors_tells():
    """TF's own MultiWorkerMirroredStrategy of 2 workers made after a dataset raises the
    RuntimeError whose text `raw_errors.STARTUP` is (a fresh process: TF_CONFIG)."""
    import json
    import subprocess
    import sys

    from tfdist.strategies import raw_errors

    tf_config = {"cluster": {"worker": ["localhost:1", "localhost:2"]},
                 "task": {"type": "worker", "index": 0}}
    script = ("import tensorflow as tf\ntf.data.Dataset.range(2)\ntry:\n"
              "    tf.distribute.MultiWorkerMirroredStrategy()\n"
              "except RuntimeError as e:\n    print('raised:', e)\n")
    # 600 s: a bound against a hang, not a timing (in CI's version matrix, at a low
    # priority beside the suite, this TensorFlow import once took over 120 s)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, TF_CONFIG=json.dumps(tf_config)))
    assert f"raised: {raw_errors.STARTUP}" in run.stdout, (
        f"{RAW_ERRORS}: TF {tf.__version__} no longer raises {raw_errors.STARTUP!r} for a "
        f"strategy made after TensorFlow started: {run.stdout[-500:]} {run.stderr[-1500:]}")


def test_keras_entry_points_are_found_from_distribute_dataset():
    """tfdist/strategies/parameter_server.py tells fit, evaluate and predict apart by the
    Keras trainer method among `experimental_distribute_dataset`'s callers."""
    from tfdist.strategies.keras_build_batch import keras_entry_point

    seen = []

    class Recording(MirroredStrategy):
        def experimental_distribute_dataset(self, dataset, options=None):
            seen.append(keras_entry_point())
            return super().experimental_distribute_dataset(dataset, options)

    strategy = Recording(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.ones((16, 4), "float32")
    model.fit(x, x[:, 0], batch_size=8, epochs=1, verbose=0)
    model.evaluate(x, x[:, 0], batch_size=8, verbose=0)
    model.predict(x, batch_size=8, verbose=0)
    assert seen == ["fit", "evaluate", "predict"], f"{PS}: {KERAS}'s callers are {seen}"


def test_keras_adapters_tfdist_reorders_are_found_and_read_as_it_reads_them():
    """tfdist/strategies/input_order.py finds fit's data adapter from
    `experimental_distribute_dataset` (the `TFEpochIterator` being built) and
    tfdist/strategies/keras_inputs.py rebuilds NumPy and PyDataset input from the
    adapters' private attributes; the seed and fingerprints use TF's coordination-service
    key-value store and global seed, the worker count `extended._num_workers`."""
    from tensorflow.python.distribute import collective_all_reduce_strategy as collective
    from tensorflow.python.eager import context

    from tfdist.strategies import keras_inputs
    from tfdist.strategies.input_order import keras_data_adapter

    seen = []

    class Recording(MirroredStrategy):
        def experimental_distribute_dataset(self, dataset, options=None):
            seen.append((keras_data_adapter(), dataset))
            return super().experimental_distribute_dataset(dataset, options)

    class Rows(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return np.full((8, 4), index, "float32"), np.zeros((8,), "float32")

    strategy = Recording(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.ones((16, 4), "float32")
    model.fit(x, x[:, 0], batch_size=8, epochs=1, verbose=0, shuffle=True)
    model.fit(Rows(), epochs=1, verbose=0, shuffle=True)
    names = [type(adapter).__name__ for adapter, _ in seen]
    where = "tfdist/strategies/input_order.py, keras_inputs.py"
    assert names == [keras_inputs.ARRAYS, keras_inputs.PY_DATASET], (
        f"{where}: {KERAS}'s fit distributed {names} (adapters found from the caller's "
        "frame): the TFEpochIterator moved, and fit's input is read per worker again")
    (arrays, keras_arrays), (rows, keras_rows) = seen
    assert (arrays._shuffle, arrays._num_samples, arrays._batch_size) == (True, 16, 8)
    assert keras_inputs.arrays_in_order(arrays, 3).element_spec == keras_arrays.element_spec, (
        f"{where}: {KERAS}'s ArrayDataAdapter._inputs no longer rebuild its dataset")
    assert (rows.shuffle, rows.enqueuer) == (True, None)
    assert rows._output_signature == keras_rows.element_spec
    assert len(rows._standardize_batch(rows.py_dataset[0])) == 2
    for name in ("set_config_key_value", "get_config_key_value"):
        assert callable(getattr(context.context(), name, None)), f"{where}: TF has no {name}"
    assert context.global_seed() is None or isinstance(context.global_seed(), int)
    assert "self._num_workers" in inspect.getsource(
        collective.CollectiveAllReduceExtended), f"{where}: TF counts workers elsewhere"


def test_keras_optimizer_made_in_the_scope_keeps_the_strategy_and_variables_it_was_made_with(
        strategies):
    """tfdist.seam.optimizer.with_gradient_pipeline routes the optimizer in place when its
    `_distribution_strategy` (set by Keras' TF optimizer at __init__) is the strategy in
    scope: the object keeps its `_learning_rate` schedule and its variables, whose
    `iterations` Keras made mirrored there."""
    strategy = strategies("mirrored")
    schedule = keras.optimizers.schedules.PolynomialDecay(
        5e-5, decay_steps=tf.constant(6, tf.int64), end_learning_rate=0.0)
    outside = keras.optimizers.Adam(schedule)
    with strategy.scope():
        optimizer = keras.optimizers.Adam(schedule)
        variables = optimizer.variables
        routed = tfdist.keras.DistributedOptimizer(optimizer)
    where = "tfdist/seam/optimizer.py (with_gradient_pipeline)"
    assert outside._distribution_strategy is not strategy, f"{where}: {KERAS} moved it"
    assert routed is optimizer and optimizer._distribution_strategy is strategy, where
    assert optimizer._learning_rate is schedule and routed.variables == variables, where
    assert isinstance(optimizer._iterations.value, tf.distribute.DistributedValues), where


def test_keras_skips_compile_from_config_for_a_model_with_its_own_compile(strategies,
                                                                         tmp_path):
    """tfdist.seam.routed.compile_is_custom is Keras' own test (Trainer.compile overridden)
    and saving_check finds the model in Keras' `get_compile_config` frame; load_model
    drops the Keras warnings it supersedes (tfdist.keras.saving.SUPERSEDED)."""
    import warnings

    from keras.src.trainers.trainer import Trainer

    from tfdist.seam.routed import compile_is_custom
    from tfdist.keras.saving import SUPERSEDED

    class OwnCompile(keras.Model):  # as KerasHub's Task: compiled by its constructor
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.compile()

        def compile(self, optimizer="auto", **kwargs):
            super().compile(optimizer=keras.optimizers.Adam(2e-5) if optimizer == "auto"
                            else optimizer, loss="mse", **kwargs)

    keras.saving.register_keras_serializable("tfdist_seams")(OwnCompile)
    assert compile_is_custom(OwnCompile) and not compile_is_custom(keras.Model)
    assert Trainer.compile_from_config is keras.Model.compile_from_config
    strategy = strategies("mirrored")
    with strategy.scope():
        inputs = keras.Input((2,))
        model = OwnCompile(inputs, keras.layers.Dense(1)(inputs))
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.Adam(0.1)))
        model.optimizer.build(model.trainable_variables)  # slots: more variables than Adam()
    path = str(tmp_path / "own.keras")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save(path)
        with strategy.scope():
            keras.models.load_model(path)
    messages = [str(w.message) for w in caught]
    where = "tfdist/seam/routed.py (saving_check), tfdist/keras/saving.py (SUPERSEDED)"
    assert any(m.startswith("OwnCompile overrides compile()") for m in messages), where
    for prefix in SUPERSEDED:
        assert any(m.startswith(prefix) for m in messages), f"{where}: {KERAS}: {messages}"


def test_keras_random_layers_draw_through_the_generators_per_replica_seeds_finds(strategies):
    """tfdist/keras/replica_seeds.py finds a model's SeedGenerators in the `_seed_generators`
    of `_flatten_layers()`, swaps their class and overrides `next(ordered)`, whose `(2,)`
    int64 seed Keras' random layers draw from; and plain Keras still draws alike on every
    replica (if that last check fails, Keras fixed it: revisit docs/guides/fit.md)."""
    where = "tfdist/keras/replica_seeds.py"
    calls = []

    class Counting(keras.random.SeedGenerator):
        def next(self, ordered=True):
            calls.append(self)
            return super().next(ordered=ordered)

    random_layers = [keras.layers.RandomFlip(seed=1), keras.layers.RandomRotation(0.2, seed=2),
                     keras.layers.GaussianNoise(1.0, seed=3), keras.layers.Dropout(0.5, seed=4)]
    inner = keras.Sequential([keras.Input((8, 8, 1)), *random_layers])
    model = keras.Sequential([keras.Input((8, 8, 1)), inner])
    found = [g for layer in model._flatten_layers(include_self=True, recursive=True)
             for g in layer._seed_generators]
    assert len(found) == 4, f"{where}: {KERAS} keeps random layers' generators elsewhere"
    assert "ordered" in inspect.signature(keras.random.SeedGenerator.next).parameters, where
    seed = found[0].next()
    assert tuple(seed.shape) == (2,) and seed.dtype == tf.int64, f"{where}: {KERAS}: {seed}"
    for generator in found:
        generator.__class__ = Counting
    model(np.ones((2, 8, 8, 1), "float32"), training=True)
    assert {id(g) for g in calls} == {id(g) for g in found}, \
        f"{where}: {KERAS}'s random layers no longer draw through SeedGenerator.next"

    strategy = strategies("mirrored")
    with strategy.scope():
        dropout = keras.layers.Dropout(0.5, seed=7)
    batch = next(iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(tf.ones((8, 16))))))
    out = tf.function(lambda b: strategy.run(lambda x: dropout(x, training=True), (b,)))(batch)
    first, second = (o.numpy() for o in strategy.experimental_local_results(out))
    assert np.array_equal(first, second), f"{KERAS} draws per replica now: {where} and " \
                                          "docs/guides/fit.md describe what it no longer does"


def test_keras_model_checkpoint_still_formats_its_path_in_get_file_path(tmp_path):
    """tfdist's ModelCheckpoint names the file a failed write was for (a full disk) with
    Keras' `_get_file_path(epoch, batch, logs)`, the path `_save_model` writes."""
    callback = keras.callbacks.ModelCheckpoint(str(tmp_path / "m-{epoch:02d}.weights.h5"),
                                               save_weights_only=True)
    assert callback._get_file_path(2, None, {}) == str(tmp_path / "m-03.weights.h5")


SHARDS = "tfdist/step/shards.py"


@pytest.mark.parametrize("make_optimizer", [
    lambda: keras.optimizers.SGD(0.1, momentum=0.9), lambda: keras.optimizers.Adam(1e-2)],
    ids=["sgd-momentum", "adam"])
def test_an_optimizer_on_each_replicas_shard_keeps_its_slots_apart_and_updates_as_whole(
        make_optimizer):
    """Sharded optimizer state (ZeRO) rests on this: Keras' optimizer built on an on-read
    variable of one shard makes slots of the shard's size whose per-replica parts
    `update_step` in replica context keeps apart (each replica's own shard), and the
    updated shards, gathered, are the unsharded update — Keras' arithmetic, 1/N of its
    state on each replica."""
    from tfdist.step import shards as sharding, wire

    strategy = MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 3)).astype("float32")
    with strategy.scope():
        models = []
        for _ in range(2):
            keras.utils.set_random_seed(1)
            models.append(keras.Sequential([keras.Input((4,)), keras.layers.Dense(5),
                                            keras.layers.Dense(3)]))
        whole, sharded = models
        layout = sharding.Layout([v.shape for v in sharded.trainable_variables], 2)
        shard = keras.Variable(tf.zeros([layout.shard]), trainable=False, name="shard",
                               synchronization="on_read", aggregation="only_first_replica")
        optimizers = make_optimizer(), make_optimizer()
        optimizers[0].build(whole.trainable_variables)
        optimizers[1].build([shard])
    shards = sharding.shards_for(strategy)
    batch = next(iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8))))

    def gradients(model, xs, ys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(xs) - ys)) / 8.0
        return tape.gradient(loss, model.trainable_variables)

    def unsharded(xs, ys):
        optimizers[0].apply_gradients(zip(gradients(whole, xs, ys), whole.trainable_variables))

    def on_shards(xs, ys, first):
        context = tf.distribute.get_replica_context()
        grads = gradients(sharded, xs, ys)
        rank = shards.rank(context)
        if first:
            shard.assign(layout.shard_of(layout.flatten(sharded.trainable_variables), rank))
        optimizers[1].update_step(wire.reduce_scatter(context, layout.flatten(grads), shards),
                                  shard, tf.cast(optimizers[1].learning_rate, tf.float32))
        gathered = wire.all_gather_shards(context, shard.value, shards)
        for variable, value in zip(sharded.trainable_variables, layout.unflatten(gathered)):
            variable.assign(value)

    step = tf.function(lambda first: (strategy.run(unsharded, args=batch),
                                      strategy.run(on_shards, args=(*batch, first)),
                                      optimizers[1].iterations.assign_add(1)))
    for i in range(4):
        step(i == 0)
    for a, b in zip(whole.get_weights(), sharded.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7, err_msg=(
            f"{SHARDS}: with {KERAS}, Keras' update of each replica's shard no longer "
            "equals its update of the whole model"))
    slots = [v for v in optimizers[1].variables if v.shape.rank]
    assert slots and all(v.shape == (layout.shard,) for v in slots), (
        f"{SHARDS}: with {KERAS}, the slots of a shard are {[v.shape for v in slots]}")
    for slot in slots:
        parts = [p.numpy() for p in slot.value.values]
        assert len(parts) == 2 and not np.allclose(parts[0], parts[1]), (
            f"{SHARDS}: with {KERAS}, the replicas' parts of the slot {slot.name} are "
            "made alike: a replica no longer keeps the state of its own shard")
