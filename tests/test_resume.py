"""State that is not in a checkpoint, and a resumed run that must not diverge.

Error-feedback residuals, PowerSGD's Q and local SGD's anchors live in the gradient
exchange, not in the model: a backup does not hold them, and a resumed run starts them
afresh (residuals zero, Q from its seed, anchors = the restored, averaged weights) — a
deliberate reset (docs/reliability.md). What the reset costs is one step's compression
error; these tests show the resumed run ends where the uninterrupted one does.
"""

import keras
import numpy as np
import pytest

import tfdist

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")


def train(strategy, setup, callbacks, epochs=6):
    from models import conv_model, dataset, loss

    with strategy.scope():
        model = conv_model(seed=3, batchnorm=False, dropout=0)
        optimizer, extra = setup()
        model.compile(optimizer, loss())
    history = model.fit(dataset(128, 32), epochs=epochs, verbose=0,
                        callbacks=[*extra, *callbacks])
    return model, history.history


SETUPS = {
    "sign": lambda: (tfdist.keras.DistributedOptimizer(
        keras.optimizers.SGD(0.05), "sign", error_feedback=True, min_size=64), []),
    "powersgd": lambda: (tfdist.keras.DistributedOptimizer(
        keras.optimizers.SGD(0.05), "powersgd", rank=1, error_feedback=True, min_size=64), []),
    "local_sgd": lambda: (keras.optimizers.SGD(0.05),
                          [tfdist.callbacks.LocalSGD(period=3, compression="int8")]),
}


@pytest.mark.parametrize("name", list(SETUPS))
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(strategies, tmp_path, name):
    from faults import Interrupt

    strategy = strategies("mirrored")
    _, clean = train(strategy, SETUPS[name], [])
    backup = tfdist.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    with pytest.raises(KeyboardInterrupt):
        train(strategy, SETUPS[name], [backup, Interrupt(epoch=3)])
    resumed_model, resumed = train(strategy, SETUPS[name],
                                   [tfdist.callbacks.BackupAndRestore(str(tmp_path / "backup"))])
    assert len(resumed["loss"]) == 3  # epochs 3, 4, 5: resumed after the backup of epoch 2
    assert all(np.all(np.isfinite(w.numpy())) for w in resumed_model.weights)
    assert resumed["loss"][-1] < clean["loss"][0] / 2
    assert resumed["loss"][-1] == pytest.approx(clean["loss"][-1], rel=0.25, abs=0.02)
