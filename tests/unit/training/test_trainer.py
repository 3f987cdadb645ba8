"""tfdist.Trainer in one process: Keras-like fit, callbacks, hooks, resume."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.step.hooks import all_reduce_sum
from tfdist.training import TrainingHook

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")


class Recorder(keras.callbacks.Callback):
    """Records the hooks Keras callbacks receive."""

    def on_train_begin(self, logs=None):
        self.events, self.epochs, self.batches = ["train_begin"], [], 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append((epoch, dict(logs)))

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_train_end(self, logs=None):
        self.events.append("train_end")


def make_trainer(strategy, hooks=(), optimizer=None, regularizer=None, metrics=("sparse_categorical_accuracy",)):
    from models import conv_model, loss

    with strategy.scope():
        model = conv_model(seed=5, batchnorm=False, dropout=0)
        if regularizer:
            model.layers[-1].kernel_regularizer = regularizer
    return tfdist.Trainer(model, optimizer or keras.optimizers.SGD(0.1), loss(),
                          strategy=strategy, metrics=list(metrics), hooks=hooks)


def test_fit_returns_history_and_drives_callbacks(strategies):
    from models import dataset

    trainer = make_trainer(strategies("mirrored"))
    recorder = Recorder()
    history = trainer.fit(dataset(128, 32), epochs=3, validation_data=dataset(64, 32),
                          callbacks=[recorder], verbose=0)
    assert isinstance(history, keras.callbacks.History)
    assert set(history.history) == {"loss", "sparse_categorical_accuracy", "val_loss",
                                    "val_sparse_categorical_accuracy"}
    assert recorder.events == ["train_begin", "train_end"]
    assert [e for e, _ in recorder.epochs] == [0, 1, 2] and recorder.batches == 12
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert trainer.completed_steps == 12 == int(trainer.optimizer.iterations.numpy())
    evaluated = trainer.evaluate(dataset(64, 32), verbose=0)
    assert evaluated["loss"] == pytest.approx(history.history["val_loss"][-1], rel=1e-6)


def test_trainer_matches_model_fit_including_regularisation():
    """Independent reference: Keras' own fit on the same model, data and optimizer."""
    from models import conv_model, dataset, loss

    keras_model = conv_model(seed=5, batchnorm=False, dropout=0)
    keras_model.layers[-1].kernel_regularizer = keras.regularizers.L2(0.01)
    keras_model.compile(keras.optimizers.SGD(0.1), loss())
    expected = keras_model.fit(dataset(128, 32), epochs=2, verbose=0).history["loss"]
    trainer = make_trainer(tf.distribute.get_strategy(), regularizer=keras.regularizers.L2(0.01),
                           metrics=())
    history = trainer.fit(dataset(128, 32), epochs=2, verbose=0).history["loss"]
    np.testing.assert_allclose(history, expected, rtol=1e-5)
    for a, b in zip(trainer.model.weights, keras_model.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)


def test_dataset_function_gets_the_input_context(strategies):
    from models import dataset

    seen = []

    def dataset_fn(context):
        seen.append((context.num_replicas_in_sync, context.get_per_replica_batch_size(32)))
        return dataset(128, context.get_per_replica_batch_size(32), repeat=True)

    trainer = make_trainer(strategies("mirrored"))
    trainer.fit(dataset_fn, epochs=2, steps_per_epoch=3, verbose=0)
    assert seen and set(seen) == {(2, 16)}
    assert trainer.completed_steps == 6


def test_epochs_of_steps_per_epoch_read_on_through_one_input_iterator(strategies):
    """With `steps_per_epoch` on a repeated dataset, each epoch reads on from where the
    last one stopped (as Keras' fit): one input iterator for the whole `fit`, started again
    only when the data ends. (benchmarks/overhead.py's `trainer` rung relies on it.)"""
    from models import images

    x, y = images(64, 0)

    def noted(read):  # each dataset its own record: the first fit's iterator may still
        def note(i):  # prefetch (a background thread) while the second fit reads
            read.append(int(i))
            return i

        return tf.data.Dataset.range(64).map(lambda i: tf.py_function(note, [i], tf.int64)).map(
            lambda i: (tf.gather(x, i), tf.gather(y, i)))

    trainer = make_trainer(strategies("mirrored"))
    read = []
    trainer.fit(noted(read).repeat().batch(8), epochs=3, steps_per_epoch=2, verbose=0)
    assert trainer.completed_steps == 6
    assert read[:48] == list(range(48))  # 3 epochs x 2 steps x 8: no example read twice
    read = []
    trainer.fit(noted(read).batch(8), epochs=2, verbose=0)  # finite: a new one each epoch
    assert read == list(range(64)) * 2


def test_early_stopping_is_obeyed(strategies):
    from models import dataset

    trainer = make_trainer(strategies("mirrored"))
    stop = keras.callbacks.EarlyStopping(monitor="loss", min_delta=100.0, patience=0)
    history = trainer.fit(dataset(64, 32), epochs=10, callbacks=[stop], verbose=0)
    assert len(history.history["loss"]) == 2


class ScaleAfterExchange(TrainingHook):
    def __init__(self, factor):
        self.factor = factor

    def after_exchange(self, grads, variables, step):
        return [g * self.factor for g in grads]


class MeanExchange(TrainingHook):
    replaces_exchange = True

    def exchange(self, grads, variables, step):
        n = tf.distribute.get_replica_context().num_replicas_in_sync
        return [g / n for g in all_reduce_sum(grads)]


class LocalOnly(TrainingHook):
    replaces_exchange = True

    def exchange(self, grads, variables, step):
        return grads


class CountSteps(TrainingHook):
    def build(self, strategy, variables):
        self.calls = tf.Variable(0, dtype=tf.int64)
        self.last = tf.Variable(-1, dtype=tf.int64)

    def on_step_end(self, step):
        self.calls.assign_add(1)
        self.last.assign(step)


def one_step_update(strategy, hooks):
    """Weight change of one SGD step on the same batch."""
    from models import dataset

    trainer = make_trainer(strategy, hooks=hooks, metrics=())
    before = [w.numpy() for w in trainer.model.trainable_weights]
    trainer.fit(dataset(32, 32), epochs=1, verbose=0)
    return trainer, [w.numpy() - b for w, b in zip(trainer.model.trainable_weights, before)]


def test_exchange_hooks_change_the_update_as_they_should(strategies):
    strategy = strategies("mirrored")
    _, plain = one_step_update(strategy, [])
    _, zero = one_step_update(strategy, [ScaleAfterExchange(0.0)])
    _, mean = one_step_update(strategy, [MeanExchange()])
    assert max(np.abs(d).max() for d in plain) > 1e-4
    assert all(np.abs(d).max() == 0 for d in zero)
    for m, p in zip(mean, plain):  # a mean over 2 replicas is half the sum
        np.testing.assert_allclose(m, p / 2, atol=1e-7)


def test_replacing_the_exchange_by_nothing_lets_replicas_diverge(strategies):
    strategy = strategies("mirrored")
    synced, _ = one_step_update(strategy, [])
    local, _ = one_step_update(strategy, [LocalOnly()])
    kernel = lambda t: strategy.experimental_local_results(t.model.trainable_variables[0].value)
    a, b = kernel(synced)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    a, b = kernel(local)
    assert np.abs(a.numpy() - b.numpy()).max() > 1e-5


def test_step_end_hook_sees_every_step(strategies):
    from models import dataset

    counter = CountSteps()
    trainer = make_trainer(strategies("mirrored"), hooks=[counter])
    trainer.fit(dataset(96, 32), epochs=2, verbose=0)
    assert int(counter.calls.numpy()) == 6 and int(counter.last.numpy()) == 6


def test_two_hooks_cannot_both_replace_the_exchange(strategies):
    with pytest.raises(ValueError, match="only one hook may replace"):
        make_trainer(strategies("mirrored"), hooks=[MeanExchange(), LocalOnly()])


def test_bad_arguments():
    with pytest.raises(ValueError, match="must be built"):
        tfdist.Trainer(keras.Sequential([keras.layers.Dense(1)]), "sgd", "mse")
    from models import conv_model

    model = conv_model()
    with pytest.raises(ValueError, match="expected a Keras loss"):
        tfdist.Trainer(model, "sgd", 3)
    trainer = tfdist.Trainer(model, "sgd", "mse")
    with pytest.raises(ValueError, match=r"Trainer\(\): steps_per_epoch: expected a value >= 1"):
        trainer.fit(tf.data.Dataset.range(3), steps_per_epoch=0)
    with pytest.raises(TypeError, match="tf.data.Dataset of global batches or a function"):
        trainer.fit([1, 2, 3])
    with pytest.raises(ValueError, match="already has variables"):  # used by a trainer
        tfdist.Trainer(model, trainer.optimizer, "mse")


class KeepWeights(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self.weights = [w.numpy() for w in self.model.weights]


def test_trainer_resumes_from_backup_after_an_interruption(strategies, tmp_path):
    from faults import Interrupt
    from models import dataset

    backup = str(tmp_path / "backup")
    first, kept = make_trainer(strategies("mirrored")), KeepWeights()
    with pytest.raises(KeyboardInterrupt):
        first.fit(dataset(128, 32), epochs=4, verbose=0, callbacks=[
            tfdist.callbacks.BackupAndRestore(backup), kept, Interrupt(epoch=2)])
    second, recorder = make_trainer(strategies("mirrored")), Recorder()
    restored = KeepWeights()

    class Check(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            restored.weights = [w.numpy() for w in self.model.weights]

    second.fit(dataset(128, 32), epochs=4, verbose=0,
               callbacks=[tfdist.callbacks.BackupAndRestore(backup), Check(), recorder])
    assert [e for e, _ in recorder.epochs] == [2, 3]  # epochs 0 and 1 are not redone
    for r, k in zip(restored.weights, kept.weights):  # state at the end of epoch 1
        np.testing.assert_array_equal(r, k)
    assert list((tmp_path / "backup").iterdir()) == []  # its backups deleted after a finished run


def test_model_checkpoint_on_the_chief_writes_the_file(strategies, tmp_path):
    from models import dataset

    path = tmp_path / "model-{epoch}.weights.h5"
    make_trainer(strategies("mirrored")).fit(
        dataset(64, 32), epochs=2, verbose=0,
        callbacks=[tfdist.callbacks.ModelCheckpoint(str(path), save_weights_only=True)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-1.weights.h5",
                                                          "model-2.weights.h5"]


def test_metrics_made_outside_the_scope_count_every_replica_and_logs_read_at_once(strategies):
    """A metric created outside `strategy.scope()` is re-created in it (its state must live on
    every replica); every step's logs, read with one all-reduce, equal what each metric's
    own cross-replica read gives, and the epoch's accuracy (learning rate 0: a fixed model)
    is NumPy's over all the samples."""
    import keras
    import tensorflow as tf

    import tfdist
    from tfdist.step.variables import underlying

    strategy = strategies("mirrored")
    outside = [keras.metrics.MeanIoU(3, sparse_y_pred=False, name="iou"),
               keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainer = tfdist.Trainer(model, keras.optimizers.SGD(0.0), loss, strategy=strategy,
                             metrics=outside)
    assert all(strategy.extended.variable_created_in_scope(underlying(v))
               for m in trainer.metrics for v in m.variables)
    seen = []

    class Compare(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(({k: float(v) for k, v in logs.items()},
                         {k: float(v) for k, v in trainer._steps.results().items()}))

    x = np.random.default_rng(0).random((64, 4)).astype("float32")
    y = np.random.default_rng(1).integers(0, 3, 64)
    history = trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1,
                          verbose=0, callbacks=[Compare()])
    assert len(seen) == 4
    for at_once, one_by_one in seen:
        assert at_once == pytest.approx(one_by_one, rel=1e-6)
    expected = np.mean(np.argmax(model.predict(x, verbose=0), -1) == y)
    assert history.history["accuracy"][-1] == pytest.approx(expected, rel=1e-6)

    unbuildable = keras.metrics.MeanMetricWrapper(lambda y, p: tf.cast(y, "float32"))
    with pytest.raises(ValueError, match="created outside the strategy's scope and cannot be "
                                         "re-created from its config"):
        tfdist.Trainer(model, "sgd", loss, strategy=strategy, metrics=[unbuildable])


def _collectives(graph_def):
    """{name: (dtype, names of every op it depends on)} of the all-reduces in a step's graph
    (control and data inputs, through the function's own graph)."""
    nodes = {n.name: n for n in graph_def.node}

    def ancestors(name, seen):
        for source in nodes[name].input:
            source = source.lstrip("^").split(":")[0]
            if source in nodes and source not in seen:
                seen.add(source)
                ancestors(source, seen)
        return seen

    return {n.name: (n.attr["T"].type, ancestors(n.name, set())) for n in graph_def.node
            if n.op == "CollectiveReduceV2"}


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_a_steps_logs_are_read_beside_the_backward_pass(strategies, policy):
    """The metrics' all-reduce (float64) does not wait for the gradients' (issue 33: after
    them, its latency added to every step); under dynamic loss scaling it does (a skipped
    step counts in no metric, which the gradients' verdict decides)."""
    from models import dataset

    keras.mixed_precision.set_global_policy(policy)
    try:
        trainer = make_trainer(strategies("mirrored"), optimizer=keras.optimizers.Adam(0.01))
        trainer.fit(dataset(64, 32), epochs=1, steps_per_epoch=1, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    function = trainer.driver.function(trainer._make_train_function).function
    batch = next(iter(trainer.strategy.experimental_distribute_dataset(dataset(64, 32))))
    graph = function.get_concrete_function(batch).graph.as_graph_def()
    collectives = _collectives(graph)
    logs = {n: a for n, (dtype, a) in collectives.items() if dtype == tf.float64.as_datatype_enum}
    grads = {n for n, (dtype, _) in collectives.items() if dtype != tf.float64.as_datatype_enum}
    assert logs and grads, collectives.keys()  # one read per replica, the gradients'
    waits = [grads & ancestors for ancestors in logs.values()]
    assert all(waits) if policy == "mixed_float16" else not any(waits), waits


class CountedUpdates(keras.metrics.Metric):
    """Counts its updates in a variable read_at_once cannot sum (only the first replica's)."""

    def __init__(self, name="updates", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.updates = self.add_variable(shape=(), initializer="zeros", name="updates",
                                         aggregation="only_first_replica")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.updates.assign_add(1.0)

    def result(self):
        return tf.identity(self.updates)

    def reset_state(self):
        self.updates.assign(0.0)


def test_a_metric_read_on_its_own_is_updated_once_a_step(strategies):
    """Where the step's logs cannot be read at once, each metric is read afterwards — and
    updated once, not again after the update the step made beside the backward pass."""
    from models import dataset

    trainer = make_trainer(strategies("mirrored"), metrics=[CountedUpdates()])
    history = trainer.fit(dataset(128, 32), epochs=1, verbose=0)
    assert history.history["updates"] == [4.0]
