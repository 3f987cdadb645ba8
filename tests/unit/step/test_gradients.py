"""Gradients as models produce them (`tfdist.step.gradients`): static shapes from the
variable, an embedding's `IndexedSlices` exchanged as its rows, and Adam on duplicated rows
checked against NumPy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.step import gradients, wire

pytestmark = pytest.mark.usefixtures("two_cpus")


def test_a_gradient_gets_its_variables_static_shape():
    variable = tf.Variable(tf.zeros([3, 4]))

    @tf.function(input_signature=[tf.TensorSpec([None, 4])])
    def shapes(grad):
        dense = gradients.with_variable_shapes([(grad, variable)])[0][0]
        assert dense.shape == (3, 4)  # at trace time: no None left
        assert wire.nbytes(dense) == 48
        with pytest.raises(ValueError, match="comes from its variable"):
            wire.nbytes(grad)
        assert wire.nbytes(grad, variable) == 48
        slices = tf.IndexedSlices(tf.reshape(grad, [-1, 4]), tf.constant([0, 2, 2]))
        sparse = gradients.with_variable_shapes([(slices, variable)])[0][0]
        assert sparse.values.shape.as_list() == [None, 4]
        assert tf.get_static_value(sparse.dense_shape).tolist() == [3, 4]
        return dense

    np.testing.assert_array_equal(shapes(tf.ones([3, 4])), np.ones([3, 4]))
    assert gradients.with_variable_shapes([(None, variable)]) == [(None, variable)]


@pytest.mark.parametrize("dtype", [None, tf.float16])
def test_rows_are_gathered_from_every_replica_with_their_duplicates(strategies, dtype):
    """Replica r sends r + 1 rows (index 1 repeated): the sum is every replica's rows in
    replica order, on every replica, in the gradient's dtype; the meter notes the rows one
    replica sent on average."""
    strategy = strategies("mirrored")

    @tf.function
    def run():
        def replica():
            context = tf.distribute.get_replica_context()
            r = context.replica_id_in_sync_group
            rows = r + 1
            slices = tf.IndexedSlices(tf.fill([rows, 2], tf.cast(r, tf.float32) + 0.5),
                                      tf.ones([rows], tf.int32), tf.constant([5, 2]))
            with wire.recording() as record:
                gathered = wire.all_gather_rows(context, [slices], dtype and [dtype])[0]
            assert gathered.values.dtype == tf.float32
            return gathered.values, gathered.indices, record["gathered"]

        return strategy.run(replica)

    values, indices, sent = run()
    for v, i, n in zip(*(strategy.experimental_local_results(t) for t in (values, indices,
                                                                         sent))):
        np.testing.assert_array_equal(v.numpy(), [[0.5, 0.5], [1.5, 1.5], [1.5, 1.5]])
        np.testing.assert_array_equal(i.numpy(), [1, 1, 1])
        assert int(n) == 3 * (2 * (2 if dtype else 4) + 4) // 2


def _embedding_model():
    keras.utils.set_random_seed(4)
    return keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(6, 3),
                             keras.layers.Flatten(), keras.layers.Dense(1, use_bias=False)])


def test_adam_on_duplicated_rows_is_keras_one_device_step_checked_in_numpy(strategies):
    """One Adam step on an embedding whose batch repeats rows, on 2 replicas through
    tfdist's exact exchange: each duplicated row's gradient is squared before the sum (Keras'
    sparse Adam, which one device and TensorFlow's own strategy compute), as NumPy computes it
    here from the per-token gradients — not the textbook step on the summed gradient."""
    x = np.array([[1, 1, 2, 3], [1, 4, 4, 1], [0, 1, 1, 5], [2, 2, 2, 2]], np.int32)
    y = np.array([[1.0], [-1.0], [0.5], [2.0]], np.float32)
    with strategies("mirrored").scope():
        model = _embedding_model()
        model.compile(tfdist.keras.DistributedOptimizer(
            keras.optimizers.Adam(0.1), "none"), "mse")
    table, kernel = (w.numpy() for w in model.weights)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[tfdist.callbacks.TrainingHooks()])

    rows = kernel.reshape(4, 3)  # Dense's kernel, one slice per position
    residual = 2 / len(x) * (table[x] * rows).sum(axis=(1, 2)) - 2 / len(x) * y[:, 0]
    per_token = residual[:, None, None] * rows[None]  # d loss / d table[x[b, t]]
    summed = np.zeros_like(table)
    squares = np.zeros_like(table)
    np.add.at(summed, x, per_token)
    np.add.at(squares, x, per_token ** 2)

    def adam(m, v):  # Keras' first step: alpha = lr sqrt(1 - b2) / (1 - b1)
        alpha = 0.1 * np.sqrt(1 - 0.999) / (1 - 0.9)
        return -alpha * m / (np.sqrt(v) + 1e-7)

    keras_step = adam(0.1 * summed, 0.001 * squares)
    np.testing.assert_allclose(model.weights[0].numpy() - table, keras_step, atol=2e-6)
    textbook = adam(0.1 * summed, 0.001 * summed ** 2)
    assert np.abs(textbook - keras_step).max() > 1e-2  # the two semantics differ here


def test_sgd_on_duplicated_rows_equals_the_dense_gradients_step(strategies):
    """With SGD the rows' step is the summed gradient's (the table densified): the semantics
    differ only for optimizers not linear in the gradient."""
    x = np.array([[1, 1, 2, 3], [1, 4, 4, 1], [0, 1, 1, 5], [2, 2, 2, 2]], np.int32)
    y = np.array([[1.0], [-1.0], [0.5], [2.0]], np.float32)
    with strategies("mirrored").scope():
        model = _embedding_model()
        model.compile(tfdist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1), "none"),
                      "mse")
    table, kernel = (w.numpy() for w in model.weights)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[tfdist.callbacks.TrainingHooks()])
    rows = kernel.reshape(4, 3)
    residual = 2 / len(x) * ((table[x] * rows).sum(axis=(1, 2)) - y[:, 0])
    summed = np.zeros_like(table)
    np.add.at(summed, x, residual[:, None, None] * rows[None])
    np.testing.assert_allclose(model.weights[0].numpy(), table - 0.1 * summed, atol=1e-6)


@pytest.mark.parametrize("name, options", [
    ("topk", {"ratio": 0.3, "error_feedback": True}),
    ("powersgd", {"rank": 1, "error_feedback": True}),
    ("sign", {"error_feedback": "ef21"}),
    ("topk", {"ratio": 0.3, "error_feedback": True, "momentum_correction": 0.9}),
])
def test_beside_an_embeddings_rows_the_dense_gradients_exchange_as_without_the_table(
        strategies, name, options):
    """A stateful exchange (error feedback, EF21, DGC, PowerSGD) built over a kernel, a
    table and a bias, given the table's gradient as rows: the kernel and bias go exactly as
    in the same exchange built over them alone — sums, residuals, Qs, over 3 steps — while the
    table's rows cross exact and its state stays as built (nothing of it was sent)."""
    strategy = strategies("mirrored")
    shapes = {"kernel": (6, 5), "table": (40, 3), "bias": (7,)}
    rng = np.random.default_rng(0)
    grads = {k: [rng.normal(size=s).astype("float32") for _ in range(2)]
             for k, s in shapes.items()}
    rows = [np.array([1, 1, 5]), np.array([5, 9])]

    def run(names):
        hook = tfdist.compression.build({"name": name, "min_size": 0, **options})
        with strategy.scope():
            variables = [tf.Variable(tf.zeros(shapes[k])) for k in names]
            hook.build(strategy, variables)

        @tf.function
        def step(number):
            def replica():
                r = tf.distribute.get_replica_context().replica_id_in_sync_group
                given = []
                for k in names:
                    pick = lambda i, k=k: tf.constant(grads[k][i])  # noqa: E731
                    if k == "table":
                        values = [tf.constant(grads[k][i][rows[i]]) for i in range(2)]
                        given.append(tf.IndexedSlices(
                            tf.cond(tf.equal(r, 0), lambda: values[0], lambda: values[1]),
                            tf.cond(tf.equal(r, 0), lambda: tf.constant(rows[0]),
                                    lambda: tf.constant(rows[1])), tf.constant([40, 3])))
                    else:
                        given.append(tf.cond(tf.equal(r, 0), lambda: pick(0),
                                             lambda: pick(1)))
                summed = hook.exchange(given, variables, number)
                return [tf.convert_to_tensor(s) for s in summed]

            return strategy.run(replica)

        for number in range(3):
            result = step(tf.constant(number, tf.int64))
        sums = {k: strategy.experimental_local_results(t)[0].numpy()
                for k, t in zip(names, result)}
        state = {k: strategy.experimental_local_results(v)[0].numpy()
                 for k, v in hook.state.items()}
        layout = hook.large_layout
        return sums, state, [({v: k for k, v in shapes.items()}[shape], size)
                             for shape, size in zip(layout.shapes, layout.padded_sizes)]

    with_table, state, segments = run(["kernel", "table", "bias"])
    alone, state_alone, _ = run(["kernel", "bias"])
    for k in ("kernel", "bias"):
        np.testing.assert_allclose(with_table[k], alone[k], rtol=1e-6, atol=1e-7)
    expected = np.zeros((40, 3), np.float32)
    for i in range(2):
        np.add.at(expected, rows[i], grads["table"][i][rows[i]])
    np.testing.assert_allclose(with_table["table"], expected, rtol=1e-6)
    flat = {k: v for k, v in state.items() if v.ndim == 1}
    for key, value in flat.items():  # [kernel | table | bias] against [kernel | bias]
        parts = dict(zip([n for n, _ in segments],
                         np.split(value, np.cumsum([size for _, size in segments])[:-1])))
        np.testing.assert_allclose(np.concatenate([p for n, p in parts.items() if n != "table"]),
                                   state_alone[key], atol=1e-6)
        assert not np.any(parts["table"]), key
    for key in (k for k in state if k.startswith("powersgd_q")):  # Qs renumbered
        renamed = {"powersgd_q0": "powersgd_q0", "powersgd_q1": None,
                   "powersgd_q2": "powersgd_q1"}[key]
        if renamed:
            np.testing.assert_allclose(state[key], state_alone[renamed], atol=1e-6)
