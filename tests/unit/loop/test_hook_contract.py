"""One hook contract, honoured in three loops: `model.fit`, `tfdist.Trainer` and your own
`tf.GradientTape` loop (`tfdist.function`).

A recording hook with a delayed phase change is trained for 2 epochs of 4 steps with
validation and a checkpoint every 2 steps, on 2 replicas; every hook method must be
called the same number of times, at the same moments, in every loop — and the moments
are the documented ones (checked against a sequence written out here, not against one
of the loops).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist

pytestmark = [pytest.mark.matrix, pytest.mark.usefixtures("two_cpus", "jobs_path")]
EPOCHS, STEPS, BATCH, PHASE_STEP = 2, 4, 32, 3
LOOPS = ("fit", "trainer", "own")


class Recorder(tfdist.TrainingHook):
    """Records the Python-side calls in order, and counts the compiled ones."""

    phased = True

    def __init__(self, events):
        self.events = events

    def build(self, strategy, variables):
        self.events.append(("build", len(variables)))
        counter = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=tf.VariableAggregation.SUM)
        self.before = tf.Variable(0, **counter)  # summed over replicas when read
        self.after = tf.Variable(0, **counter)
        self.ends = tf.Variable(0, trainable=False)
        self.last_step = tf.Variable(-1, dtype=tf.int64, trainable=False)

    def phase(self, step):
        return step >= PHASE_STEP

    def plan(self, steps):
        super().plan(steps)
        self.events.append(("plan", steps))

    def enter_phase(self, phase):
        super().enter_phase(phase)
        self.events.append(("enter_phase", phase))

    def before_exchange(self, grads, variables, step):
        self.before.assign_add(1)
        return grads

    def after_exchange(self, grads, variables, step):
        self.after.assign_add(1)
        return grads

    def on_step_end(self, step):
        self.ends.assign_add(1)
        self.last_step.assign(step)

    def after_step(self, model, steps_done):
        self.events.append(("after_step", steps_done))

    def before_read(self, model):
        self.events.append(("before_read",))


class Moments(keras.callbacks.Callback):
    """Marks where validation, epoch ends and the end of training happen."""

    def __init__(self, events):
        super().__init__()
        self.events = events

    def on_test_begin(self, logs=None):
        self.events.append(("validation",))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch))

    def on_train_end(self, logs=None):
        self.events.append(("train_end",))


def expected_events(variables, loop):
    """The documented sequence: the step the loop plans to end at (fit and the Trainer
    count the dataset's batches; your own loop plans no length), phases entered before the
    first step and when they change, `after_step` after each step, `before_read` before a
    checkpoint (every 2 steps here) and validation — once per change, so not again at the
    epoch's or training's end."""
    planned = [] if loop == "own" else [("plan", EPOCHS * STEPS)]
    events = [("build", variables), *planned, ("enter_phase", False)]
    for epoch in range(EPOCHS):
        for batch in range(STEPS):
            step = epoch * STEPS + batch
            if step == PHASE_STEP:
                events.append(("enter_phase", True))
            events.append(("after_step", step + 1))
            if (batch + 1) % 2 == 0:
                events.append(("before_read",))  # the checkpoint
        events += [("validation",), ("epoch_end", epoch)]
    return events + [("train_end",)]


def run(loop, strategy, tmp_path):
    from models import conv_model, dataset, loss

    events = []
    recorder = Recorder(events)
    with strategy.scope():
        model = conv_model(seed=1, batchnorm=True, dropout=0)
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                      hooks=[recorder])
    checkpoint = tfdist.callbacks.ModelCheckpoint(str(tmp_path / "m.weights.h5"),
                                                  save_weights_only=True, save_freq=2)
    callbacks = [tfdist.callbacks.TrainingHooks(), checkpoint, Moments(events)]
    train, val = dataset(BATCH * STEPS, BATCH), dataset(BATCH * 2, BATCH, seed=1)
    if loop == "fit":
        with strategy.scope():
            model.compile(optimizer, loss())
        model.fit(train, epochs=EPOCHS, validation_data=val, callbacks=callbacks, verbose=0)
    elif loop == "trainer":
        tfdist.Trainer(model, optimizer, loss(), strategy=strategy).fit(
            train, epochs=EPOCHS, validation_data=val, callbacks=callbacks, verbose=0)
    else:
        own_loop(strategy, model, optimizer, train, val, callbacks[1:])
    return recorder, model


def own_loop(strategy, model, optimizer, train, val, callbacks):
    """Keras' "writing a training loop from scratch" guide, distributed, with its
    `CallbackList`; the documented tfdist lines are marked."""
    from models import loss

    loss_fn = loss()
    with strategy.scope():
        optimizer.build(model.trainable_variables)
    callbacks = keras.callbacks.CallbackList(callbacks, model=model)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            value = loss_fn(y, model(x, training=True))
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    @tfdist.function(model=model, optimizer=optimizer)  # tfdist: instead of @tf.function
    def train_step(x, y):
        strategy.run(replica_step, args=(x, y))

    @tf.function
    def test_step(x, y):
        strategy.run(lambda x, y: model(x, training=False), args=(x, y))

    callbacks.on_train_begin()
    for epoch in range(EPOCHS):
        callbacks.on_epoch_begin(epoch)
        for batch, (x, y) in enumerate(strategy.experimental_distribute_dataset(train)):
            callbacks.on_train_batch_begin(batch)
            train_step(x, y)
            if (batch + 1) % 2 == 0:
                train_step.before_read()  # tfdist: before the checkpoint saves
            callbacks.on_train_batch_end(batch)
        train_step.before_read()  # tfdist: before validation
        callbacks.on_test_begin()
        for x, y in strategy.experimental_distribute_dataset(val):
            test_step(x, y)
        callbacks.on_test_end()
        train_step.before_read()  # tfdist: before the epoch's end (free: nothing changed)
        callbacks.on_epoch_end(epoch)
    train_step.before_read()  # tfdist: before the end of training (free here)
    callbacks.on_train_end()


_trained = {}


def trained(loop, strategy, tmp_path_factory):
    """`run(loop)` once per session: both tests below read the same three runs."""
    if loop not in _trained:
        _trained[loop] = run(loop, strategy, tmp_path_factory.mktemp(loop))
    return _trained[loop]


@pytest.mark.parametrize("loop", LOOPS)
def test_every_hook_method_is_called_the_same_in_every_loop(strategies, tmp_path_factory, loop):
    strategy = strategies("mirrored")
    recorder, model = trained(loop, strategy, tmp_path_factory)
    assert recorder.events == expected_events(len(model.trainable_variables), loop)
    assert recorder.planned_steps == (None if loop == "own" else EPOCHS * STEPS)
    steps = EPOCHS * STEPS
    replicas = strategy.num_replicas_in_sync
    assert int(recorder.before.numpy()) == int(recorder.after.numpy()) == steps * replicas
    assert int(recorder.ends.numpy()) == steps  # once per step, after the update
    assert int(recorder.last_step.numpy()) == steps  # counting the step it ends
    # before_read made one model: per-replica BatchNormalization statistics agree.
    for variable in model.non_trainable_variables:
        copies = strategy.experimental_local_results(tfdist.step.variables.underlying(variable))
        for copy in copies[1:]:
            np.testing.assert_allclose(copy.numpy(), copies[0].numpy(), rtol=1e-6)


def test_the_three_loops_train_the_same_model(strategies, tmp_path_factory):
    """The same hooks, the same data, the same weights: nothing differs but the loop."""
    strategy = strategies("mirrored")
    weights = {loop: [w.numpy() for w in trained(loop, strategy, tmp_path_factory)[1].weights]
               for loop in LOOPS}
    for loop in LOOPS[1:]:
        for a, b in zip(weights["fit"], weights[loop]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_fit_plans_the_step_it_ends_at_from_where_it_starts(strategies, accumulation):
    """`plan` counts optimizer updates (batches over the gradient accumulation) from the
    count the fit starts at: a second fit ends its plan after the first's updates; data of
    unknown length plans none."""
    from models import conv_model, dataset, loss

    strategy = strategies("mirrored")
    events = []
    with strategy.scope():
        model = conv_model(seed=1, batchnorm=False, dropout=0)
        sgd = keras.optimizers.SGD(0.05, gradient_accumulation_steps=accumulation
                                   if accumulation > 1 else None)
        model.compile(tfdist.keras.DistributedOptimizer(sgd, hooks=[Recorder(events)]), loss())
    train, hooks = dataset(BATCH * STEPS, BATCH), tfdist.callbacks.TrainingHooks()
    model.fit(train, epochs=1, callbacks=[hooks], verbose=0)
    model.fit(train, epochs=3, initial_epoch=1, callbacks=[hooks], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 3 * STEPS // accumulation  # as planned
    model.fit(train.filter(lambda x, y: True), epochs=1, callbacks=[hooks], verbose=0)
    plans = [event[1] for event in events if event[0] == "plan"]
    assert plans == [STEPS // accumulation, 3 * STEPS // accumulation, None]
