"""The model zoo (tests/e2e/jobs/zoo.py) through every exchange but the exact one — compression
and local SGD / DiLoCo — on 2 logical CPUs: every family trains (finite, the loss falls)
alike on every replica, and `CommStats` counts what crossed."""

import sys

import numpy as np
import pytest

import tfdist
from test_model_zoo import replica_weights, tfdist_run
from paths import JOBS

sys.path.insert(0, str(JOBS))
import zoo  # noqa: E402  (tests/e2e/jobs: the models, loops and exchanges)

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")


def config_of(exchange, write_config):
    import yaml

    return tfdist.load_config(write_config(yaml.safe_dump(
        {"cluster": {"worker": 1}, "strategy": "mirrored", **zoo.EXCHANGES[exchange]})))


#: Every exchange on the transformer (a Dense over a sequence, an embedding's rows); the
#: other families through one lossy exchange with a state (top-k + error feedback) and one
#: that trains apart (DiLoCo). benchmarks/model_zoo.py runs all 42 cells.
CELLS = ([("transformer", exchange) for exchange in zoo.EXCHANGES]
         + [(family, exchange) for family in ("rnn", "conv", "multi_io", "finetune", "shared")
            for exchange in ("topk+ef", "diloco")])


@pytest.mark.parametrize("family, exchange", CELLS)
def test_every_exchange_trains_every_family_alike_on_every_replica(strategies, write_config,
                                                                   family, exchange):
    """Finite, the loss falls, and (where replicas share one model) every replica holds the
    same weights; `CommStats` counts what the exchange sent."""
    config = config_of(exchange, write_config)
    stats = tfdist.callbacks.CommStats()
    _, losses, model = tfdist_run(
        family, "fit", strategies("mirrored"), epochs=4, callbacks=[stats],
        wrap=lambda optimizer: tfdist.keras.optimizer_from_config(optimizer, config))
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    for variable, replicas in zip(model.weights, replica_weights(model)):
        assert np.all(np.isfinite(replicas[0])), variable.path
        for value in replicas[1:]:
            np.testing.assert_array_equal(value, replicas[0], err_msg=variable.path)
    assert model.history.history["comm_payload_bytes"][-1] > 0  # counted by CommStats


