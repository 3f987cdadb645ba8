"""Mixed precision's figures in every History: ``loss_scale`` and ``skipped_steps`` after
each epoch, under `fit` with `TrainingHooks` or `CommStats` (tfdist optimizer or Keras'
own), and in `tfdist.Trainer`'s History.

Two replicas; one replica's batch overflows at steps 2 and 5 of 8
(tests/unit/keras/test_mixed_precision.py's data), 4 steps an epoch: each epoch skips one step, and the scale follows Keras' schedule
(halve on an overflow, double after GROWTH committed steps) computed here by hand.
"""

import keras
import pytest

import tfdist
from test_mixed_precision import (BAD_STEPS, BATCH, GROWTH, batches, dataset,  # noqa: F401
                                  expected_scales, mixed_float16, model_for, optimizer_for)

pytestmark = [pytest.mark.usefixtures("two_cpus"),
              pytest.mark.filterwarnings("ignore:`shuffle=True` was passed")]

STEPS_PER_EPOCH = 4


def expected_history():
    """(loss_scale, skipped_steps) per epoch, from Keras' schedule and the bad steps."""
    scales = expected_scales()
    ends = [STEPS_PER_EPOCH * (e + 1) - 1 for e in range(2)]
    skipped = [float(sum(1 for s in BAD_STEPS if end + 1 - STEPS_PER_EPOCH <= s <= end))
               for end in ends]
    return [scales[end] for end in ends], skipped


def fit(strategy, optimizer, callbacks, bad_replica=1):
    with strategy.scope():
        model = model_for()
        model.compile(optimizer() if callable(optimizer) else optimizer, "mse")
        model.optimizer.dynamic_growth_steps = GROWTH
    history = model.fit(dataset(batches(bad_replica=bad_replica)), epochs=2, steps_per_epoch=STEPS_PER_EPOCH,
                        verbose=0, callbacks=callbacks)
    return history.history


@pytest.mark.parametrize("callback", ["TrainingHooks", "CommStats"])
@pytest.mark.parametrize("optimizer", ["tfdist", "keras"])
def test_fit_history_has_the_loss_scale_and_the_skipped_steps(strategies, mixed_float16,
                                                              callback, optimizer):
    strategy = strategies("mirrored")
    make = (lambda: optimizer_for("none", strategy)) if optimizer == "tfdist" \
        else (lambda: keras.optimizers.SGD(0.01))
    # Keras' own LossScaleOptimizer takes "finite or not" from replica 0 alone (DESIGN.md)
    history = fit(strategy, make, [getattr(tfdist.callbacks, callback)()],
                  bad_replica=1 if optimizer == "tfdist" else 0)
    scales, skipped = expected_history()
    assert skipped == [1.0, 1.0]
    assert history["loss_scale"] == scales
    assert history["skipped_steps"] == skipped


def test_float32_history_has_no_loss_scale(strategies):
    strategy = strategies("mirrored")
    history = fit(strategy, lambda: keras.optimizers.SGD(0.01),
                  [tfdist.callbacks.TrainingHooks(), tfdist.callbacks.CommStats()])
    assert "loss_scale" not in history and "skipped_steps" not in history
    assert len(history["loss"]) == 2


def test_trainer_history_has_the_loss_scale_and_the_skipped_steps(strategies, mixed_float16):
    strategy = strategies("mirrored")
    with strategy.scope():
        model = model_for()
    trainer = tfdist.Trainer(model, keras.optimizers.SGD(0.01), "mse", strategy=strategy)
    trainer.optimizer.dynamic_growth_steps = GROWTH
    history = trainer.fit(dataset(batches()), epochs=2, steps_per_epoch=STEPS_PER_EPOCH,
                          verbose=0).history
    scales, skipped = expected_history()
    assert history["loss_scale"] == scales
    assert history["skipped_steps"] == skipped
    assert int(trainer.optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH - len(BAD_STEPS)
