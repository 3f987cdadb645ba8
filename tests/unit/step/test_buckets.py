"""Gradient buckets (tfdist.step.buckets) that overlap the backward pass, proven in the
traced graph of a real training step, and exchanging exactly what one buffer does.

Two logical CPUs with TF's collective all-reduce (the ops MultiWorkerMirroredStrategy
runs, ordering tokens included), so the graph is the one a worker traces.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops, cross_device_utils

import tfdist
from tfdist.step.buckets import buckets
from tfdist.strategies.collective_keys import next_key_base

pytestmark = pytest.mark.usefixtures("two_cpus")
LAYERS = 4


def collective_strategy(devices):
    """MirroredStrategy whose all-reduces are TF's collectives (fresh keys)."""
    keys = cross_device_utils.CollectiveKeys(group_key_start=1 + next_key_base("mirrored"))
    ops = cross_device_ops.CollectiveAllReduce(
        devices=devices, group_size=len(devices), collective_keys=keys,
        options=tf.distribute.experimental.CommunicationOptions())
    return tfdist.strategies.MirroredStrategy(devices, cross_device_ops=ops)


def make(strategy, compression="none", bucket_bytes=5000, nan_on_replica=None):
    """A 5-layer model and a tfdist.function step of its own loop (SGD)."""
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)),
                                  *[keras.layers.Dense(32, name=f"d{i}") for i in range(LAYERS)],
                                  keras.layers.Dense(1, name="out")])
        optimizer = tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), compression,
                                                      bucket_bytes=bucket_bytes, min_size=1)
        optimizer.build(model.trainable_variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
            if nan_on_replica is not None:
                replica = tf.distribute.get_replica_context().replica_id_in_sync_group
                loss *= tf.where(replica == nan_on_replica, np.nan, 1.0)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    train = tfdist.function(lambda x, y: strategy.run(step, args=(x, y)), model=model,
                            optimizer=optimizer)
    return model, optimizer, train


def data(strategy):
    x = np.random.default_rng(0).normal(size=(16, 16)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 1)).astype("float32")
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
    return next(iter(dataset))


def closure(op):
    """Every op `op` depends on, through data and control edges."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def layer_gradient_ops(graph, layer):
    """The backward-pass ops that compute `layer`'s gradients (the tape's MatMuls)."""
    pattern = re.compile(rf"/{layer}(_\d+)?/")
    return {op for op in graph.get_operations()
            if op.name.startswith("gradient_tape/") and pattern.search(op.name)
            and op.type == "MatMul"}


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_the_first_bucket_does_not_wait_for_the_first_layers_gradient(two_cpus, compression):
    strategy = collective_strategy(two_cpus)
    _, _, train = make(strategy, compression)
    x, y = data(strategy)
    train(x, y)
    (function,) = train.driver._functions.values()
    graph = function.get_concrete_function(x, y).graph
    collectives = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    assert len(collectives) >= 2 * 3  # several buckets on each of the 2 replicas
    first, last = collectives[0], collectives[-1]
    first_layer, last_layer = layer_gradient_ops(graph, "d0"), layer_gradient_ops(graph, "out")
    assert first_layer and last_layer
    assert not first_layer & closure(first)  # the overlap: bucket 1 starts before d0's grads
    assert last_layer & closure(first)       # bucket 1 holds the last layer's gradients
    assert first_layer & closure(last)       # and the last bucket the first layer's


def test_one_fused_buffer_waits_for_every_gradient(two_cpus):
    """The control: without buckets the single collective depends on the first layer."""
    strategy = collective_strategy(two_cpus)
    _, _, train = make(strategy, bucket_bytes=0)
    x, y = data(strategy)
    train(x, y)
    (function,) = train.driver._functions.values()
    graph = function.get_concrete_function(x, y).graph
    collectives = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    assert len(collectives) == 2
    assert layer_gradient_ops(graph, "d0") & closure(collectives[0])


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_buckets_exchange_exactly_what_one_buffer_does(strategies, compression):
    strategy = strategies("mirrored")
    results = []
    for bucket_bytes in (0, 5000, 1):
        model, optimizer, train = make(strategy, compression, bucket_bytes)
        x, y = data(strategy)
        for _ in range(3):
            train(x, y)
        hook = optimizer._tfdist_pipeline.exchange_owner
        results.append(([v.numpy() for v in model.trainable_variables], hook.bytes_per_step()))
    (one, one_bytes), *bucketed = results
    for weights, nbytes in bucketed:
        assert nbytes == one_bytes
        for a, b in zip(weights, one):
            np.testing.assert_array_equal(a, b)


def test_a_nan_on_one_replica_is_refused_on_both_with_buckets(strategies):
    strategy = strategies("mirrored")
    model, optimizer, train = make(strategy, bucket_bytes=5000, nan_on_replica=1)
    before = [v.numpy() for v in model.trainable_variables]
    x, y = data(strategy)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        train(x, y)
    for a, b in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(a.numpy(), b)
    assert int(optimizer.iterations.numpy()) == 0


def test_buckets_group_the_last_tensors_first():
    assert buckets([4, 4, 100, 4, 4, 4], 8) == [[5, 4], [3], [2], [1, 0]]
    assert buckets([4, 4], 0) == [[1, 0]] and buckets([], 8) == []


@pytest.mark.parametrize("compression", ["none", "fp16", "powersgd", "int8", "topk", "sign"])
def test_the_wire_meter_counts_what_the_step_sends(two_cpus, compression):
    """CommStats' source (tfdist.step.wire) against independent counts, times the steps
    run: for all-reduces, the bytes of every CollectiveReduceV2 input in the traced step,
    per replica; for all-gathers (whose traced inputs TF pads to a shape known only when
    it runs, after gathering the shapes), the compressor's payload from its layout."""
    strategy = collective_strategy(two_cpus)
    _, optimizer, train = make(strategy, compression)
    x, y = data(strategy)
    for _ in range(3):
        train(x, y)
    (function,) = train.driver._functions.values()
    graph = function.get_concrete_function(x, y).graph
    reduced = sum(op.inputs[0].shape.num_elements() * op.inputs[0].dtype.size
                  for op in graph.get_operations() if op.type == "CollectiveReduceV2")
    totals = tfdist.core.pipeline_of(optimizer).meter.totals()
    assert totals["reduced"] == 3 * reduced / 2
    hooks = tfdist.core.pipeline_of(optimizer).hooks
    gathered = hooks[0].bytes_per_step()["gathered"] if compression != "none" else 0
    assert totals["gathered"] == 3 * gathered and (gathered > 0) == (
        compression in ("int8", "topk", "sign"))
    dense = 4 * sum(int(np.prod(v.shape)) for v in optimizer._trainable_variables)
    assert totals["dense"] == 3 * dense and totals["pushed"] == 0
