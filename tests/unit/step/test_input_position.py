"""A resumed run trains the batches the uninterrupted run would have (issue 55, item 4):
`fit` and the Trainer read on through one iterator across epochs when `steps_per_epoch`
is given over `dataset.repeat()`; the backup keeps how many batches that iterator had
yielded, and the resumed run reads that many before it trains on. A record of every
element each replica trained, against an uninterrupted run, and equal final weights. (On 4
workers, the UNet example's own input: test_unet_training.py's preempted 4-worker run.)"""

import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.step.preemption import Preempted, skipping

pytestmark = pytest.mark.usefixtures("two_cpus")
ROWS, BATCH, EPOCHS = 40, 8, 3  # 5 batches a pass


class Record(keras.layers.Layer):
    """Passes its input on; in training, appends the ids of its rows to `seen`."""

    def __init__(self, seen, **kwargs):
        super().__init__(**kwargs)
        self.note = seen.append  # not the list itself: Keras would track a copy

    def call(self, inputs, training=None):
        features, ids = inputs
        if training:
            def note(values):
                self.note(tuple(sorted(values.numpy().tolist())))
                return np.int64(0)
            done = tf.py_function(note, [ids], tf.int64)
            with tf.control_dependencies([done]):
                features = tf.identity(features)
        return features


def make_model(strategy, seen):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        features = keras.Input((4,), name="x")
        ids = keras.Input((), dtype="int64", name="id")
        hidden = Record(seen)([features, ids])
        model = keras.Model([features, ids], keras.layers.Dense(1)(hidden))
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), "none"),
                      "mse")
    return model


def dataset(repeat):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype("float32")
    y = (x @ np.arange(1, 5, dtype="float32"))[:, None]
    data = tf.data.Dataset.from_tensor_slices(({"x": x, "id": np.arange(ROWS)}, y))
    data = data.batch(BATCH, drop_remainder=True)
    return data.repeat() if repeat else data


class SignalAt(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if not skipping(self.model, self.epoch, batch) and (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def train(loop, strategy, seen, repeat, callbacks=()):
    model = make_model(strategy, seen)
    steps = 3 if repeat else None
    if loop == "fit":
        model.fit(dataset(repeat), epochs=EPOCHS, steps_per_epoch=steps, verbose=0,
                  callbacks=list(callbacks))
    else:
        trainer = tfdist.Trainer(model, model.optimizer, "mse", strategy=strategy)
        trainer.fit(dataset(repeat), epochs=EPOCHS, steps_per_epoch=steps, verbose=0,
                    callbacks=list(callbacks))
    return model


CASES = ([("fit", at, True) for at in ((1, 1), (0, 2), (1, 2))]  # mid-epoch, epoch end, 2nd pass
         + [("fit", (1, 1), False), ("trainer", (1, 1), True), ("trainer", (0, 2), True)])


@pytest.mark.parametrize("loop, at, repeat", CASES)
def test_a_resumed_run_trains_every_element_the_uninterrupted_run_does(strategies, tmp_path,
                                                                       loop, at, repeat):
    strategy = strategies("mirrored")
    if not repeat and at[1] >= 2:
        at = (at[0], at[1] + 2)  # one pass is 5 steps: the same moments of it
    clean_seen = []
    clean = train(loop, strategy, clean_seen, repeat)
    seen, backup = [], str(tmp_path / "backup")
    with pytest.raises(Preempted):
        train(loop, strategy, seen, repeat,
              [SignalAt(*at), tfdist.callbacks.BackupAndRestore(backup)])
    resumed = train(loop, strategy, seen, repeat, [tfdist.callbacks.BackupAndRestore(backup)])
    assert seen == clean_seen  # each replica's rows of every step, in order: the same data
    ids = sorted(i for rows in clean_seen for i in rows)
    expected = sorted([i % ROWS for i in range(BATCH * 3 * EPOCHS)] if repeat
                      else list(range(ROWS)) * EPOCHS)
    assert ids == expected  # independent of either run: what 9 steps (3 passes) read
    for mine, theirs in zip(resumed.weights, clean.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_the_keras_seam_the_input_position_reads_is_where_fit_keeps_it(strategies):
    """Keras' fit keeps its EpochIterator as the local `epoch_iterator`, counting the
    batches its iterator yielded in `_steps_seen`: if this moves, the callback can no
    longer say where the input stands, and this fails first."""
    from tfdist.keras.callbacks.backup_and_restore import keras_epoch_iterator

    found = []

    class Look(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            found.append(keras_epoch_iterator())

        def on_train_batch_end(self, batch, logs=None):
            found.append(found[0]._steps_seen)

    make_model(strategies("mirrored"), []).fit(dataset(True), epochs=2, steps_per_epoch=3,
                                               verbose=0, callbacks=[Look()])
    assert found[0] is not None and found[0].steps_per_epoch == 3
    assert found[1:] == [1, 2, 3, 4, 5, 6]  # one iterator read on across the two epochs


@pytest.mark.parametrize("loop", ["fit", "trainer"])
def test_an_input_that_cannot_be_positioned_is_warned_about_at_start(strategies, tmp_path,
                                                                     loop, recwarn):
    """A shuffle with no seed at all draws a new order each run: a resumed run would read
    as many batches, not the same ones. fit and the Trainer with a backup say so once at
    start (the dataset found through fit's data adapter: if that Keras seam moves, the fit
    case fails); a seeded shuffle, or the global seed set first, says nothing."""
    from tfdist.step.preemption import UNSEEDED_SHUFFLE, unseeded_shuffles

    strategy = strategies("mirrored")
    tf.random.set_seed(None)  # no global seed (make_model set one): shuffle() unseeded
    unseeded = dataset(False).unbatch().shuffle(ROWS).batch(BATCH).repeat()
    seeded = dataset(False).unbatch().shuffle(ROWS, seed=3).batch(BATCH).repeat()
    keras.utils.set_random_seed(1)
    global_seed = dataset(False).unbatch().shuffle(ROWS).batch(BATCH).repeat()
    assert len(unseeded_shuffles(unseeded)) == 1
    assert len(unseeded_shuffles(tf.data.Dataset.zip((unseeded, seeded)))) == 1  # any branch
    assert not unseeded_shuffles(seeded) and not unseeded_shuffles(global_seed)
    said = []
    for name, data in [("unseeded", unseeded), ("seeded", seeded), ("global", global_seed)]:
        recwarn.clear()
        backup = tfdist.callbacks.BackupAndRestore(str(tmp_path / name))
        model = make_model(strategy, [])
        if loop == "fit":
            model.fit(data, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[backup])
        else:
            tfdist.Trainer(model, model.optimizer, "mse", strategy=strategy).fit(
                data, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[backup])
        said.append([str(w.message) for w in recwarn if str(w.message) == UNSEEDED_SHUFFLE])
    assert said == [[UNSEEDED_SHUFFLE], [], []]
