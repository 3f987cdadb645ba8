"""The models users bring (tests/e2e/jobs/zoo.py), through tfdist on 2 logical CPUs: with the
exact exchange and SGD every family ends with one device's weights (TensorFlow's own
strategy's where BatchNormalization and Dropout compute per replica) in `fit`, the Trainer
and your own loop, on every replica; every other exchange and local SGD train them."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.step.variables import underlying

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")

LOOPS = ("fit", "fit_dataset", "trainer", "own")


def replica_weights(model):
    """[[each replica's value] of each weight of `model`]."""
    strategy = model.distribute_strategy
    return [[t.numpy() for t in strategy.experimental_local_results(underlying(w))]
            for w in model.weights]


_REFERENCES = {}


def reference(family, loop, strategy_of_tensorflow=None):
    """(weights, losses) of the run tfdist is compared with: the same loop on one device
    (fit's for the Trainer, which computes the same loss), or on TensorFlow's own strategy
    (made once per family and loop)."""
    from zoo import train

    base = {"fit_dataset": "fit", "trainer": "fit"}.get(loop, loop)
    key = (family, base, strategy_of_tensorflow is None)
    if key not in _REFERENCES:
        _REFERENCES[key] = train(family, base, strategy_of_tensorflow)[:2]
    return _REFERENCES[key]


def tfdist_run(family, loop, strategy, compression="none", **options):
    from zoo import train

    wrap = options.pop("wrap", None) or (
        lambda optimizer: tfdist.keras.DistributedOptimizer(optimizer, compression))
    return train(family, loop.replace("_dataset", ""), strategy, wrap=wrap,
                 numpy=loop != "fit_dataset", **options)


@pytest.fixture(scope="module")
def tensorflow_mirrored(tensorflows_mirrored):
    return tensorflows_mirrored()


#: Every family through fit; every loop for the families whose inputs and layers differ
#: most (a sequence with an embedding, several inputs and outputs, one layer used twice).
#: benchmarks/model_zoo.py runs every cell of the grid.
FAMILY_LOOPS = ([(family, "fit") for family in ("transformer", "rnn", "conv", "multi_io",
                                                 "finetune", "shared")]
                + [(family, loop) for family in ("transformer", "multi_io", "shared")
                   for loop in LOOPS if loop != "fit"])


@pytest.mark.parametrize("family, loop", FAMILY_LOOPS)
def test_every_family_ends_where_one_device_does(strategies, tensorflow_mirrored, family, loop):
    from zoo import PER_REPLICA

    ours, our_losses, model = tfdist_run(family, loop, strategies("mirrored"))
    per_replica = family in PER_REPLICA
    theirs, their_losses = reference(family, loop, tensorflow_mirrored if per_replica else None)
    for variable, replicas, expected in zip(model.weights, replica_weights(model), theirs):
        if per_replica and not variable.trainable:
            continue  # TF keeps replica 0's BatchNormalization statistics, tfdist their mean
        for value in replicas:
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{variable.path}")
    np.testing.assert_allclose(our_losses, their_losses, rtol=1e-5)
    assert our_losses[-1] < our_losses[0]


@pytest.mark.parametrize("compression, value_bytes", [("none", 4), ("fp16", 2)])
def test_an_embedding_crosses_as_the_rows_a_step_touched(strategies, compression, value_bytes):
    """The transformer's two embeddings (300 x 16 tokens, 10 x 16 positions) cross as the
    rows each step looked up, duplicates included, as TensorFlow's own strategy sends them —
    counted by hand here from the batches — and the rest as dense tensors; fp16 halves the
    rows' values (their int32 indices stay). CommStats' ratios: against the dense tables,
    and against what TensorFlow sends."""
    from zoo import BATCH, LENGTH, ROWS

    stats = tfdist.callbacks.CommStats()
    options = {} if compression == "none" else {"min_size": 0}
    _, _, model = tfdist_run("transformer", "fit", strategies("mirrored"), epochs=1,
                             callbacks=[stats], wrap=lambda optimizer:
                             tfdist.keras.DistributedOptimizer(optimizer, compression, **options))
    logs = {k: v[-1] for k, v in model.history.history.items()}
    tables = [w for w in model.trainable_weights if "embedding" in w.path]
    assert [tuple(t.shape) for t in tables] == [(300, 16), (10, 16)]
    dense = sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights
                if "embedding" not in w.path)
    batches = [min(BATCH, ROWS - start) for start in range(0, ROWS, BATCH)]
    # each replica's share of a batch's tokens, and every replica's 10 positions, a step
    rows = np.mean([b * LENGTH / 2 + LENGTH for b in batches])
    sent_rows = rows * (16 * value_bytes + 4)
    verdict = 4  # the step's finiteness flag rides the dense all-reduce
    assert logs["comm_payload_bytes"] == pytest.approx(
        dense * value_bytes / 4 + sent_rows + verdict, abs=1)
    tensorflow = dense + rows * (16 * 4 + 4)
    assert logs["compression_ratio_vs_tensorflow"] == pytest.approx(
        tensorflow / logs["comm_payload_bytes"], rel=1e-6)
    tables_dense = dense + sum(int(np.prod(t.shape)) * 4 for t in tables)
    assert logs["compression_ratio"] == pytest.approx(
        tables_dense / logs["comm_payload_bytes"], rel=1e-6)
    if compression == "none":  # what TensorFlow's own strategy sends, and a flag
        assert logs["comm_payload_bytes"] <= tensorflow + verdict


@pytest.mark.parametrize("family", ["transformer", "conv", "multi_io", "finetune"])
def test_under_mixed_float16_every_family_ends_where_tensorflows_strategy_does(
        strategies, tensorflow_mirrored, family):
    """Under mixed_float16 (dynamic loss scaling), against TensorFlow's own strategy on as
    many replicas: one device differs by design here — its whole batch overflows a loss
    scale that half a batch does not, so it skips a step the replicas take."""
    from zoo import PER_REPLICA, train

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        ours, our_losses, model = tfdist_run(family, "fit", strategies("mirrored"), epochs=3)
        theirs, their_losses, _ = train(family, "fit", tensorflow_mirrored, epochs=3)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.optimizer.__class__.__name__ == "LossScaleOptimizer"
    for variable, replicas, expected in zip(model.weights, replica_weights(model), theirs):
        if family in PER_REPLICA and not variable.trainable:
            continue
        for value in replicas:
            np.testing.assert_allclose(value, expected, rtol=1e-3, atol=1e-4,
                                       err_msg=variable.path)
    np.testing.assert_allclose(our_losses, their_losses, rtol=1e-3)


COMPILE_OPTIONS = {"steps_per_execution": {"steps_per_execution": 2},
                   "jit_compile": {"jit_compile": True}}


def _compiled_fit(strategy, options, wrap=True):
    from zoo import data

    x, y, _ = data("transformer", rows=32)
    with strategy.scope():
        model = _sequence_model()
        optimizer = keras.optimizers.SGD(0.05)
        if wrap:
            optimizer = tfdist.keras.DistributedOptimizer(optimizer, "none")
        model.compile(optimizer, "sparse_categorical_crossentropy", **options)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
              callbacks=[tfdist.callbacks.TrainingHooks()] if wrap else [])
    return [w.numpy() for w in model.weights]


def _sequence_model():
    from zoo import LENGTH, VOCAB

    keras.utils.set_random_seed(2)
    return keras.Sequential([keras.Input((LENGTH,), dtype="int32"),
                             keras.layers.Embedding(VOCAB, 4), keras.layers.Dense(4),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])


@pytest.mark.parametrize("option", list(COMPILE_OPTIONS))
def test_compile_options_keras_cannot_run_on_several_replicas_are_refused_in_one_line(
        strategies, tensorflow_mirrored, option):
    """steps_per_execution > 1 and jit_compile=True: refused on 2 replicas with what to write
    (before TensorFlow's own error, which its own strategy still raises: the canary that
    says when Keras lifts the limit); on one replica they train as without them."""
    with pytest.raises(tfdist.errors.UnsupportedError, match=f"{option}.*several replicas"):
        _compiled_fit(strategies("mirrored"), COMPILE_OPTIONS[option])
    with pytest.raises(tf.errors.InvalidArgumentError):
        _compiled_fit(tensorflow_mirrored, COMPILE_OPTIONS[option], wrap=False)
    one = strategies("one_device")
    for a, b in zip(_compiled_fit(one, COMPILE_OPTIONS[option]), _compiled_fit(one, {})):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_trainer_takes_fits_metric_names_and_inputs(strategies):
    """What `compile` and `fit` take, the Trainer takes: "accuracy" becomes the accuracy of
    the loss's labels (sparse here; binary for one output unit), a `fn(context)` input reads
    what `model.fit` reads from `strategy.distribute_datasets_from_function(fn)`; NumPy arrays
    and an accuracy a loss of one's own cannot tell are refused in one line saying what to
    write."""
    from zoo import BATCH, build, compile_arguments, data, dataset

    strategy = strategies("mirrored")
    x, y, _ = data("transformer")

    def per_replica(context):
        return dataset("transformer").unbatch().batch(context.get_per_replica_batch_size(BATCH))

    logs = {}
    for loop in ("fit", "trainer"):
        with strategy.scope():
            model = build("transformer")
            optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), "none")
        arguments = compile_arguments("transformer")
        if loop == "fit":
            with strategy.scope():
                model.compile(optimizer, **arguments)
            history = model.fit(strategy.distribute_datasets_from_function(per_replica),
                                epochs=2, verbose=0,
                                callbacks=[tfdist.callbacks.TrainingHooks()])
        else:
            trainer = tfdist.Trainer(model, optimizer, strategy=strategy, **arguments)
            assert type(trainer.metrics[0]).__name__ == "SparseCategoricalAccuracy"
            history = trainer.fit(per_replica, epochs=2, verbose=0)
        logs[loop] = history.history
    np.testing.assert_allclose(logs["trainer"]["accuracy"], logs["fit"]["accuracy"])
    np.testing.assert_allclose(logs["trainer"]["loss"], logs["fit"]["loss"], rtol=1e-5)

    with strategy.scope():
        binary = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert type(tfdist.Trainer(binary, "sgd", "mse", strategy=strategy,
                               metrics=["acc"]).metrics[0]).__name__ == "BinaryAccuracy"
    with strategy.scope():
        model = build("transformer")
    with pytest.raises(ValueError, match="SparseCategoricalAccuracy.*CategoricalAccuracy"):
        tfdist.Trainer(model, "sgd", lambda t, p: keras.losses.mse(t, p), strategy=strategy,
                       metrics=["accuracy"])
    trainer = tfdist.Trainer(model, "sgd", "sparse_categorical_crossentropy", strategy=strategy)
    with pytest.raises(TypeError, match=r"from_tensor_slices\(\(x, y\)\)"):
        trainer.fit(x, epochs=1)


GLOBAL_DATASET = None  # a module's dataset (made in the test: TF starts after its CPUs)


def test_a_parameter_server_dataset_function_using_the_chiefs_dataset_is_refused():
    """TensorFlow's "Parameter server training" tutorial builds its dataset inside
    `dataset_fn`; one that closes over a dataset made on the chief (or reads a module's)
    fails on the workers with "Unable to parse tensor proto": refused on the chief first,
    naming the dataset. The function that builds its own passes the check."""
    from tfdist.training.data import distribute

    global GLOBAL_DATASET
    GLOBAL_DATASET = tf.data.Dataset.range(4)
    made_here = tf.data.Dataset.range(8)

    class NoCoordinator:
        def create_per_worker_dataset(self, fn):
            return "per worker"

    strategy = tf.distribute.get_strategy()
    for fn, name in ((lambda context: made_here.batch(2), "made_here"),
                     (lambda context: GLOBAL_DATASET.batch(2), "GLOBAL_DATASET")):
        with pytest.raises(ValueError, match=f"build '{name}' inside the function"):
            distribute(strategy, fn, NoCoordinator())
    assert distribute(strategy, lambda context: tf.data.Dataset.range(8).batch(2),
                      NoCoordinator()) == "per worker"


def test_gradient_accumulation_of_an_embeddings_rows_ends_where_one_device_does(strategies):
    """Keras' gradient_accumulation_steps over the transformer (its embeddings' rows summed
    into dense accumulators on each replica, exchanged every second step) on 2 replicas, as
    one device accumulates them."""
    from zoo import train

    def optimizer():
        return keras.optimizers.SGD(0.05, momentum=0.9, gradient_accumulation_steps=2)

    expected, expected_losses, _ = train("transformer", "fit", optimizer_fn=optimizer)
    _, losses, model = tfdist_run("transformer", "fit", strategies("mirrored"),
                                  optimizer_fn=optimizer)
    for replicas, value in zip(replica_weights(model), expected):
        for got in replicas:
            np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
