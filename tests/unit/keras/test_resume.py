"""The exchange's own state in a backup, and a resumed run that ends where an
uninterrupted one does.

Error-feedback residuals, PowerSGD's P and Q and a compressed average's residuals live in
the gradient exchange, each replica its own: `BackupAndRestore` gathers them from every
replica into the backup (`replica_state.npz`) and gives each replica its own back, so a
resumed run continues exactly. Local SGD's and DiLoCo's replicas, anchors and compressed
averages across a preemption: tests/unit/step/test_preemption.py.
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
}


@pytest.mark.parametrize("name", list(SETUPS))
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(strategies, tmp_path, name):
    from faults import Interrupt

    strategy = strategies("mirrored")
    clean_model, clean = train(strategy, SETUPS[name], [])
    backup = tfdist.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    with pytest.raises(KeyboardInterrupt):
        train(strategy, SETUPS[name], [backup, Interrupt(epoch=3)])
    resumed_model, resumed = train(strategy, SETUPS[name],
                                   [tfdist.callbacks.BackupAndRestore(str(tmp_path / "backup"))])
    assert len(resumed["loss"]) == 3  # epochs 3, 4, 5: resumed after the backup of epoch 2
    assert all(np.all(np.isfinite(w.numpy())) for w in resumed_model.weights)
    assert resumed["loss"][-1] < clean["loss"][0] / 2
    assert resumed["loss"][-1] == pytest.approx(clean["loss"][-1], rel=0.25, abs=0.02)
    for mine, theirs in zip(resumed_model.weights, clean_model.weights):  # the same run
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_exchange_state_of_another_layout_or_damaged_is_named_in_one_line(strategies,
                                                                          tmp_path, capfd):
    """A backup whose exchange state does not fit (here: sign's residuals resumed under
    PowerSGD) trains on with that state afresh and says so; a damaged replica_state.npz
    makes the backup unreadable: it is named and the previous one used."""
    from faults import Interrupt

    strategy = strategies("mirrored")
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        train(strategy, SETUPS["sign"], [tfdist.callbacks.BackupAndRestore(backup),
                                         Interrupt(epoch=3)])
    _, resumed = train(strategy, SETUPS["powersgd"], [tfdist.callbacks.BackupAndRestore(
        backup, delete_checkpoint=False)], epochs=4)
    out = capfd.readouterr().out
    assert len(resumed["loss"]) == 1 and "holds the exchange state of another layout" in out
    newest = tmp_path / "backup" / (tmp_path / "backup" / "latest").read_text().strip()
    (newest / "replica_state.npz").write_bytes(b"\x00" * 64)
    _, again = train(strategy, SETUPS["powersgd"], [tfdist.callbacks.BackupAndRestore(backup)],
                     epochs=4)
    out = capfd.readouterr().out
    assert f"skipping checkpoint {newest}: it cannot be read" in out, out
    assert len(again["loss"]) == 1  # the previous backup (epoch 3 of 4 done) resumed
