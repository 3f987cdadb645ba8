"""TensorFlow's raw errors of order and scope, reproduced, and told by tfdist in one line
with the fix (`tfdist.strategies.raw_errors`, `tfdist.strategies.parameter_server`).

The upstream texts and seams are also checked in tests/unit/seam/test_keras_seams.py.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.cluster.ports import free_ports
from tfdist.strategies.errors import StrategyUsageError
from paths import JOBS

pytestmark = pytest.mark.usefixtures("jobs_path")

#: The tutorial's order on a worker of a 2-worker job: a dataset, then the strategy; TF's
#: own class first (the raw error), then tfdist's. Nothing listens: both fail at once.
DATASET_FIRST = textwrap.dedent("""
    import json
    import tensorflow as tf
    import tfdist
    tf.data.Dataset.range(8).batch(4)  # TensorFlow's runtime starts here
    told = {}
    for name, make in (("tensorflow", tf.distribute.MultiWorkerMirroredStrategy),
                       ("tfdist", lambda: tfdist.get_strategy("multi_worker_mirrored"))):
        try:
            make()
        except Exception as e:
            told[name] = [type(e).__name__, str(e)]
    print(json.dumps(told))
""")


def one_line(error):
    message = str(error)
    assert message.isprintable() and "\n" not in message, message
    return message


def test_a_multi_worker_strategy_made_after_a_dataset_says_create_it_first():
    ports = free_ports(2)
    tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                 "task": {"type": "worker", "index": 1}}
    run = subprocess.run([sys.executable, "-c", DATASET_FIRST], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, TF_CONFIG=json.dumps(tf_config)))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    told = json.loads(run.stdout.strip().splitlines()[-1])
    assert told["tensorflow"] == ["RuntimeError",
                                  "Collective ops must be configured at program startup"]
    kind, message = told["tfdist"]
    assert kind == "StrategyUsageError" and "\n" not in message
    assert message.startswith("MultiWorkerMirroredStrategy must be created before TensorFlow "
                              "runs anything in this process"), message
    assert "Create the strategy first" in message
    assert message.endswith('Received: TensorFlow\'s "Collective ops must be configured at '
                            'program startup"'), message


def _fit(strategy, optimizer):
    """Compiles a model in `strategy`'s scope with `optimizer` and fits one epoch."""
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer, "mse")
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model.fit(x, x.sum(axis=1), batch_size=8, epochs=1, verbose=0)
    return model


def test_an_optimizer_made_outside_the_scope_says_make_it_inside(strategies):
    strategy = strategies("mirrored")
    with pytest.raises(StrategyUsageError) as raised:
        _fit(strategy, keras.optimizers.Adam(name="outside"))
    message = one_line(raised.value)
    assert message.startswith("the optimizer was made outside any `strategy.scope()` and is "
                              "used under MirroredStrategy"), message
    assert "Make the optimizer inside `with strategy.scope():`" in message
    assert message.endswith("Received: optimizer=Adam(name='outside')"), message
    assert isinstance(raised.value, RuntimeError)  # what TensorFlow raised, still caught


def test_an_optimizer_made_under_another_strategy_says_so(strategies):
    strategy, other = strategies("mirrored"), tfdist.get_strategy("one_device")
    with other.scope():
        optimizer = keras.optimizers.Adam()
    with pytest.raises(StrategyUsageError, match="made under another strategy's scope and is "
                                                 "used under MirroredStrategy"):
        _fit(strategy, optimizer)


def test_the_scope_is_tensorflows_and_other_errors_pass_unchanged(strategies):
    """The wrapped scope enters TF's (the strategy in scope is this one, a second entry
    nests), and an error that is not TensorFlow's mixed strategies is the same object."""
    strategy = strategies("mirrored")
    assert tf.distribute.get_strategy() is not strategy
    with strategy.scope() as entered:
        assert entered is strategy and tf.distribute.get_strategy() is strategy
        with strategy.scope():
            assert tf.distribute.in_cross_replica_context()
    assert tf.distribute.get_strategy() is not strategy
    error = RuntimeError("Mixing different tf.distribute.Strategy objects: <a> is not <b>")
    with pytest.raises(RuntimeError) as raised:
        with strategy.scope():
            raise error
    assert raised.value is error  # another strategy's business: <a> is not this one


def test_an_optimizer_made_inside_the_scope_trains_as_one_device(strategies):
    """The fix the line names works: the same model, optimizer made in the scope, trains
    to the weights of one device on the whole batch."""
    keras.utils.set_random_seed(0)
    strategy = strategies("mirrored")
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
    keras.utils.set_random_seed(0)
    distributed = _fit(strategy, optimizer)
    keras.utils.set_random_seed(0)
    single = _fit(tf.distribute.get_strategy(), keras.optimizers.SGD(0.1))
    for a, b in zip(distributed.get_weights(), single.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.multiprocess
def test_keras_predict_under_parameter_servers_names_the_ways_that_work(write_config,
                                                                        tmp_path):
    """fit and evaluate are pointed to tfdist.Trainer's; predict (the Trainer has none) to
    `model(x)` on the coordinator or a clone outside the scope — both give the
    predictions one device computes from the same weights."""
    from models import conv_model

    job = os.path.join(JOBS, "ps_keras_job.py")
    out = tmp_path / "out"
    out.mkdir()
    config = write_config("cluster: {chief: 1, worker: 1, ps: 1}\nstrategy: parameter_server\n")
    run = subprocess.run([sys.executable, "-m", "tfdist", "launch", config, "--grace-seconds",
                          "5", "--", sys.executable, job, "--out", str(out)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    refused = json.loads((out / "chief-0.json").read_text())["refused"]
    assert "tfdist.Trainer(model, optimizer, loss, strategy=strategy).fit(" in refused["fit"]
    assert "tfdist.Trainer(model, optimizer, loss, strategy=strategy).evaluate(" in \
        refused["evaluate"]
    predict = refused["predict"]
    assert predict.startswith("Keras 3 `model.predict` does not support "
                              "ParameterServerStrategy (keras #18624), and tfdist.Trainer has "
                              "no predict: call the model on the coordinator"), predict
    assert predict.endswith("Received: strategy=ParameterServerStrategy")
    assert all(m.isprintable() for m in refused.values())
    with np.load(out / "chief-0.npz") as saved:
        single = conv_model(batchnorm=False, dropout=0)
        single.set_weights([saved[f"arr_{i}"] for i in range(len(single.get_weights()))])
        expected = single.predict(saved["x"], verbose=0)
        np.testing.assert_allclose(saved["called"], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(saved["predicted"], expected, rtol=1e-5, atol=1e-6)
