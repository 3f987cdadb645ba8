"""Preemption in one process on 2 replicas (tfdist/step/preemption.py): the process sends
itself SIGTERM, as Kubernetes or SLURM would; the next step's all-reduce makes it the
agreed step; the backup holds that step and a new run resumes exactly there. The
multi-worker version (4 processes, one preempted) is in test_multiworker_training.py."""

import os
import shutil
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.keras.backup import seed_states
from tfdist.step.preemption import EXIT_CODE, Preempted, skipping

pytestmark = pytest.mark.usefixtures("two_cpus")
STEPS, BATCH = 4, 16


class SignalAt(keras.callbacks.Callback):
    """SIGTERM to this process after step `batch` of `epoch` (first so it logs first)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch, self.trained = (epoch, batch), None, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if skipping(self.model, self.epoch, batch):  # trained before: read and dropped
            return
        self.trained.append((self.epoch, batch))
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def compiled(strategy, compression, dropout=0.0):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  *([keras.layers.Dropout(dropout)] if dropout else []),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(0.01)
        if compression:
            optimizer = tfdist.keras.DistributedOptimizer(optimizer, compression, min_size=0)
        model.compile(optimizer, "mse")
    return model


@pytest.mark.parametrize("compression,policy", [
    (None, None), ("fp16", None),  # Keras' own step, tfdist's step
    ("topk", "mixed_float16")])    # the loss scale and its counter saved and restored
def test_a_sigterm_saves_at_the_next_step_and_the_rerun_trains_each_step_once(
        strategies, tmp_path, compression, policy, request):
    if policy:
        keras.mixed_precision.set_global_policy(policy)
        request.addfinalizer(lambda: keras.mixed_precision.set_global_policy("float32"))
    strategy = strategies("mirrored")
    x, y = data()
    backup = str(tmp_path / "backup")
    fit = dict(batch_size=BATCH, epochs=3, verbose=0, shuffle=False)
    model = compiled(strategy, compression)
    signals = SignalAt(epoch=1, batch=1)
    with pytest.raises(Preempted) as preempted:
        model.fit(x, y, **fit, callbacks=[signals, tfdist.callbacks.TrainingHooks(),
                                          tfdist.callbacks.BackupAndRestore(backup)])
    assert preempted.value.code == EXIT_CODE == 143
    assert "after step 3 of epoch 1" in str(preempted.value)
    assert signals.trained[-1] == (1, 2)  # the step after the signal ran, on every replica
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handed back

    resumed = compiled(strategy, compression)
    again = SignalAt(epoch=-1, batch=-1)
    resumed.fit(x, y, **fit, callbacks=[again, tfdist.callbacks.TrainingHooks(),
                                        tfdist.callbacks.BackupAndRestore(backup)])
    assert again.trained == [(1, 3), (2, 0), (2, 1), (2, 2), (2, 3)]  # the rest, once
    clean = compiled(strategy, compression)
    clean.fit(x, y, **fit)
    # 12 steps ran; under mixed_float16 the first overflowed and was skipped, alike in both
    assert int(resumed.optimizer.iterations.numpy()) == int(clean.optimizer.iterations.numpy()) \
        == (11 if policy else 12)
    if policy:  # compile wrapped it in loss scaling, which tfdist took over; same scale
        assert isinstance(resumed.optimizer, keras.optimizers.LossScaleOptimizer)
        assert float(resumed.optimizer.dynamic_scale.numpy()) == \
            float(clean.optimizer.dynamic_scale.numpy()) < 32768  # it moved
    for a, b in zip(resumed.weights, clean.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("compression,policy", [(None, None), ("fp16", None),
                                                ("fp16", "mixed_float16")])
def test_a_model_with_dropout_resumes_drawing_the_masks_an_uninterrupted_run_draws(
        strategies, tmp_path, compression, policy, request):
    """Keras' `save_weights` leaves a Dropout's seed generator out: a resumed run would draw
    other masks than the uninterrupted one (and end with other weights). The backup keeps
    it; the resumed weights equal the uninterrupted run's, and differ from a run whose
    masks started again (so the masks mattered)."""
    if policy:
        keras.mixed_precision.set_global_policy(policy)
        request.addfinalizer(lambda: keras.mixed_precision.set_global_policy("float32"))
    strategy = strategies("mirrored")
    x, y = data()
    backup = str(tmp_path / "backup")
    fit = dict(batch_size=BATCH, epochs=3, verbose=0, shuffle=False)
    with pytest.raises(Preempted):
        compiled(strategy, compression, 0.5).fit(
            x, y, **fit, callbacks=[SignalAt(1, 1), tfdist.callbacks.BackupAndRestore(backup)])
    resumed = compiled(strategy, compression, 0.5)
    resumed.fit(x, y, **fit, callbacks=[tfdist.callbacks.BackupAndRestore(backup)])
    clean = compiled(strategy, compression, 0.5)
    clean.fit(x, y, **fit)
    for a, b in zip(resumed.weights, clean.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    fresh_masks = compiled(strategy, compression, 0.5)
    initial = [state.numpy() for state in seed_states(fresh_masks)]
    assert initial  # a Dropout's seed generator: what the backup keeps
    fresh_masks.fit(x, y, **{**fit, "epochs": 1})
    for state, value in zip(seed_states(fresh_masks), initial):
        state.assign(value)  # what a resume without it would draw
    fresh_masks.fit(x, y, **{**fit, "epochs": 2})
    assert any(not np.allclose(a.numpy(), b.numpy(), rtol=1e-4)
               for a, b in zip(fresh_masks.weights, clean.weights))


def per_replica(strategy, model):
    """Every replica's weights and optimizer slots (Adam's moments), as NumPy arrays."""
    from tfdist.seam.owned import optimizers_of
    from tfdist.step.variables import optimizer_slots, underlying

    variables = [underlying(v) for v in model.trainable_variables]
    variables += optimizer_slots(optimizers_of(model)[0])
    return [[v.numpy() for v in strategy.experimental_local_results(variable)]
            for variable in variables]


@pytest.mark.parametrize("averager, policy", [  # (plain local SGD: DiLoCo's outer step at
    # rate 1, the schedule's unit tests in test_local_sgd_parts.py; one case fewer for CI)
    (dict(period=3, outer="nesterov", fragments=2, overlap_steps=1, compression="int8"),
     None),
    (dict(period=3, outer="nesterov"), "mixed_float16"),
    (dict(period=3, warmup_steps=9, warmup_compression={
        "name": "topk", "ratio": 0.25, "error_feedback": True, "min_size": 0}),
     "mixed_float16"),
    (dict(period=3, fragments=2, overlap_steps=1, overlap_mix=0.5, compression="int8"),
     "mixed_float16")],
    ids=["streaming-diloco-overlapped", "diloco-mixed-float16",
         "topk-warm-up-mixed-float16", "streaming-local-sgd-mixed-float16"])
def test_a_sigterm_between_two_synchronisations_resumes_every_replica_exactly(
        strategies, tmp_path, averager, policy, request):
    """Local SGD (period 3 over epochs of 4 steps) with Adam: the signal after step 2 of
    epoch 1 is agreed at step 3, between two synchronisations (steps 6 and 9), while the
    replicas hold different weights and Adam moments (and, under Streaming DiLoCo with
    int8 averages, an exchange is in flight, and a fragment is due at that very step, and
    the averages' residuals are each replica's own; with a top-k + EF
    warm-up, still in the warm-up: its residuals). The backup keeps
    every replica's own — BackupAndRestore listed before LocalSGD, against the advice —;
    the resumed run ends with every replica's weights and slots of a run never
    interrupted."""
    if policy:
        keras.mixed_precision.set_global_policy(policy)
        request.addfinalizer(lambda: keras.mixed_precision.set_global_policy("float32"))
    strategy = strategies("mirrored")
    x, y = data()
    fit = dict(batch_size=BATCH, epochs=3, verbose=0, shuffle=False)
    backup = str(tmp_path / "backup")

    def run(*callbacks):
        model = compiled(strategy, None)
        model.fit(x, y, **fit, callbacks=[*callbacks, tfdist.callbacks.LocalSGD(**averager)])
        return model

    with pytest.raises(Preempted, match="after step 3 of epoch 1"):
        run(SignalAt(epoch=1, batch=1), tfdist.callbacks.BackupAndRestore(backup))
    resumed = per_replica(strategy, run(tfdist.callbacks.BackupAndRestore(backup)))
    clean = per_replica(strategy, run())
    assert not np.allclose(*clean[-1], atol=1e-6)  # Adam's moments are each replica's own
    for mine, theirs in zip(resumed, clean):
        for replica, (a, b) in enumerate(zip(mine, theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=f"replica {replica}")


def test_your_own_loop_learns_of_a_preemption_after_the_same_step(strategies):
    strategy = strategies("mirrored")
    model = compiled(strategy, "topk")
    optimizer = model.optimizer
    with strategy.scope():
        optimizer.build(model.trainable_variables)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                keras.losses.mean_squared_error(y, model(x, training=True)),
                global_batch_size=BATCH)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    @tfdist.function(model=model, preemption=True)
    def train_step(x, y):
        strategy.run(replica_step, args=(x, y))

    x, y = data()
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))
    said = []
    try:
        for step, (bx, by) in enumerate(batches):
            train_step(bx, by)
            said.append(train_step.preempted())
            if step == 1:
                os.kill(os.getpid(), signal.SIGTERM)  # between steps 1 and 2
    finally:
        tfdist.step.preemption.preemption().reset()
    assert said == [False, False, True, True]


def test_your_own_loop_saves_at_the_agreed_step_and_resumes_exactly(strategies, tmp_path):
    """TensorFlow's custom-loop tutorial step with top-k + EF, `tfdist.function(preemption=
    True)` and `tfdist.keras.ModelBackup`: SIGTERM after step 1; `step.preempted()` says
    so after step 2 (the flag rode its all-reduce); the loop saves there and stops. A new
    process's loop restores (weights, Adam's state, every replica's residuals), skips the
    3 batches trained and ends with the weights of a run never interrupted."""
    strategy = strategies("mirrored")
    x, y = data()
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))

    def run(preempt_after=None):
        model = compiled(strategy, "topk")
        optimizer = model.optimizer
        with strategy.scope():
            optimizer.build(model.trainable_variables)
        backup = tfdist.keras.ModelBackup(str(tmp_path / "backup"), model)
        start = (backup.restore() or {}).get("step", 0)

        def replica_step(bx, by):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    keras.losses.mean_squared_error(by, model(bx, training=True)),
                    global_batch_size=BATCH)
            optimizer.apply(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables)

        @tfdist.function(model=model, preemption=True)
        def train_step(bx, by):
            strategy.run(replica_step, args=(bx, by))

        try:
            for step, (bx, by) in enumerate(batches):
                if step < start:
                    continue  # trained before the preemption
                train_step(bx, by)
                if train_step.preempted():
                    backup.save(step=step + 1)
                    return model, step + 1
                if step == preempt_after:
                    os.kill(os.getpid(), signal.SIGTERM)
        finally:
            tfdist.step.preemption.preemption().reset()
        return model, STEPS

    _, stopped = run(preempt_after=1)
    assert stopped == 3
    resumed, done = run()
    assert done == STEPS and int(resumed.optimizer.iterations.numpy()) == STEPS
    shutil.rmtree(tmp_path / "backup")  # never interrupted
    clean, _ = run()
    for mine, theirs in zip(resumed.weights, clean.weights):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("directory,model,error,fragment", [
    ("", "model", ValueError, "non-empty path"),
    ("a\0b", "model", ValueError, "without NUL"),
    (3, "model", ValueError, "Received: directory='3'"),
    ("ok", "not a model", TypeError, "must be a keras.Model. Received: str"),
])
def test_model_backup_refuses_bad_arguments_in_one_line(strategies, tmp_path, directory, model,
                                                        error, fragment):
    built = compiled(strategies("mirrored"), None) if model == "model" else model
    with pytest.raises(error) as raised:
        tfdist.keras.ModelBackup(directory, built)
    assert fragment in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("metadata,fragment", [
    ({"steps": 3}, "steps belong to tfdist's own part"),
    ({"step": float("nan")}, "must be JSON values"),
    ({"step": object()}, "must be JSON values"),
])
def test_model_backup_refuses_metadata_it_cannot_keep(strategies, tmp_path, metadata, fragment):
    model = compiled(strategies("mirrored"), "topk")
    backup = tfdist.keras.ModelBackup(str(tmp_path / "backup"), model)
    with pytest.raises(ValueError, match=fragment):
        backup.save(**metadata)
    assert not (tmp_path / "backup").exists()  # nothing written
