"""The upstream seams tfdist relies on. If Keras or TensorFlow moves one, a test here fails
and names the fix to revisit — a Keras upgrade cannot break tfdist silently.

The multi-worker seams (MultiWorkerMirroredStrategy's `reduce` calls from Keras' trainer,
ParameterServerStrategy's dataset distribution) are also checked with real processes in
`test_multiworker_training.py`.
"""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_tf_trainer

import tfdist
from tfdist.core.optimizer import SAVED_KEY, SAVED_NAME
from tfdist.core.optimizer import CALLED, OVERRIDDEN
from tfdist.strategies import CentralStorageStrategy
from tfdist.strategies.parameter_server import _called_from_keras_trainer
from tfdist.training import GradientPipeline

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")


def test_optimizer_seams_are_where_fit_applies_and_exchanges_gradients(strategies):
    """tfdist/keras/optimizer.py overrides Keras' `apply`, `_backend_apply_gradients` and
    `_backend_update_step`, and calls the methods in CALLED."""
    from counting import CountExchanges
    from models import conv_model, dataset, loss

    for name in OVERRIDDEN + CALLED:
        assert hasattr(keras.optimizers.Adam, name), f"Keras optimizers lost {name}"
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
    assert int(hook.count.numpy()) == 2
    assert int(optimizer.iterations.numpy()) == 2
    assert type(optimizer).__name__ == "SGD" and isinstance(optimizer, keras.optimizers.SGD)


def test_keras_apply_still_counts_the_step_after_applying_the_gradients():
    """The transactional step takes back Keras' `iterations.assign_add(1)` at the end of
    `apply` when a step is refused, and replaces the calls below it."""
    apply = inspect.getsource(keras.optimizers.Optimizer.apply)
    assert apply.rstrip().endswith("self._iterations.assign_add(1)")
    assert "self._backend_apply_gradients(grads, trainable_variables)" in apply
    backend_apply = inspect.getsource(keras.optimizers.Optimizer._backend_apply_gradients)
    for call in ("self._clip_gradients(grads)", "self._apply_weight_decay(trainable_variables)",
                 "self._backend_update_step(", "self._update_model_variables_moving_average("):
        assert call in backend_apply, call


def test_keras_losses_scale_by_the_number_of_replicas(strategies):
    """Trainer relies on Keras 3 losses returning each replica's share (1/N)."""
    y, p = np.float32([[1.0], [3.0]]), np.float32([[0.0], [0.0]])
    plain = float(keras.losses.MeanSquaredError()(y, p))
    strategy = strategies("mirrored")
    share = strategy.run(lambda: keras.losses.MeanSquaredError()(y, p))
    for value in strategy.experimental_local_results(share):
        assert float(value) == pytest.approx(plain / 2)


def test_keras_trainer_still_reduces_nested_batches_and_scalars_with_axis_0():
    """The two calls tfdist's MultiWorkerMirroredStrategy.reduce accepts (keras #20585)."""
    build = inspect.getsource(keras_tf_trainer.TensorFlowTrainer._maybe_symbolic_build)
    assert "distribute_strategy.reduce(" in build and "axis=None" in build
    per_replica = inspect.getsource(keras_tf_trainer.reduce_per_replica)
    assert 'strategy.reduce("MEAN", v, axis=0)' in per_replica


def test_keras_trainer_distributes_its_dataset_from_the_module_tfdist_watches():
    """ParameterServerStrategy recognises Keras' trainer by this module name."""
    assert keras_tf_trainer.__name__ == "keras.src.backend.tensorflow.trainer"
    source = inspect.getsource(keras_tf_trainer.TFEpochIterator.__init__)
    assert "experimental_distribute_dataset" in source
    assert not _called_from_keras_trainer()


def test_keras_state_is_still_created_without_aggregation(strategies):
    """CentralStorageStrategy's fix exists because of this; if Keras starts choosing an
    aggregation itself, the fix becomes a no-op and can go."""
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


def test_seams_of_local_sgd_and_phases_are_still_there():
    """Checkpoint callbacks average local-SGD replicas in `_save_model`; phased steps
    (gradient accumulation, delayed compression) swap `model.train_function`, which
    Keras' fit must read at every step; accumulation uses Keras' accumulators."""
    assert "_save_model" in vars(keras.callbacks.ModelCheckpoint)
    assert "_save_model" in vars(keras.callbacks.BackupAndRestore)
    for name in ("_accumulated_gradients", "_backend_increment_gradient_accumulators",
                 "_backend_reset_gradient_accumulators", "_get_variable_index"):
        assert name in inspect.getsource(keras.src.optimizers.base_optimizer), name
    fit_source = inspect.getsource(keras_tf_trainer.TensorFlowTrainer.fit)
    assert "self.train_function(iterator)" in fit_source


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
